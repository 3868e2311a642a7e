// mpopt — one outcome on every rank: a check that throws on some ranks throws on all, so that no
// rank goes on into a collective alone.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "../communicator.hpp"
#include "../error.hpp"

namespace mpopt::detail {

/// Runs f on every rank of `comm` and agrees on the outcome: if it threw mpopt::error anywhere, it
/// throws on every rank (its own message where it failed, "what() failed on another rank" elsewhere).
/// Collective.
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
  if (mine) throw *mine;
  if (failed) fail(what, "() failed on another rank");
}

}  // namespace mpopt::detail
