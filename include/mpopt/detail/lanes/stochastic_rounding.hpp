// mpopt — stochastic rounding of fp32 into bfloat16 and half, one element at a time; the vector
// forms (simd_convert.hpp) and every lane type give these bits.
//
// The noise is a counter-based hash of (seed, step, global element index), never a stream with state:
// any thread, SIMD lane, rank or backend that rounds an element computes the same bits for it, and a
// checkpoint that saves the seed and the step count resumes the same noise.
//
// Rounding itself returns the fp32 value to store, already a value of the 16-bit type, so the
// nearest-rounding store that follows is exact: x rounds away from zero with probability equal to
// the fraction of a step it lies past the value below it in magnitude (exact for |x| >= 2^-25 in half;
// below that within 2^-24 of a step).
#pragma once

#include <cstdint>
#include <type_traits>

#include "../../numeric.hpp"
#include "../config.hpp"
#include "float_bits.hpp"

namespace mpopt::detail {

/// A 32-bit integer hash with full avalanche (Wellons' lowbias32); a bijection, so distinct inputs
/// never share an output.
constexpr MPOPT_HOST_DEVICE std::uint32_t mix32(std::uint32_t x) noexcept {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

/// The key of one step's noise: all of seed and step hashed in.
constexpr MPOPT_HOST_DEVICE std::uint32_t rounding_key(std::uint64_t seed, std::uint64_t step) noexcept {
  std::uint32_t k = mix32(std::uint32_t(seed >> 32) ^ 0x9E3779B9u);
  k = mix32(k ^ std::uint32_t(seed));
  k = mix32(k ^ std::uint32_t(step >> 32));
  return mix32(k ^ std::uint32_t(step));
}

/// 32 noise bits for one element. Within a block of 2^32 indices no two elements share them.
constexpr MPOPT_HOST_DEVICE std::uint32_t rounding_noise(std::uint32_t key, std::uint64_t index) noexcept {
  return mix32(mix32(std::uint32_t(index) ^ key) + std::uint32_t(index >> 32));
}

/// x rounded to a bfloat16 value: the 16 dropped bits plus 16 noise bits carry into the kept ones
/// (up with probability dropped / 2^16). Subnormals and overflow to inf follow the same carry; NaN
/// is returned as it is (the store quiets it).
constexpr MPOPT_HOST_DEVICE float stochastic_bfloat16(float x, std::uint32_t noise) noexcept {
  const std::uint32_t u = bit_cast<std::uint32_t>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return x;
  return bit_cast<float>((u + (noise & 0xFFFFu)) & 0xFFFF0000u);
}

/// x rounded to a half value. In half's normal range the 13 dropped bits carry as for bfloat16
/// (beyond 65504 that reaches inf, as nearest rounding does past 65520). Below 2^-14 half's step is
/// 2^-24 whatever the exponent: q = |x| / 2^-24 (fp32 subnormals give 0, so no result depends on
/// DAZ/FTZ) goes up from trunc(q) when its fraction exceeds (noise >> 8) / 2^24.
constexpr MPOPT_HOST_DEVICE float stochastic_half(float x, std::uint32_t noise) noexcept {
  const std::uint32_t u = bit_cast<std::uint32_t>(x), a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return x;
  if (a >= 0x38800000u) return bit_cast<float>((u + (noise & 0x1FFFu)) & ~0x1FFFu);
  const float q = a >= 0x00800000u ? bit_cast<float>(a + 0x0C000000u) : 0.0f;  // exponent + 24: exact
  const float k = float(std::uint32_t(q));
  const float up = q - k > float(noise >> 8) * 0x1p-24f ? 1.0f : 0.0f;
  return bit_cast<float>(bit_cast<std::uint32_t>((k + up) * 0x1p-24f) | (u & 0x80000000u));
}

template <class T>
constexpr MPOPT_HOST_DEVICE float stochastic_round(float x, std::uint32_t noise) noexcept {
  static_assert(std::is_same_v<T, bfloat16> || std::is_same_v<T, half>, "stochastic rounding is into bf16 or fp16");
  if constexpr (std::is_same_v<T, bfloat16>) return stochastic_bfloat16(x, noise);
  else return stochastic_half(x, noise);
}

}  // namespace mpopt::detail
