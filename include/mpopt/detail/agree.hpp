// mpopt — one outcome on every rank: a check that throws on some ranks throws on all, with the
// reason, so that no rank goes on into a collective alone and every rank can say what went wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../communicator.hpp"
#include "../error.hpp"
#include "config.hpp"

namespace mpopt::detail {

/// What each rank sends of its failure, in a record of this many bytes: a flag, then the message.
inline constexpr std::size_t failure_record = 512;

/// This rank's record: its message (cut to fit), or none.
MPOPT_DECL void put_failure(std::span<std::uint8_t> record, const error* mine);

/// "rank R: its message" of the lowest rank whose record holds a failure.
MPOPT_DECL std::string first_failure(std::span<const std::uint8_t> records);

/// Runs f on every rank of `comm` and agrees on the outcome: if it threw mpopt::error anywhere, it
/// throws on every rank: its own message where it failed, elsewhere "what() failed on rank R:" and
/// that rank's message (the lowest failing rank's). Collective.
template <class C, class F>
void agree(C& comm, std::string_view what, F&& f) {
  std::optional<error> mine;
  try {
    f();
  } catch (const error& e) {
    mine = e;
  }
  std::uint8_t failed = mine.has_value();
  comm.all_reduce(std::span<std::uint8_t>(&failed, 1), reduce_op::max);
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

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "agree.ipp"
#endif
