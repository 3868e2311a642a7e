// mpopt — the vector vocabulary the per-element math is written in. A formula is a template over a
// lane type V (float on the device and in the scalar host path; f32x8 and f32x16 in the AVX2 and
// AVX-512 host paths, avx2_lanes.hpp and avx512_lanes.hpp) using only +, -, *, /, fma, sqrt, min,
// max and broadcasts, so one source serves every backend and every multiply-add is an explicit fma
// (no compiler contraction decides the rounding).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "../config.hpp"
#include "stochastic_rounding.hpp"

namespace mpopt::detail {

MPOPT_HOST_DEVICE float fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
MPOPT_HOST_DEVICE float sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
MPOPT_HOST_DEVICE float max(float a, float b) { return a > b ? a : b; }
MPOPT_HOST_DEVICE float min(float a, float b) { return a < b ? a : b; }
/// x >= 0, -0 included, NaN not.
MPOPT_HOST_DEVICE bool nonnegative(float x) { return x >= 0.0f; }
/// a where m holds, else b.
MPOPT_HOST_DEVICE float select(bool m, float a, float b) { return m ? a : b; }

/// Marks a full vector (no tail): loads and stores are unmasked.
struct full_t {};

/// One element at a time, in plain float arithmetic.
struct scalar_lanes {
  using vec = float;
  static constexpr std::size_t width = 1;
  static constexpr const char* name = "scalar";
  template <class T>
  MPOPT_HOST_DEVICE static float load(const T* p, full_t) { return static_cast<float>(*p); }
  template <class T>
  MPOPT_HOST_DEVICE static void store(T* p, float x, full_t) { *p = static_cast<T>(x); }
  /// A lane mask as bits (bit j: lane j) and back.
  using mask = bool;
  MPOPT_HOST_DEVICE static std::uint32_t bits_of(bool m) { return m ? 1u : 0u; }
  MPOPT_HOST_DEVICE static bool mask_of(std::uint32_t bits) { return (bits & 1u) != 0; }
  MPOPT_HOST_DEVICE static std::uint32_t bits_of(full_t) { return 1u; }
  /// x in the lanes of the tail, fallback in the others; the largest lane.
  MPOPT_HOST_DEVICE static float keep(float x, float, full_t) { return x; }
  MPOPT_HOST_DEVICE static float max_lane(float x) { return x; }
  /// x stochastically rounded to a T value (stochastic_rounding.hpp), as element `index`.
  template <class T>
  MPOPT_HOST_DEVICE static float round_stochastic(float x, std::uint32_t key, std::uint64_t index) {
    return stochastic_round<T>(x, rounding_noise(key, index));
  }
};

/// Runs body(i, tail) over [0, n): full vectors, then one masked tail.
template <class L, class Body>
inline void for_each_vector(std::size_t n, Body&& body) {
  std::size_t i = 0;
  for (; i + L::width <= n; i += L::width) body(i, full_t{});
  if constexpr (L::width > 1) {
    if (i < n) body(i, L::first(n - i));
  }
}

}  // namespace mpopt::detail
