// mpopt — bulk conversion between float and the 16-bit storage types.
// Vectorized with AVX-512 or AVX2+F16C when the compiler targets them, scalar otherwise; every path
// gives the same bits as the scalar conversions (round to nearest even, NaN rules of float_bits.hpp).
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "detail/float_bits.hpp"
#include "detail/simd_convert.hpp"
#include "error.hpp"
#include "numeric.hpp"

namespace mpopt {
namespace detail {

inline void check_convert_sizes(std::size_t in, std::size_t out) {
  if (in != out) {
    throw error("convert: input has " + std::to_string(in) + " elements but output has " +
                std::to_string(out));
  }
}

// One element at a time through the scalar bit routines: the reference for the vector paths.
inline void convert_scalar(std::span<const float> in, std::span<half> out) {
  check_convert_sizes(in.size(), out.size());
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = half::from_bits(float_to_half_bits(in[i]));
}
inline void convert_scalar(std::span<const float> in, std::span<bfloat16> out) {
  check_convert_sizes(in.size(), out.size());
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = bfloat16::from_bits(float_to_bfloat16_bits(in[i]));
}
inline void convert_scalar(std::span<const half> in, std::span<float> out) {
  check_convert_sizes(in.size(), out.size());
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = half_bits_to_float(in[i].bits);
}
inline void convert_scalar(std::span<const bfloat16> in, std::span<float> out) {
  check_convert_sizes(in.size(), out.size());
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = bfloat16_bits_to_float(in[i].bits);
}

// Widest available vector loop with a partial last chunk; From/To are float, half or bfloat16.
template <class From, class To>
inline void convert_dispatch(std::span<const From> in, std::span<To> out) {
  check_convert_sizes(in.size(), out.size());
  const From* src = in.data();
  To* dst = out.data();
  const std::size_t n = in.size();
#if MPOPT_HAVE_AVX512
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) simd::store16(dst + i, simd::load16(src + i));
  if (i < n) {
    const __mmask16 m = simd::first_lanes16(static_cast<unsigned>(n - i));
    simd::store16(dst + i, simd::load16(src + i, m), m);
  }
#elif MPOPT_HAVE_AVX2
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) simd::store8(dst + i, simd::load8(src + i));
  if (i < n) {
    const int r = static_cast<int>(n - i);
    simd::store8(dst + i, simd::load8(src + i, r), r);
  }
#else
  convert_scalar(std::span<const From>(src, n), std::span<To>(dst, n));
#endif
}

}  // namespace detail

/// Converts element-wise, rounding to nearest even; the ranges must not overlap.
/// Throws mpopt::error (writing nothing) if the sizes differ.
inline void convert(std::span<const float> in, std::span<half> out) { detail::convert_dispatch(in, out); }
inline void convert(std::span<const float> in, std::span<bfloat16> out) { detail::convert_dispatch(in, out); }
/// Widens exactly (half NaNs come out quiet, as with F16C); the ranges must not overlap.
inline void convert(std::span<const half> in, std::span<float> out) { detail::convert_dispatch(in, out); }
inline void convert(std::span<const bfloat16> in, std::span<float> out) { detail::convert_dispatch(in, out); }

}  // namespace mpopt
