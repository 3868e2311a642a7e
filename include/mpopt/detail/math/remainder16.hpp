// mpopt — an fp32 master kept as its bfloat16 parameter and a 16-bit remainder (state precision
// remainder16): the parameter is the master rounded to nearest, and the remainder is what the
// parameter's bits lack of the master's, so that together they are the master exactly.
//
// As integers, master = (parameter << 16) + remainder, the remainder a signed 16-bit number. The
// parameter is the master's upper half plus the carry of its lower half: a lower half of 0x8000 or
// more (a remainder below 0) rounds up, a tie away from zero (round to nearest even would need a
// remainder of +0x8000 on ties that round down, one more than 16 signed bits hold). Apex's
// DistributedFusedAdam and Transformer Engine's FusedAdam (store_param_remainders) keep the same pair.
// A NaN master keeps a quiet NaN parameter (its sign and upper payload, as bfloat16 rounding does)
// and a remainder of 0: it comes back a NaN, not necessarily with the same payload.
#pragma once

#include <cstdint>

#include "../config.hpp"
#include "../lanes/float_bits.hpp"

namespace mpopt::detail {

/// A master as its parameter's bits and its remainder.
struct remainder_split {
  std::uint16_t param;
  std::int16_t remainder;
};

constexpr MPOPT_HOST_DEVICE remainder_split split_master(float master) noexcept {
  const std::uint32_t u = bit_cast<std::uint32_t>(master);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return {std::uint16_t((u >> 16) | 0x0040u), 0};
  // Not a NaN, so u + 0x8000 does not wrap; the carry of a finite maximum reaches inf, as rounding does.
  const std::uint32_t param = (u + 0x8000u) >> 16;
  return {std::uint16_t(param), std::int16_t(std::uint16_t(u - (param << 16)))};
}

constexpr MPOPT_HOST_DEVICE float join_master(std::uint16_t param, std::int16_t remainder) noexcept {
  return bit_cast<float>((std::uint32_t(param) << 16) + std::uint32_t(std::int32_t(remainder)));
}

static_assert(split_master(1.0f).param == 0x3F80 && split_master(1.0f).remainder == 0);
static_assert(join_master(0x3F80, -1) == 0x1.fffffep-1f);                       // below 1: the upper half less one
static_assert(split_master(0x1.fffffep-1f).param == 0x3F80);                    // rounds up to 1
static_assert(split_master(bit_cast<float>(0x3F808000u)).param == 0x3F81);      // a tie: away from zero
static_assert(split_master(bit_cast<float>(0x3F807FFFu)).param == 0x3F80);
static_assert(split_master(bit_cast<float>(0xBF808000u)).param == 0xBF81);      // and for negatives
static_assert(split_master(bit_cast<float>(0x7F7FFFFFu)).param == 0x7F80);      // the largest float: inf
static_assert(join_master(0x7F80, split_master(bit_cast<float>(0x7F7FFFFFu)).remainder) == bit_cast<float>(0x7F7FFFFFu));

}  // namespace mpopt::detail
