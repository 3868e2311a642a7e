// mpopt — the AVX2 host path: eight fp32 lanes in a ymm register (FMA and F16C too), tails of the
// first n lanes, and the per-chunk sums in square_sum.hpp's lane layout (two vectors make its 16
// lanes). Compiled for AVX2 whatever the flags; host.hpp runs it only on CPUs that have it (simd.hpp).
#pragma once

#include "../config.hpp"

#if MPOPT_X86_SIMD
#include <immintrin.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "lanes.hpp"
#include "simd_codes.hpp"
#include "simd_convert.hpp"
#include "../passes/square_sum.hpp"

MPOPT_INTRINSICS_BEGIN
MPOPT_TARGET_BEGIN(MPOPT_ISA_AVX2)

namespace mpopt::detail {

/// Eight fp32 lanes in one ymm register.
struct f32x8 {
  __m256 r;
  f32x8() = default;
  f32x8(float s) : r(_mm256_set1_ps(s)) {}  // NOLINT: broadcasts read like scalars in formulas
  explicit f32x8(__m256 v) : r(v) {}
};
/// A lane mask: every bit of a lane set, or none.
struct m32x8 {
  __m256 r;
};

inline f32x8 operator+(f32x8 a, f32x8 b) { return f32x8(_mm256_add_ps(a.r, b.r)); }
inline f32x8 operator-(f32x8 a, f32x8 b) { return f32x8(_mm256_sub_ps(a.r, b.r)); }
inline f32x8 operator*(f32x8 a, f32x8 b) { return f32x8(_mm256_mul_ps(a.r, b.r)); }
inline f32x8 operator/(f32x8 a, f32x8 b) { return f32x8(_mm256_div_ps(a.r, b.r)); }
inline f32x8 operator-(f32x8 a) { return f32x8(_mm256_xor_ps(a.r, _mm256_set1_ps(-0.0f))); }
inline f32x8 fma(f32x8 a, f32x8 b, f32x8 c) { return f32x8(_mm256_fmadd_ps(a.r, b.r, c.r)); }
inline f32x8 sqrt(f32x8 a) { return f32x8(_mm256_sqrt_ps(a.r)); }
// MAXPS and MINPS are a > b ? a : b and a < b ? a : b, the scalar max/min of lanes.hpp, NaN and
// signed zeros included.
inline f32x8 max(f32x8 a, f32x8 b) { return f32x8(_mm256_max_ps(a.r, b.r)); }
inline f32x8 min(f32x8 a, f32x8 b) { return f32x8(_mm256_min_ps(a.r, b.r)); }
inline m32x8 nonnegative(f32x8 x) { return {_mm256_cmp_ps(x.r, _mm256_setzero_ps(), _CMP_GE_OQ)}; }
inline f32x8 select(m32x8 m, f32x8 a, f32x8 b) { return f32x8(_mm256_blendv_ps(b.r, a.r, m.r)); }

/// The last vector of a chunk: lanes [0, n) hold elements, n in 1..7.
struct avx2_tail {
  int n;
  __m256 lanes() const { return _mm256_castsi256_ps(simd::first_lanes8(n)); }
};

struct avx2_lanes {
  using vec = f32x8;
  using mask = m32x8;
  using tail = avx2_tail;
  static constexpr std::size_t width = 8;
  static constexpr const char* name = "avx2";
  static avx2_tail first(std::size_t n) { return {int(n)}; }
  template <class T>
  static f32x8 load(const T* p, full_t) { return f32x8(simd::load8(p)); }
  template <class T>
  static f32x8 load(const T* p, avx2_tail t) { return f32x8(simd::load8(p, t.n)); }
  template <class T>
  static void store(T* p, f32x8 x, full_t) { simd::store8(p, x.r); }
  template <class T>
  static void store(T* p, f32x8 x, avx2_tail t) { simd::store8(p, x.r, t.n); }
  static std::uint32_t bits_of(m32x8 m) { return std::uint32_t(_mm256_movemask_ps(m.r)); }
  static m32x8 mask_of(std::uint32_t bits) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return {_mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(bits)), bit), bit))};
  }
  static std::uint32_t bits_of(full_t) { return 0xFFu; }
  static std::uint32_t bits_of(avx2_tail t) { return (1u << t.n) - 1u; }
  static f32x8 keep(f32x8 x, f32x8, full_t) { return x; }
  static f32x8 keep(f32x8 x, f32x8 fallback, avx2_tail t) { return f32x8(_mm256_blendv_ps(fallback.r, x.r, t.lanes())); }
  static float max_lane(f32x8 x) {
    alignas(32) float a[width];
    _mm256_store_ps(a, x.r);
    return lane_tree<width>(a, [](float u, float v) { return max(u, v); });
  }
  /// As avx512_lanes::join_remainders and split_remainders.
  static f32x8 join_remainders(const bfloat16* p, const std::int16_t* r, full_t) {
    return f32x8(simd::join_remainder8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)),
                                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(r))));
  }
  static f32x8 join_remainders(const bfloat16* p, const std::int16_t* r, avx2_tail t) {
    return f32x8(simd::join_remainder8(simd::load8_u16(p, t.n), simd::load8_u16(r, t.n)));
  }
  template <class Tail>
  static void split_remainders(f32x8 x, bfloat16* p, std::int16_t* r, Tail t) {
    __m128i param, remainder;
    simd::split_remainder8(x.r, param, remainder);
    if constexpr (std::is_same_v<Tail, full_t>) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), param);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(r), remainder);
    } else {
      simd::store8_u16(p, param, t.n);
      simd::store8_u16(r, remainder, t.n);
    }
  }
  /// As avx512_lanes' blocks of quantized state; 8-bit tables, too large for registers, are gathered
  /// from.
  static constexpr bool vector_codes = true;
  static float largest_magnitude(const float* x, std::size_t n) { return simd::largest_magnitude8(x, n); }
  template <int Bits>
  static void decode_block(const float* table, const std::uint8_t* codes, std::size_t n, float scale, float* out) {
    if constexpr (Bits == 4) simd::decode_block8<Bits>(simd::register_table8<16>(table), codes, n, scale, out);
    else simd::decode_block8<Bits>(simd::table_gather8{table}, codes, n, scale, out);
  }
  template <std::size_t N>
  static void encode_block(const quantization_map<N>& m, const float* x, std::size_t n, float s, std::uint8_t* codes) {
    constexpr int bits = std::bit_width(N) - 1;
    if constexpr (N <= 16) simd::encode_block8<bits>(x, n, s, simd::map_search8<N>(m), codes);
    else simd::encode_block8<bits>(x, n, s, simd::map_buckets8<N>{m}, codes);
  }
  static void encode_block_e4m3(const float* x, std::size_t n, float s, std::uint8_t* codes) {
    simd::encode_block8<8>(x, n, s, simd::e4m3_codes8, codes);
  }
  /// As avx512_lanes::round_stochastic.
  template <class T>
  static f32x8 round_stochastic(f32x8 x, std::uint32_t key, std::uint64_t index) {
    const auto lo = std::uint32_t(index);
    if (lo > 0xFFFFFFFFu - (width - 1)) {
      alignas(32) float v[width];
      _mm256_store_ps(v, x.r);
      for (std::size_t j = 0; j < width; ++j) v[j] = stochastic_round<T>(v[j], rounding_noise(key, index + j));
      return f32x8(_mm256_load_ps(v));
    }
    const __m256i noise = simd::noise8(key, lo, std::uint32_t(index >> 32));
    if constexpr (std::is_same_v<T, bfloat16>) return f32x8(simd::stochastic_bfloat16_8(x.r, noise));
    else return f32x8(simd::stochastic_half8(x.r, noise));
  }
  /// x in the lanes of the tail, +0 in the others.
  static f32x8 zero_past(f32x8 x, full_t) { return x; }
  static f32x8 zero_past(f32x8 x, avx2_tail t) { return f32x8(_mm256_and_ps(x.r, t.lanes())); }
};

// The sums: the vector at element i (a multiple of 8) holds lanes i % 16 .. i % 16 + 7 of the
// 16-lane layout, the low or the high half. Lanes past a tail add +0 * +0, which leaves a sum of
// squares (never -0) unchanged: what a masked add would do.

template <>
struct square_sum<avx2_lanes> {
  __m256 lo, hi;  // lanes 0..7 and 8..15
  square_sum() : lo(_mm256_setzero_ps()), hi(_mm256_setzero_ps()) {}  // user-provided: compiled for AVX2
  template <class Tail>
  void add(std::size_t i, f32x8 x, Tail t) {
    x = avx2_lanes::zero_past(x, t);
    if (i & 8) hi = _mm256_fmadd_ps(x.r, x.r, hi);
    else lo = _mm256_fmadd_ps(x.r, x.r, lo);
  }
  float total() {
    alignas(32) float a[sum_lanes];
    _mm256_store_ps(a, lo);
    _mm256_store_ps(a + 8, hi);
    return lane_tree_sum(a);
  }
};

/// Squares of floats are exact in double, so fma or a multiply and an add give the same bits.
template <>
struct square_sum64<avx2_lanes> {
  __m256d acc[4];  // lanes 0..3, 4..7, 8..11, 12..15
  square_sum64() : acc{_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()} {}
  template <class Tail>
  void add(std::size_t i, f32x8 x, Tail t) {
    x = avx2_lanes::zero_past(x, t);
    const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(x.r));
    const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(x.r, 1));
    const std::size_t h = (i & 8) ? 2 : 0;
    acc[h] = _mm256_fmadd_pd(a, a, acc[h]);
    acc[h + 1] = _mm256_fmadd_pd(b, b, acc[h + 1]);
  }
  double total() {
    alignas(32) double a[sum_lanes];
    for (std::size_t k = 0; k < 4; ++k) _mm256_store_pd(a + 4 * k, acc[k]);
    return lane_tree_sum(a);
  }
};

inline bool any_nonfinite(f32x8 x, std::uint32_t lanes) {
  const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x.r);
  const __m256 beyond = _mm256_cmp_ps(magnitude, _mm256_set1_ps(3.40282347e+38f), _CMP_NLE_UQ);
  return (std::uint32_t(_mm256_movemask_ps(beyond)) & lanes) != 0;
}
inline bool any_nonfinite(f32x8 x, full_t) { return any_nonfinite(x, 0xFFu); }
inline bool any_nonfinite(f32x8 x, avx2_tail t) { return any_nonfinite(x, avx2_lanes::bits_of(t)); }

}  // namespace mpopt::detail

MPOPT_TARGET_END
MPOPT_INTRINSICS_END
#endif  // MPOPT_X86_SIMD
