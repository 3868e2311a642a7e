// mpopt — the AVX-512 host path: sixteen fp32 lanes in a zmm register, masked tails, and the
// per-chunk sums in square_sum.hpp's lane layout. Compiled for AVX-512 (F, BW) whatever the flags;
// host.hpp runs it only on CPUs that have it (simd.hpp).
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
MPOPT_TARGET_BEGIN(MPOPT_ISA_AVX512)

namespace mpopt::detail {

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
// Same operand order as the scalar max/min (lanes.hpp), so NaN handling agrees lane for lane.
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
  /// remainder16 masters (passes/stored_state.hpp): joined from bf16 parameters and their
  /// remainders, and split back into them.
  static f32x16 join_remainders(const bfloat16* p, const std::int16_t* r, full_t) {
    return f32x16(simd::join_remainder16(simd::u16_load16(p), simd::u16_load16(r)));
  }
  static f32x16 join_remainders(const bfloat16* p, const std::int16_t* r, tail m) {
    return f32x16(simd::join_remainder16(simd::u16_load16(p, m), simd::u16_load16(r, m)));
  }
  template <class Tail>
  static void split_remainders(f32x16 x, bfloat16* p, std::int16_t* r, Tail t) {
    __m512i param, remainder;
    simd::split_remainder16(x.r, param, remainder);
    if constexpr (std::is_same_v<Tail, full_t>) {
      simd::u16_store16(p, param);
      simd::u16_store16(r, remainder);
    } else {
      simd::u16_store16(p, param, t);
      simd::u16_store16(r, remainder, t);
    }
  }
  /// Blocks of quantized state (passes/block_state.hpp, simd_codes.hpp): n values from their codes of
  /// Bits each (table[code] * scale), and the codes of n values over their scale s: of map m's
  /// values, or of fp8 E4M3.
  static constexpr bool vector_codes = true;
  static float largest_magnitude(const float* x, std::size_t n) { return simd::largest_magnitude16(x, n); }
  template <int Bits>
  static void decode_block(const float* table, const std::uint8_t* codes, std::size_t n, float scale, float* out) {
    simd::decode_block16<Bits>(simd::register_table16<(1 << Bits)>(table), codes, n, scale, out);
  }
  template <std::size_t N>
  static void encode_block(const quantization_map<N>& m, const float* x, std::size_t n, float s, std::uint8_t* codes) {
    simd::encode_block16<std::bit_width(N) - 1>(x, n, s, simd::map_search16<N>(m), codes);
  }
  static void encode_block_e4m3(const float* x, std::size_t n, float s, std::uint8_t* codes) {
    simd::encode_block16<8>(x, n, s, simd::e4m3_codes16, codes);
  }
  /// x stochastically rounded to T values, lane j as element index + j. Lanes that cross a multiple
  /// of 2^32 (the noise's block) go one at a time.
  template <class T>
  static f32x16 round_stochastic(f32x16 x, std::uint32_t key, std::uint64_t index) {
    const auto lo = std::uint32_t(index);
    if (lo > 0xFFFFFFFFu - (width - 1)) {
      alignas(64) float v[width];
      _mm512_store_ps(v, x.r);
      for (std::size_t j = 0; j < width; ++j) v[j] = stochastic_round<T>(v[j], rounding_noise(key, index + j));
      return f32x16(_mm512_load_ps(v));
    }
    const __m512i noise = simd::noise16(key, lo, std::uint32_t(index >> 32));
    if constexpr (std::is_same_v<T, bfloat16>) return f32x16(simd::stochastic_bfloat16_16(x.r, noise));
    else return f32x16(simd::stochastic_half16(x.r, noise));
  }
};

template <>
struct square_sum<avx512_lanes> {
  __m512 acc;
  square_sum() : acc(_mm512_setzero_ps()) {}  // user-provided: compiled for AVX-512 like the rest
  void add(std::size_t, f32x16 x, full_t) { acc = _mm512_fmadd_ps(x.r, x.r, acc); }
  void add(std::size_t, f32x16 x, __mmask16 m) { acc = _mm512_mask3_fmadd_ps(x.r, x.r, acc, m); }
  float total() {
    alignas(64) float a[sum_lanes];
    _mm512_store_ps(a, acc);
    return lane_tree_sum(a);
  }
};

template <>
struct square_sum64<avx512_lanes> {
  __m512d lo, hi;  // lanes 0..7 and 8..15
  square_sum64() : lo(_mm512_setzero_pd()), hi(_mm512_setzero_pd()) {}
  void add(std::size_t i, f32x16 x, full_t) { add(i, x, __mmask16(0xFFFF)); }
  void add(std::size_t, f32x16 x, __mmask16 m) {
    const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(x.r));
    const __m512d b = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x.r), 1)));
    lo = _mm512_mask3_fmadd_pd(a, a, lo, __mmask8(m & 0xFF));
    hi = _mm512_mask3_fmadd_pd(b, b, hi, __mmask8(m >> 8));
  }
  double total() {
    alignas(64) double a[sum_lanes];
    _mm512_store_pd(a, lo);
    _mm512_store_pd(a + 8, hi);
    return lane_tree_sum(a);
  }
};

inline bool any_nonfinite(f32x16 x, __mmask16 m) {
  const __m512 magnitude = _mm512_abs_ps(x.r);
  return _mm512_mask_cmp_ps_mask(m, magnitude, _mm512_set1_ps(3.40282347e+38f), _CMP_NLE_UQ) != 0;
}
inline bool any_nonfinite(f32x16 x, full_t) { return any_nonfinite(x, __mmask16(0xFFFF)); }

}  // namespace mpopt::detail

MPOPT_TARGET_END
MPOPT_INTRINSICS_END
#endif  // MPOPT_X86_SIMD
