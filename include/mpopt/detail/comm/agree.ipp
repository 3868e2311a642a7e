// mpopt — agree's definitions (agree.hpp): inline header-only, else compiled once by
// <mpopt/src.hpp>.
#pragma once

#include "agree.hpp"

#include <algorithm>
#include <optional>
#include <vector>

#include "../options/validate.hpp"

namespace mpopt::detail {

MPOPT_DECL void put_failure(std::span<std::uint8_t> record, const error* mine) {
  std::fill(record.begin(), record.end(), std::uint8_t{0});
  if (!mine) return;
  record[0] = 1;
  const std::string_view m = mine->message();
  std::copy_n(m.begin(), std::min(m.size(), record.size() - 1), record.begin() + 1);
}

MPOPT_DECL std::string first_failure(std::span<const std::uint8_t> records) {
  for (std::size_t r = 0; r * failure_record < records.size(); ++r) {
    const auto record = records.subspan(r * failure_record, failure_record);
    if (!record[0]) continue;
    const auto* text = reinterpret_cast<const char*>(record.data() + 1);
    const std::string message(text, std::find(text, text + failure_record - 1, '\0'));
    return "rank " + std::to_string(r) + ": " + message + (message.size() == failure_record - 1 ? "..." : "");
  }
  return "another rank";
}

MPOPT_DECL void agree(cold_collectives& comm, std::string_view what, const std::function<void()>& f) {
  std::optional<error> mine;
  try {
    f();
  } catch (const error& e) {
    mine = e;
  }
  std::uint8_t failed = mine.has_value();
  comm.all_reduce_max(std::span<std::uint8_t>(&failed, 1));
  if (!failed) return;
  const std::size_t world = std::size_t(comm.size());
  std::vector<std::uint8_t> records(world * failure_record);
  put_failure(std::span(records).subspan(std::size_t(comm.rank()) * failure_record, failure_record),
              mine ? &*mine : nullptr);
  const std::vector<std::size_t> counts(world, failure_record);
  comm.all_gather(std::span<std::uint8_t>(records), std::span<const std::size_t>(counts));
  if (mine) throw *mine;
  fail(what, "() failed on ", first_failure(records));
}

}  // namespace mpopt::detail
