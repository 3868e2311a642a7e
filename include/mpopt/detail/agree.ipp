// mpopt — agree's definitions (agree.hpp): inline header-only, else compiled once by
// <mpopt/src.hpp>.
#pragma once

#include "agree.hpp"

#include <algorithm>

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

}  // namespace mpopt::detail
