// mpopt — the vector vocabulary the per-element math is written in. A formula is a template over a
// lane type V (float on the device and in the scalar host path, f32x16 on AVX-512 hosts) using only
// +, -, *, /, fma, sqrt, min, max and broadcasts, so one source serves every backend and every
// multiply-add is an explicit fma (no compiler contraction decides the rounding).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "config.hpp"
#include "simd_convert.hpp"

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
};

#if MPOPT_HAVE_AVX512
MPOPT_INTRINSICS_BEGIN
/// Sixteen fp32 lanes in one zmm register.
struct f32x16 {
  __m512 r;
  f32x16() = default;
  f32x16(float s) : r(_mm512_set1_ps(s)) {}  // NOLINT: broadcasts read like scalars in formulas
  explicit f32x16(__m512 v) : r(v) {}
};
inline f32x16 operator+(f32x16 a, f32x16 b) { return f32x16(_mm512_add_ps(a.r, b.r)); }
inline f32x16 operator-(f32x16 a, f32x16 b) { return f32x16(_mm512_sub_ps(a.r, b.r)); }
inline f32x16 operator*(f32x16 a, f32x16 b) { return f32x16(_mm512_mul_ps(a.r, b.r)); }
inline f32x16 operator/(f32x16 a, f32x16 b) { return f32x16(_mm512_div_ps(a.r, b.r)); }
inline f32x16 operator-(f32x16 a) { return f32x16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a.r), _mm512_set1_epi32(int(0x80000000u))))); }
inline f32x16 fma(f32x16 a, f32x16 b, f32x16 c) { return f32x16(_mm512_fmadd_ps(a.r, b.r, c.r)); }
inline f32x16 sqrt(f32x16 a) { return f32x16(_mm512_sqrt_ps(a.r)); }
// Same operand order as the scalar max/min above, so NaN handling agrees lane for lane.
inline f32x16 max(f32x16 a, f32x16 b) { return f32x16(_mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.r, b.r, _CMP_GT_OQ), b.r, a.r)); }
inline f32x16 min(f32x16 a, f32x16 b) { return f32x16(_mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.r, b.r, _CMP_LT_OQ), b.r, a.r)); }
inline __mmask16 nonnegative(f32x16 x) { return _mm512_cmp_ps_mask(x.r, _mm512_setzero_ps(), _CMP_GE_OQ); }
inline f32x16 select(__mmask16 m, f32x16 a, f32x16 b) { return f32x16(_mm512_mask_blend_ps(m, b.r, a.r)); }

struct avx512_lanes {
  using vec = f32x16;
  using tail = __mmask16;
  static constexpr std::size_t width = 16;
  static constexpr const char* name = "avx512";
  static tail first(std::size_t n) { return static_cast<tail>((1u << n) - 1u); }
  template <class T>
  static f32x16 load(const T* p, full_t) { return f32x16(simd::load16(p)); }
  template <class T>
  static f32x16 load(const T* p, tail m) { return f32x16(simd::load16(p, m)); }
  template <class T>
  static void store(T* p, f32x16 x, full_t) { simd::store16(p, x.r); }
  template <class T>
  static void store(T* p, f32x16 x, tail m) { simd::store16(p, x.r, m); }
  using mask = __mmask16;
  static std::uint32_t bits_of(__mmask16 m) { return m; }
  static __mmask16 mask_of(std::uint32_t bits) { return static_cast<__mmask16>(bits); }
  static std::uint32_t bits_of(full_t) { return 0xFFFFu; }
  static f32x16 keep(f32x16 x, f32x16, full_t) { return x; }
  static f32x16 keep(f32x16 x, f32x16 fallback, tail m) { return f32x16(_mm512_mask_blend_ps(m, fallback.r, x.r)); }
  static float max_lane(f32x16 x) { return _mm512_reduce_max_ps(x.r); }
};
MPOPT_INTRINSICS_END
using host_lanes = avx512_lanes;
#else
using host_lanes = scalar_lanes;
#endif

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
