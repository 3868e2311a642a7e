// mpopt — scalar bit-level conversions between float/double and the 16-bit storage formats.
// Pure integer arithmetic on bit-cast bits: constexpr, no intrinsics, no CUDA headers, the same
// code on the host and the device, and independent of the FP environment (MXCSR DAZ/FTZ, rounding
// mode).
#pragma once

#include <cstdint>

#include "../config.hpp"

namespace mpopt::detail {

/// std::bit_cast for host and device code (nvcc does not let device code call std::bit_cast).
template <class To, class From>
constexpr MPOPT_HOST_DEVICE To bit_cast(const From& from) noexcept {
  return __builtin_bit_cast(To, from);
}

/// x with its significand rounded to float's 24 bits (to nearest, ties to even) and its exponent
/// kept: float's precision in double's range. Inf and NaN pass unchanged.
constexpr MPOPT_HOST_DEVICE double round_to_float_precision(double x) noexcept {
  std::uint64_t u = detail::bit_cast<std::uint64_t>(x);
  if ((u & 0x7FF0000000000000ull) == 0x7FF0000000000000ull) return x;
  u += 0x0FFFFFFFull + ((u >> 29) & 1u);  // a carry out of the significand bumps the exponent
  return detail::bit_cast<double>(u & ~0x1FFFFFFFull);
}
static_assert(round_to_float_precision(1.0 + 0x1p-30) == 1.0 && round_to_float_precision(1.0 + 0x1p-23) == 1.0 + 0x1p-23);
static_assert(round_to_float_precision(1.0 + 0x1p-24) == 1.0 && round_to_float_precision(1.0 + 0x3p-24) == 1.0 + 0x1p-22);
static_assert(round_to_float_precision(0x1.fffffffp300) == 0x1p301);

/// A float NaN's binary16 (float_to_half_bits): sign | 0x7E00 | (mantissa >> 13), the quiet bit
/// forced, the upper payload kept (as x86 VCVTPS2PH).
constexpr MPOPT_HOST_DEVICE std::uint16_t float_nan_to_half_bits(float f) noexcept {
  const std::uint32_t u = detail::bit_cast<std::uint32_t>(f);
  return static_cast<std::uint16_t>(((u >> 16) & 0x8000u) | 0x7E00u | ((u >> 13) & 0x03FFu));
}

/// float -> IEEE 754 binary16, round to nearest, ties to even; overflow -> ±inf; subnormals kept.
/// NaN: float_nan_to_half_bits.
constexpr MPOPT_HOST_DEVICE std::uint16_t float_to_half_bits(float f) noexcept {
  const std::uint32_t u = detail::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7FFFFFFFu;

  if (a > 0x7F800000u) return float_nan_to_half_bits(f);
  // IEEE 754-2019 §7.4: |x| >= 65504 + ulp/2 = 65520 (0x477FF000) overflows to inf.
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);

  if (a >= 0x38800000u) {  // |x| >= 2^-14: normal half.
    // Rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even. A carry out
    // of the mantissa correctly bumps the exponent (up to 0x7BFF at most, since a < 65520).
    std::uint32_t r = a - 0x38000000u;
    r += 0x0FFFu + ((r >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (r >> 13));
  }

  // Half subnormal range: result is |x| / 2^-24 rounded to an integer in [0, 0x400]. |x| <= 2^-25
  // (0x33000000) is at most half an ulp of 2^-24 and rounds to zero (the tie goes to even 0).
  if (a <= 0x33000000u) return sign;
  const std::uint32_t exp = a >> 23;                          // 102..112 here
  const std::uint32_t sig = (a & 0x007FFFFFu) | 0x00800000u;  // 24-bit significand
  const std::uint32_t shift = 126u - exp;                     // sig * 2^(exp-150) / 2^-24
  std::uint32_t q = sig >> shift;
  const std::uint32_t rem = sig & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;  // q == 0x400 is the smallest normal
  return static_cast<std::uint16_t>(sign | q);
}

/// A binary16 NaN's float (half_bits_to_float): sign | 0x7FC00000 | (payload << 13), the quiet bit
/// set even for a signalling NaN, exactly as x86 VCVTPH2PS does (checked on hardware: 0x7C01 ->
/// 0x7FC02000).
constexpr MPOPT_HOST_DEVICE float half_nan_to_float(std::uint16_t h) noexcept {
  return detail::bit_cast<float>((static_cast<std::uint32_t>(h & 0x8000u) << 16) | 0x7FC00000u |
                                 (static_cast<std::uint32_t>(h & 0x03FFu) << 13));
}

/// binary16 -> float, exact. NaN: half_nan_to_float.
constexpr MPOPT_HOST_DEVICE float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t man = h & 0x03FFu;

  if (exp == 0x1Fu) return man == 0 ? detail::bit_cast<float>(sign | 0x7F800000u) : half_nan_to_float(h);
  if (exp == 0) {
    if (man == 0) return detail::bit_cast<float>(sign);
    // Subnormal: normalize so the leading 1 lands on the implicit-bit position (bit 10).
    exp = 1;
    while ((man & 0x0400u) == 0) {
      man <<= 1;
      --exp;
    }
    man &= 0x03FFu;
  }
  return detail::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));  // rebias 15 -> 127
}

/// float -> bfloat16 (the top 16 bits of a float), round to nearest, ties to even; subnormals are
/// rounded like any other value (no flush to zero), overflow gives ±inf.
/// NaN -> (bits >> 16) | 0x0040: sign and upper payload kept, quiet bit forced.
constexpr MPOPT_HOST_DEVICE std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  const std::uint32_t u = detail::bit_cast<std::uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  // RNE on the 16 dropped bits (same rule as IEEE 754 roundTiesToEven); carries propagate into the
  // exponent, so 0x7F7FFFFF correctly becomes inf (0x7F80). Cannot overflow 32 bits for non-NaN.
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/// bfloat16 -> float, exact (signalling NaNs stay signalling: it is a plain bit move).
constexpr MPOPT_HOST_DEVICE float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return detail::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

/// double -> float bits, rounded to odd (truncate, then set the last bit if anything was dropped).
/// Rounding to odd at >= p+2 bits followed by RNE to p bits equals direct RNE to p bits
/// (Boldo & Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using
/// rounding to odd", IEEE TC 2008); float's 24 bits cover half (11) and bfloat16 (8).
/// Overflow gives FLT_MAX (odd, so it still rounds to inf below); NaN -> quiet NaN, upper payload.
constexpr MPOPT_HOST_DEVICE std::uint32_t double_to_float_bits_round_to_odd(double d) noexcept {
  const std::uint64_t u = detail::bit_cast<std::uint64_t>(d);
  const auto sign = static_cast<std::uint32_t>(u >> 32) & 0x80000000u;
  const auto exp = static_cast<std::int32_t>((u >> 52) & 0x7FFu);
  const std::uint64_t man = u & 0x000FFFFFFFFFFFFFull;

  if (exp == 0x7FF) {
    return man == 0 ? (sign | 0x7F800000u) : (sign | 0x7FC00000u | static_cast<std::uint32_t>(man >> 29));
  }
  if (exp == 0) return man == 0 ? sign : (sign | 1u);  // |d| < 2^-1022: far below float's 2^-149
  const std::int32_t fexp = exp - 1023 + 127;
  if (fexp >= 0xFF) return sign | 0x7F7FFFFFu;
  if (fexp >= 1) {
    const auto sticky = static_cast<std::uint32_t>((man & ((1ull << 29) - 1u)) != 0);
    return sign | (static_cast<std::uint32_t>(fexp) << 23) | static_cast<std::uint32_t>(man >> 29) | sticky;
  }
  // Float subnormal: count units of 2^-149 in sig * 2^(exp-1075).
  const std::uint64_t sig = man | (1ull << 52);
  const std::int32_t shift = 30 - fexp;  // >= 30
  if (shift >= 64) return sign | 1u;
  const auto q = static_cast<std::uint32_t>(sig >> shift);
  const auto sticky = static_cast<std::uint32_t>((sig & ((1ull << shift) - 1u)) != 0);
  return sign | q | sticky;
}

/// double -> binary16, correctly rounded (no double rounding through float). NaN as for float.
constexpr MPOPT_HOST_DEVICE std::uint16_t double_to_half_bits(double d) noexcept {
  return float_to_half_bits(detail::bit_cast<float>(double_to_float_bits_round_to_odd(d)));
}

/// double -> bfloat16, correctly rounded (no double rounding through float). NaN as for float.
constexpr MPOPT_HOST_DEVICE std::uint16_t double_to_bfloat16_bits(double d) noexcept {
  return float_to_bfloat16_bits(detail::bit_cast<float>(double_to_float_bits_round_to_odd(d)));
}

}  // namespace mpopt::detail
