// mpopt — blocks of quantized state (passes/block_state.hpp) coded and decoded sixteen or eight
// lanes at a time: codes of a map's values or of fp8 E4M3, stored as bytes or as nibbles (two a
// byte, the even lane low), and values read back through a table. Each lane gives
// blockwise_quantization.hpp's scalar result bit for bit (tests/quantization.cpp compares the SIMD
// levels). What is coded is a block's quotients x / s, never NaN (a block holding a NaN or an
// infinity has the scale NaN, and every quotient 0). Tables of up to 16 values (4-bit maps), and
// on AVX-512 all of them, are looked up in registers by permutes; AVX2 gathers from 8-bit tables
// (a gather is several times slower than a permute).
#pragma once

#include "../config.hpp"

#if MPOPT_X86_SIMD
#include <immintrin.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include "../math/blockwise_quantization.hpp"
#include "simd_convert.hpp"

MPOPT_INTRINSICS_BEGIN

namespace mpopt::detail::simd {

// bucket_of's index within its sign, ((e - low) << bits | top) + 1, is (|y|'s bits >> (23 - bits))
// - (low << bits) + 1: at most 0 below the lowest binade (then 0), clamped to the last bucket.
inline constexpr int bucket_offset = 1 - int(bucket_low_exponent << bucket_bits);
// E4M3 from y's bits (e4m3_code): a normal's code is (|y|'s bits >> 20) - (127 - 7) << 3, rounded
// to nearest even by adding 0x7FFFF and the kept bits' last bit before the shift.
inline constexpr int e4m3_rebias = (127 - 7) << 3;
inline constexpr int e4m3_least_normal = 0x3C800000;  // 2^-6
inline constexpr int e4m3_beyond = 0x43E00000;        // 448
inline constexpr std::uint32_t float_infinity = 0x7F800000;

MPOPT_TARGET_BEGIN(MPOPT_ISA_AVX512)

/// A table of E values (a power of 2, at most 256) in registers, looked up 16 lanes at a time: one
/// permute for up to 16 values, else a permute of each pair of registers and a blend by each higher
/// bit of the index.
template <int E>
struct register_table16 {
  static constexpr int registers = E <= 16 ? 1 : E / 16;
  __m512 r[registers];
  explicit register_table16(const float* p) {
    if constexpr (E < 16) r[0] = _mm512_maskz_loadu_ps(__mmask16((1u << E) - 1u), p);
    else
      for (int k = 0; k < registers; ++k) r[k] = _mm512_loadu_ps(p + 16 * k);
  }
  __m512 operator()(__m512i index) const {
    if constexpr (E <= 16) {
      return _mm512_permutexvar_ps(index, r[0]);
    } else {
      __m512 v[registers / 2];
      for (int k = 0; k < registers / 2; ++k) v[k] = _mm512_permutex2var_ps(r[2 * k], index, r[2 * k + 1]);
      for (int bit = 32, n = registers / 2; n > 1; bit *= 2, n /= 2) {
        const __mmask16 high = _mm512_test_epi32_mask(index, _mm512_set1_epi32(bit));
        for (int k = 0; k < n / 2; ++k) v[k] = _mm512_mask_blend_ps(high, v[2 * k], v[2 * k + 1]);
      }
      return v[0];
    }
  }
};

/// nearest_code of 16 lanes in a map of N values: its binary search, level l comparing each lane
/// with one of 2^l thresholds (quantization_map::search) held in registers.
template <std::size_t N>
class map_search16 {
  static constexpr int levels = std::bit_width(N) - 1;
  template <std::size_t... L>
  static auto tables_of(const float* search, std::index_sequence<L...>) {
    return std::tuple{register_table16<(1 << L)>(search + (std::size_t{1} << L) - 1)...};
  }
  decltype(tables_of(nullptr, std::make_index_sequence<levels>{})) tables;
  template <std::size_t L>
  __m512i step(__m512i c, __m512 y) const {
    const __m512 t = std::get<L>(tables)(_mm512_srli_epi32(c, levels - int(L)));
    return _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(t, y, _CMP_LE_OQ), c, _mm512_set1_epi32(int(N >> (L + 1))));
  }
  template <std::size_t... L>
  __m512i codes(__m512 y, std::index_sequence<L...>) const {
    __m512i c = _mm512_setzero_si512();
    ((c = step<L>(c, y)), ...);
    return c;
  }

 public:
  explicit map_search16(const quantization_map<N>& m) : tables(tables_of(m.search.data(), std::make_index_sequence<levels>{})) {}
  __m512i operator()(__m512 y) const { return codes(y, std::make_index_sequence<levels>{}); }
};

/// e4m3_code of 16 finite lanes.
inline __m512i e4m3_codes16(__m512 y) {
  const __m512i b = _mm512_castps_si512(y);
  const __m512i a = _mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1));
  const __m512i up = _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32(0x7FFFF)), lsb);
  __m512i r = _mm512_min_epi32(_mm512_sub_epi32(_mm512_srli_epi32(up, 20), _mm512_set1_epi32(e4m3_rebias)),
                               _mm512_set1_epi32(0x7E));
  // below 2^-6 a multiple of 2^-9: the conversion rounds to nearest even
  const __m512i small = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f)));
  r = _mm512_mask_mov_epi32(r, _mm512_cmplt_epi32_mask(a, _mm512_set1_epi32(e4m3_least_normal)), small);
  r = _mm512_mask_mov_epi32(r, _mm512_cmpge_epi32_mask(a, _mm512_set1_epi32(e4m3_beyond)), _mm512_set1_epi32(0x7E));
  return _mm512_or_si512(r, _mm512_and_si512(_mm512_srli_epi32(b, 24), _mm512_set1_epi32(0x80)));
}

/// The bytes that hold the codes of the lanes in m (a prefix), Bits each.
template <int Bits>
inline std::uint32_t code_byte_mask16(__mmask16 m) {
  if constexpr (Bits == 8) return m;
  else return (1u << ((std::popcount(unsigned(m)) + 1) / 2)) - 1u;
}

/// Sixteen codes, each below 2^Bits, stored from p: those of the lanes in m (a nibble past them 0).
template <int Bits>
inline void store_codes16(std::uint8_t* p, __m512i c, __mmask16 m) {
  if constexpr (Bits == 8) {
    _mm512_mask_cvtepi32_storeu_epi8(p, m, c);
  } else {
    c = _mm512_maskz_mov_epi32(m, c);
    const __m512i pairs = _mm512_or_si512(c, _mm512_srli_epi64(c, 28));  // lane 2j | lane 2j+1 << 4
    _mm512_mask_cvtepi64_storeu_epi8(p, __mmask8(code_byte_mask16<4>(m)), pairs);
  }
}

/// Sixteen codes of Bits each from p, of the lanes in m (the others 0).
template <int Bits>
inline __m512i load_codes16(const std::uint8_t* p, __mmask16 m) {
  const __m128i bytes = _mm512_castsi512_si128(_mm512_maskz_loadu_epi8(__mmask64(code_byte_mask16<Bits>(m)), p));
  if constexpr (Bits == 8) return _mm512_cvtepu8_epi32(bytes);
  const __m512i q = _mm512_cvtepu8_epi64(bytes);
  return _mm512_or_si512(_mm512_and_si512(q, _mm512_set1_epi64(0xF)), _mm512_slli_epi64(_mm512_srli_epi64(q, 4), 32));
}

/// The lanes of the n - j elements from j on, at most 16.
inline __mmask16 lanes_from16(std::size_t j, std::size_t n) {
  return n - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - j)) - 1u);
}

/// The largest magnitude of n values, or NaN if one is NaN or infinite (block_scale): the largest
/// of their bits without the sign, which order magnitudes as integers and put NaN and infinity last.
inline float largest_magnitude16(const float* x, std::size_t n) {
  __m512i m = _mm512_setzero_si512();
  for (std::size_t j = 0; j < n; j += 16) {
    const __m512i bits = _mm512_maskz_loadu_epi32(lanes_from16(j, n), x + j);
    m = _mm512_max_epu32(m, _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)));
  }
  const std::uint32_t largest = _mm512_reduce_max_epu32(m);
  return largest >= std::uint32_t(float_infinity) ? std::numeric_limits<float>::quiet_NaN() : std::bit_cast<float>(largest);
}

/// A block's n values from their codes (Bits each): values_of(codes) * scale.
template <int Bits, class Values>
inline void decode_block16(const Values& values_of, const std::uint8_t* codes, std::size_t n, float scale, float* out) {
  const __m512 s = _mm512_set1_ps(scale);
  for (std::size_t j = 0; j < n; j += 16) {
    const __mmask16 m = lanes_from16(j, n);
    _mm512_mask_storeu_ps(out + j, m, _mm512_mul_ps(values_of(load_codes16<Bits>(codes + j * Bits / 8, m)), s));
  }
}

/// A block's codes (Bits each) from its n values x and scale s: codes_of(x / s), of 0 where s is not
/// positive.
template <int Bits, class Codes>
inline void encode_block16(const float* x, std::size_t n, float s, const Codes& codes_of, std::uint8_t* codes) {
  for (std::size_t j = 0; j < n; j += 16) {
    const __mmask16 m = lanes_from16(j, n);
    const __m512 y = s > 0 ? _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + j), _mm512_set1_ps(s)) : _mm512_setzero_ps();
    store_codes16<Bits>(codes + j * Bits / 8, codes_of(y), m);
  }
}

MPOPT_TARGET_END

MPOPT_TARGET_BEGIN(MPOPT_ISA_AVX2)

inline __m256i bucket_of8(__m256 y) {
  const __m256i b = _mm256_castps_si256(y);
  const __m256i a = _mm256_and_si256(b, _mm256_set1_epi32(0x7FFFFFFF));
  __m256i i = _mm256_add_epi32(_mm256_srli_epi32(a, 23 - bucket_bits), _mm256_set1_epi32(bucket_offset));
  i = _mm256_min_epi32(_mm256_max_epi32(i, _mm256_setzero_si256()), _mm256_set1_epi32(int(buckets_per_sign - 1)));
  return _mm256_add_epi32(i, _mm256_and_si256(_mm256_srai_epi32(b, 31), _mm256_set1_epi32(int(buckets_per_sign))));
}

/// A table of E values (at most 16) in registers, looked up 8 lanes at a time: a permute of each
/// register, and a blend by the index's bit 3 for more than 8 values.
template <int E>
struct register_table8 {
  static_assert(E <= 16, "eight lanes keep tables of at most 16 values in registers");
  __m256 low, high;
  explicit register_table8(const float* p)
      : low(_mm256_maskload_ps(p, first_lanes8(E < 8 ? E : 8))),
        high(E > 8 ? _mm256_loadu_ps(p + 8) : _mm256_setzero_ps()) {}
  __m256 operator()(__m256i index) const {
    const __m256 v = _mm256_permutevar8x32_ps(low, index);
    if constexpr (E <= 8) return v;
    else return _mm256_blendv_ps(v, _mm256_permutevar8x32_ps(high, index), _mm256_castsi256_ps(_mm256_slli_epi32(index, 28)));
  }
};

/// table[code] of 8 lanes, gathered: for tables too large for registers.
struct table_gather8 {
  const float* table;
  __m256 operator()(__m256i index) const { return _mm256_i32gather_ps(table, index, 4); }
};

/// As map_search16, eight lanes, for maps of at most 16 values (each level's thresholds in one
/// register).
template <std::size_t N>
struct map_search8 {
  static_assert(N <= 16, "eight lanes search maps of at most 16 values in registers");
  static constexpr int levels = std::bit_width(N) - 1;
  __m256 tables[levels];
  explicit map_search8(const quantization_map<N>& m) {
    for (int l = 0; l < levels; ++l) tables[l] = _mm256_maskload_ps(m.search.data() + (1 << l) - 1, first_lanes8(1 << l));
  }
  __m256i operator()(__m256 y) const {
    __m256i c = _mm256_setzero_si256();
    for (int l = 0; l < levels; ++l) {
      const __m256 t = _mm256_permutevar8x32_ps(tables[l], _mm256_srli_epi32(c, levels - l));
      const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(t, y, _CMP_LE_OQ));
      c = _mm256_add_epi32(c, _mm256_and_si256(up, _mm256_set1_epi32(int(N >> (l + 1)))));
    }
    return c;
  }
};

/// bucket_code of 8 lanes in a map of N values: the bucket's code (bytes read four at a time:
/// quantization_map keeps spare bytes after its table), one more where y reaches the next
/// threshold.
template <std::size_t N>
struct map_buckets8 {
  const quantization_map<N>& m;
  __m256i operator()(__m256 y) const {
    const auto* buckets = reinterpret_cast<const int*>(m.bucket_codes.data());
    __m256i c = _mm256_and_si256(_mm256_i32gather_epi32(buckets, bucket_of8(y), 1), _mm256_set1_epi32(0xFF));
    const __m256i below_last = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(N - 1)), c);
    const __m256 t = _mm256_mask_i32gather_ps(_mm256_setzero_ps(), m.thresholds.data(), c, _mm256_castsi256_ps(below_last), 4);
    const __m256i up = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(t, y, _CMP_LE_OQ)), below_last);
    return _mm256_sub_epi32(c, up);  // up is -1 where it holds
  }
};

/// e4m3_code of 8 finite lanes.
inline __m256i e4m3_codes8(__m256 y) {
  const __m256i b = _mm256_castps_si256(y);
  const __m256i a = _mm256_and_si256(b, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
  const __m256i up = _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(0x7FFFF)), lsb);
  __m256i r = _mm256_min_epi32(_mm256_sub_epi32(_mm256_srli_epi32(up, 20), _mm256_set1_epi32(e4m3_rebias)),
                               _mm256_set1_epi32(0x7E));
  const __m256i small = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0f)));
  r = _mm256_blendv_epi8(r, small, _mm256_cmpgt_epi32(_mm256_set1_epi32(e4m3_least_normal), a));
  r = _mm256_blendv_epi8(_mm256_set1_epi32(0x7E), r, _mm256_cmpgt_epi32(_mm256_set1_epi32(e4m3_beyond), a));
  return _mm256_or_si256(r, _mm256_and_si256(_mm256_srli_epi32(b, 24), _mm256_set1_epi32(0x80)));
}

/// The bytes of n codes of Bits each (n in 1..8).
template <int Bits>
inline int code_bytes8(int n) {
  return Bits == 8 ? n : (n + 1) / 2;
}

/// Eight codes, each below 2^Bits, stored from p: those of the first n lanes (a nibble past them 0).
template <int Bits>
inline void store_codes8(std::uint8_t* p, __m256i c, int n) {
  const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
  __m128i bytes;
  if constexpr (Bits == 8) {
    bytes = _mm_packus_epi16(words, words);
  } else {
    const __m128i kept = _mm_and_si128(words, _mm_cmpgt_epi16(_mm_set1_epi16(short(n)), _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7)));
    const __m128i pairs = _mm_and_si128(_mm_or_si128(kept, _mm_srli_epi32(kept, 12)), _mm_set1_epi32(0xFF));
    const __m128i packed = _mm_packus_epi32(pairs, pairs);
    bytes = _mm_packus_epi16(packed, packed);
  }
  if (n == 8) {
    if constexpr (Bits == 8) _mm_storel_epi64(reinterpret_cast<__m128i*>(p), bytes);
    else _mm_storeu_si32(p, bytes);
  } else {
    alignas(16) std::uint8_t b[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(b), bytes);
    std::memcpy(p, b, std::size_t(code_bytes8<Bits>(n)));
  }
}

/// The lanes of the n - j elements from j on, at most 8.
inline int lanes_from8(std::size_t j, std::size_t n) { return n - j >= 8 ? 8 : int(n - j); }

/// As largest_magnitude16, eight lanes.
inline float largest_magnitude8(const float* x, std::size_t n) {
  __m256i m = _mm256_setzero_si256();
  for (std::size_t j = 0; j < n; j += 8) {
    const __m256i lanes = first_lanes8(lanes_from8(j, n));
    m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_maskload_epi32(reinterpret_cast<const int*>(x + j), lanes),
                                             _mm256_set1_epi32(0x7FFFFFFF)));
  }
  alignas(32) std::uint32_t lane[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lane), m);
  std::uint32_t largest = 0;
  for (std::uint32_t v : lane) largest = v > largest ? v : largest;
  return largest >= std::uint32_t(float_infinity) ? std::numeric_limits<float>::quiet_NaN() : std::bit_cast<float>(largest);
}

/// Eight codes of Bits each from p, of the first n lanes (the others 0).
template <int Bits>
inline __m256i load_codes8(const std::uint8_t* p, int n) {
  __m128i bytes;
  if (n == 8) {
    bytes = Bits == 8 ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)) : _mm_loadu_si32(p);
  } else {
    std::uint64_t b = 0;
    std::memcpy(&b, p, std::size_t(code_bytes8<Bits>(n)));
    bytes = _mm_cvtsi64_si128(static_cast<long long>(b));
  }
  if constexpr (Bits == 8) return _mm256_cvtepu8_epi32(bytes);
  const __m256i q = _mm256_cvtepu8_epi64(bytes);
  return _mm256_or_si256(_mm256_and_si256(q, _mm256_set1_epi64x(0xF)), _mm256_slli_epi64(_mm256_srli_epi64(q, 4), 32));
}

/// As decode_block16, eight lanes: values_of(codes) * scale.
template <int Bits, class Values>
inline void decode_block8(const Values& values_of, const std::uint8_t* codes, std::size_t n, float scale, float* out) {
  const __m256 s = _mm256_set1_ps(scale);
  for (std::size_t j = 0; j < n; j += 8) {
    const int lanes = lanes_from8(j, n);
    const __m256 v = _mm256_mul_ps(values_of(load_codes8<Bits>(codes + j * Bits / 8, lanes)), s);
    _mm256_maskstore_ps(out + j, first_lanes8(lanes), v);
  }
}

/// As encode_block16, eight lanes.
template <int Bits, class Codes>
inline void encode_block8(const float* x, std::size_t n, float s, const Codes& codes_of, std::uint8_t* codes) {
  for (std::size_t j = 0; j < n; j += 8) {
    const int lanes = lanes_from8(j, n);
    const __m256 y = s > 0 ? _mm256_div_ps(_mm256_maskload_ps(x + j, first_lanes8(lanes)), _mm256_set1_ps(s))
                           : _mm256_setzero_ps();
    store_codes8<Bits>(codes + j * Bits / 8, codes_of(y), lanes);
  }
}

MPOPT_TARGET_END

}  // namespace mpopt::detail::simd

MPOPT_INTRINSICS_END
#endif  // MPOPT_X86_SIMD
