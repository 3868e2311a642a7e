// mpopt — one outcome on every rank: a check that throws on some ranks throws on all, with the
// reason, so that no rank goes on into a collective alone and every rank can say what went wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "../../communicator.hpp"
#include "../../error.hpp"
#include "collectives.hpp"
#include "../config.hpp"

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
MPOPT_DECL void agree(cold_collectives& comm, std::string_view what, const std::function<void()>& f);
template <adapted_communicator C, class F>
void agree(C& comm, std::string_view what, F&& f) {
  collectives_of<C> c(comm);
  agree(static_cast<cold_collectives&>(c), what, std::function<void()>([&f] { f(); }));
}

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "agree.ipp"
#endif
