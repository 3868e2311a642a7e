// mpopt — bulk conversion between float and the 16-bit storage types.
// Vectorized with AVX-512 or AVX2+F16C when the CPU has them (chosen at run time: simd.hpp), scalar
// otherwise; every path gives the same bits as the scalar conversions (round to nearest even, NaN
// rules of float_bits.hpp).
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <cstddef>
#include <span>
#include <string>

#include "detail/lanes/float_bits.hpp"
#include "detail/passes/passes.hpp"
#include "error.hpp"
#include "host_passes.hpp"  // conversions of any pair of types: passes not compiled in advance
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

// The host backend's pass at its SIMD level (simd.hpp), on the calling thread.
template <class From, class To>
inline void convert_dispatch(std::span<const From> in, std::span<To> out) {
  check_convert_sizes(in.size(), out.size());
  host::run_flat(fold_pass<To, From>{out.data(), in.data(), in.size(), false}, true);
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
