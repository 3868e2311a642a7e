// mpopt — x86 vector load/convert/store primitives shared by the host kernels.
// Every function is bit-identical to the scalar conversions in float_bits.hpp for every input
// (NaN payloads, inf, subnormals, -0), whatever MXCSR holds: the half conversions take an explicit
// RNE immediate, and DAZ could only zero float subnormals, which round to ±0 in half anyway.
// They exist whenever MPOPT_X86_SIMD does, each compiled for its instruction set (config.hpp): call
// them from code of that set (a lane type, an MPOPT_TARGET_ENTRY).
#pragma once

#include "../../numeric.hpp"
#include "../config.hpp"

#if MPOPT_X86_SIMD
#include <immintrin.h>

#include <cstdint>
#include <cstring>

MPOPT_INTRINSICS_BEGIN  // see config.hpp

namespace mpopt::detail::simd {

MPOPT_TARGET_BEGIN(MPOPT_ISA_AVX512)

// 16 lanes. Masked variants touch only the lanes set in m (masked-out lanes never fault) and give
// +0.0f in the others.

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }

// VCVTPH2PS matches half_bits_to_float exactly, including quieting signalling NaNs.
inline __m512 load16(const half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load16(const half* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16(m, p)));
}

inline __m512 bf16_widen16(__m256i b) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)); }
inline __m512 load16(const bfloat16* p) { return bf16_widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512 load16(const bfloat16* p, __mmask16 m) {
  return bf16_widen16(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16(m, p)));
}

inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }

// VCVTPS2PH with an explicit RNE immediate (ignores MXCSR.RC) matches float_to_half_bits,
// including its NaN rule sign | 0x7E00 | (mantissa >> 13).
inline __m256i half_narrow16(__m512 v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline void store16(half* p, __m512 v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), half_narrow16(v)); }
inline void store16(half* p, __m512 v, __mmask16 m) {
  _mm512_mask_storeu_epi16(p, m, _mm512_zextsi256_si512(half_narrow16(v)));
}

// float_to_bfloat16_bits in integer ops, one result per 32-bit lane (in the low 16 bits).
// Not VCVTNEPS2BF16: it flushes subnormals to zero.
inline __m512i bf16_round16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_blend_epi32(nan, rounded, quiet);
}
inline void store16(bfloat16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bf16_round16(v)));
}
inline void store16(bfloat16* p, __m512 v, __mmask16 m) { _mm512_mask_cvtepi32_storeu_epi16(p, m, bf16_round16(v)); }

/// Mask of the first n lanes, n in 0..16.
inline __mmask16 first_lanes16(unsigned n) { return static_cast<__mmask16>((1u << n) - 1u); }

// Stochastic rounding (stochastic_rounding.hpp), lane for lane the scalar functions' bits.

inline __m512i mix32_16(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int(0x7FEB352Du)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int(0x846CA68Bu)));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}
/// rounding_noise of elements lo .. lo + 15 of the block hi (the caller keeps them in one block).
inline __m512i noise16(std::uint32_t key, std::uint32_t lo, std::uint32_t hi) {
  const __m512i i = _mm512_add_epi32(_mm512_set1_epi32(int(lo)),
                                     _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  return mix32_16(_mm512_add_epi32(mix32_16(_mm512_xor_si512(i, _mm512_set1_epi32(int(key)))), _mm512_set1_epi32(int(hi))));
}
/// The carry rule: (u + (noise & dropped)) & ~dropped.
inline __m512i carry_round16(__m512i u, __m512i noise, std::uint32_t dropped) {
  const __m512i d = _mm512_set1_epi32(int(dropped));
  return _mm512_andnot_si512(d, _mm512_add_epi32(u, _mm512_and_si512(noise, d)));
}
inline __mmask16 is_nan16(__m512i a) { return _mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(0x7F800000)); }
inline __m512 stochastic_bfloat16_16(__m512 v, __m512i noise) {
  const __m512i u = _mm512_castps_si512(v);
  const __mmask16 nan = is_nan16(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)));
  return _mm512_castsi512_ps(_mm512_mask_blend_epi32(nan, carry_round16(u, noise, 0xFFFFu), u));
}
inline __m512 stochastic_half16(__m512 v, __m512i noise) {
  const __m512i u = _mm512_castps_si512(v), a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i sign = _mm512_andnot_si512(a, u);
  // Below 2^-14: steps of 2^-24, counted in fp32 (q exact; fp32 subnormals give 0).
  const __mmask16 normal32 = _mm512_cmpge_epi32_mask(a, _mm512_set1_epi32(0x00800000));
  const __m512 q = _mm512_castsi512_ps(_mm512_maskz_add_epi32(normal32, a, _mm512_set1_epi32(0x0C000000)));
  const __m512 k = _mm512_cvtepi32_ps(_mm512_cvttps_epi32(q));
  const __m512 threshold = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(noise, 8)), _mm512_set1_ps(0x1p-24f));
  const __mmask16 up = _mm512_cmp_ps_mask(_mm512_sub_ps(q, k), threshold, _CMP_GT_OQ);
  const __m512 steps = _mm512_mask_add_ps(k, up, k, _mm512_set1_ps(1.0f));
  const __m512i small = _mm512_or_si512(_mm512_castps_si512(_mm512_mul_ps(steps, _mm512_set1_ps(0x1p-24f))), sign);
  const __mmask16 below = _mm512_cmplt_epi32_mask(a, _mm512_set1_epi32(0x38800000));
  const __m512i r = _mm512_mask_blend_epi32(below, carry_round16(u, noise, 0x1FFFu), small);
  return _mm512_castsi512_ps(_mm512_mask_blend_epi32(is_nan16(a), r, u));
}

// remainder16 (math/remainder16.hpp), lane for lane its bits: 16 masters joined from their bf16
// parameters and int16 remainders (16-bit values in a __m256i), and split back into them.
inline __m256i u16_load16(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m256i u16_load16(const void* p, __mmask16 m) { return _mm512_castsi512_si256(_mm512_maskz_loadu_epi16(m, p)); }
inline __m512 join_remainder16(__m256i param, __m256i remainder) {
  return _mm512_castsi512_ps(
      _mm512_add_epi32(_mm512_slli_epi32(_mm512_cvtepu16_epi32(param), 16), _mm512_cvtepi16_epi32(remainder)));
}
/// The parameters' and remainders' bits, each in the low half of its 32-bit lane.
inline void split_remainder16(__m512 master, __m512i& param, __m512i& remainder) {
  const __m512i u = _mm512_castps_si512(master);
  const __mmask16 nan = is_nan16(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x8000)), 16);
  param = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040)));
  remainder = _mm512_maskz_sub_epi32(static_cast<__mmask16>(~nan), u, _mm512_slli_epi32(param, 16));
}
inline void u16_store16(void* p, __m512i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v)); }
inline void u16_store16(void* p, __m512i v, __mmask16 m) { _mm512_mask_cvtepi32_storeu_epi16(p, m, v); }

MPOPT_TARGET_END

MPOPT_TARGET_BEGIN(MPOPT_ISA_AVX2)

// 8 lanes. Partial variants take the first n lanes (0 <= n <= 8), never read or write past them,
// and give +0.0f in the other lanes.

inline __m256i first_lanes8(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const float* p, int n) { return _mm256_maskload_ps(p, first_lanes8(n)); }

// AVX2 has no 16-bit masked load/store, so partial 16-bit accesses go through a zeroed stack buffer.
inline __m128i load8_u16(const void* p, int n) {
  std::uint16_t tmp[8] = {};
  std::memcpy(tmp, p, static_cast<std::size_t>(n) * sizeof(std::uint16_t));
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(tmp));
}
inline void store8_u16(void* p, __m128i v, int n) {
  std::uint16_t tmp[8];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(tmp), v);
  std::memcpy(p, tmp, static_cast<std::size_t>(n) * sizeof(std::uint16_t));
}

inline __m256 load8(const half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256 load8(const half* p, int n) { return _mm256_cvtph_ps(load8_u16(p, n)); }

inline __m256 bf16_widen8(__m128i b) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16)); }
inline __m256 load8(const bfloat16* p) { return bf16_widen8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256 load8(const bfloat16* p, int n) { return bf16_widen8(load8_u16(p, n)); }

inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(float* p, __m256 v, int n) { _mm256_maskstore_ps(p, first_lanes8(n), v); }

inline __m128i half_narrow8(__m256 v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline void store8(half* p, __m256 v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), half_narrow8(v)); }
inline void store8(half* p, __m256 v, int n) { store8_u16(p, half_narrow8(v), n); }

// float_to_bfloat16_bits in integer ops (see bf16_round16), packed to 8 x u16.
inline __m128i bf16_narrow8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
  // Values are < 2^16, so the unsigned-saturating pack is exact; it packs per 128-bit lane, hence
  // the qword permute to bring lanes 0..3 and 4..7 together.
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), _MM_SHUFFLE(3, 1, 2, 0)));
}
inline void store8(bfloat16* p, __m256 v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bf16_narrow8(v)); }
inline void store8(bfloat16* p, __m256 v, int n) { store8_u16(p, bf16_narrow8(v), n); }

// Stochastic rounding, as the 16-lane forms above.

inline __m256i mix32_8(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int(0x7FEB352Du)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int(0x846CA68Bu)));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}
inline __m256i noise8(std::uint32_t key, std::uint32_t lo, std::uint32_t hi) {
  const __m256i i = _mm256_add_epi32(_mm256_set1_epi32(int(lo)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return mix32_8(_mm256_add_epi32(mix32_8(_mm256_xor_si256(i, _mm256_set1_epi32(int(key)))), _mm256_set1_epi32(int(hi))));
}
inline __m256i carry_round8(__m256i u, __m256i noise, std::uint32_t dropped) {
  const __m256i d = _mm256_set1_epi32(int(dropped));
  return _mm256_andnot_si256(d, _mm256_add_epi32(u, _mm256_and_si256(noise, d)));
}
inline __m256i is_nan8(__m256i a) { return _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000)); }
inline __m256 stochastic_bfloat16_8(__m256 v, __m256i noise) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i nan = is_nan8(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)));
  return _mm256_castsi256_ps(_mm256_blendv_epi8(carry_round8(u, noise, 0xFFFFu), u, nan));
}
inline __m256 stochastic_half8(__m256 v, __m256i noise) {
  const __m256i u = _mm256_castps_si256(v), a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i sign = _mm256_andnot_si256(a, u);
  const __m256i normal32 = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x007FFFFF));
  const __m256 q = _mm256_castsi256_ps(_mm256_and_si256(normal32, _mm256_add_epi32(a, _mm256_set1_epi32(0x0C000000))));
  const __m256 k = _mm256_cvtepi32_ps(_mm256_cvttps_epi32(q));
  const __m256 threshold = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(noise, 8)), _mm256_set1_ps(0x1p-24f));
  const __m256 up = _mm256_cmp_ps(_mm256_sub_ps(q, k), threshold, _CMP_GT_OQ);
  const __m256 steps = _mm256_add_ps(k, _mm256_and_ps(up, _mm256_set1_ps(1.0f)));
  const __m256i small = _mm256_or_si256(_mm256_castps_si256(_mm256_mul_ps(steps, _mm256_set1_ps(0x1p-24f))), sign);
  const __m256i below = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x38800000), a);
  const __m256i r = _mm256_blendv_epi8(carry_round8(u, noise, 0x1FFFu), small, below);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(r, u, is_nan8(a)));
}

// remainder16, as the 16-lane forms above; 16-bit values in a __m128i.
inline __m256 join_remainder8(__m128i param, __m128i remainder) {
  return _mm256_castsi256_ps(
      _mm256_add_epi32(_mm256_slli_epi32(_mm256_cvtepu16_epi32(param), 16), _mm256_cvtepi16_epi32(remainder)));
}
inline void split_remainder8(__m256 master, __m128i& param, __m128i& remainder) {
  const __m256i u = _mm256_castps_si256(master);
  const __m256i nan = is_nan8(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x8000)), 16);
  const __m256i p = _mm256_blendv_epi8(rounded, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040)), nan);
  const __m256i r = _mm256_andnot_si256(nan, _mm256_sub_epi32(u, _mm256_slli_epi32(p, 16)));
  // Both fit their 16 bits (p unsigned, r signed): the saturating packs are exact; they pack per
  // 128-bit lane, hence the qword permute.
  param = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(p, p), _MM_SHUFFLE(3, 1, 2, 0)));
  remainder = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packs_epi32(r, r), _MM_SHUFFLE(3, 1, 2, 0)));
}

MPOPT_TARGET_END

}  // namespace mpopt::detail::simd

MPOPT_INTRINSICS_END
#endif  // MPOPT_X86_SIMD
