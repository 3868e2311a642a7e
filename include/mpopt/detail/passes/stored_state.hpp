// mpopt — how the passes read and write the master and the rule's state in the storage the precision
// policy chose (state_precision.hpp): fp32 as it is; bf16 state converted on load and rounded on
// store; a remainder16 master joined from, and split into, the bf16 parameter and its remainder
// (math/remainder16.hpp); no master: the parameter read as the master and rounded stochastically.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../state_precision.hpp"
#include "../config.hpp"
#include "../lanes/lanes.hpp"
#include "../math/remainder16.hpp"
#include "step_data.hpp"

namespace mpopt::detail {

/// The stochastic rounding key of state buffer k: a stream of its own beside the parameters' (`key`).
constexpr MPOPT_HOST_DEVICE std::uint32_t state_rounding_key(std::uint32_t key, std::size_t k) noexcept {
  return mix32(key + 0x9E3779B9u * std::uint32_t(k + 1));
}

/// x as state buffer k of P stores it (element `index`, step key `key`): bf16 stochastic state
/// rounded here, any other left to the store's rounding to nearest.
template <class L, class P>
MPOPT_HOST_DEVICE typename L::vec state_to_store(typename L::vec x, std::uint32_t key, std::size_t k,
                                                 std::uint64_t index) {
  if constexpr (std::is_same_v<state_storage_t<P>, bf16_state<stochastic_rounding>>)
    return L::template round_stochastic<bfloat16>(x, state_rounding_key(key, k), index);
  else return x;
}

/// The masters of a vector, joined from the bf16 parameters and their remainders: in L's own
/// instructions where it has them (the host's SIMD lanes), else lane by lane.
template <class L, class Tail>
MPOPT_HOST_DEVICE typename L::vec join_masters(const bfloat16* param, const std::int16_t* remainder, Tail tail) {
  if constexpr (requires { L::join_remainders(param, remainder, tail); }) {
    return L::join_remainders(param, remainder, tail);
  } else {
    alignas(64) float v[L::width];
    const std::uint32_t lanes = L::bits_of(tail);
    for (std::size_t j = 0; j < L::width; ++j)
      v[j] = (lanes >> j) & 1u ? join_master(param[j].bits, remainder[j]) : 0.0f;
    return L::load(v, full_t{});
  }
}

/// The masters of a vector split into the bf16 parameters and their remainders.
template <class L, class Tail>
MPOPT_HOST_DEVICE void split_masters(typename L::vec master, bfloat16* param, std::int16_t* remainder, Tail tail) {
  if constexpr (requires { L::split_remainders(master, param, remainder, tail); }) {
    L::split_remainders(master, param, remainder, tail);
  } else {
    alignas(64) float v[L::width];
    L::store(v, master, full_t{});
    const std::uint32_t lanes = L::bits_of(tail);
    for (std::size_t j = 0; j < L::width; ++j)
      if ((lanes >> j) & 1u) {
        const remainder_split s = split_master(v[j]);
        param[j] = bfloat16::from_bits(s.param);
        remainder[j] = s.remainder;
      }
  }
}

}  // namespace mpopt::detail
