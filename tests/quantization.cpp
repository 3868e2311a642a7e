// Blockwise quantization of optimizer state (detail/math/blockwise_quantization.hpp) against a
// float64 reference written from the definitions: each map built as bitsandbytes' procedure reads
// (means of a linspace, decade by decade) or torchao's 4-bit values, and each code found by an
// exhaustive search for the nearest value, an exact tie taking the larger. Inputs: every map value,
// the floats on either side of every midpoint, 0 and -0, subnormals, +-1, random values of every
// magnitude; blocks of 0, 1 and odd sizes, all zero, holding a NaN or an infinity. fp8 E4M3FN: every
// code's value from its fields, and every float's nearest code (ties to even) by exhaustive search.
// The vector lanes (AVX2, AVX-512) code and decode whole blocks as the scalar formulas do, bit for
// bit, on the same inputs and every size up to a block.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <type_traits>
#include <vector>

#include <doctest/doctest.h>

#include <mpopt/detail/math/blockwise_quantization.hpp>
#include <mpopt/detail/passes/block_state.hpp>
#include <mpopt/host_passes.hpp>
#include <mpopt/simd.hpp>

#include "quantization_reference.hpp"

using quantization_reference::reference_dynamic_map;
using quantization_reference::reference_e4m3;
using quantization_reference::reference_e4m3_code;

namespace {

using mpopt::detail::quantization_map;

/// Whether a and b are the same float or neighbours.
bool within_one_ulp(float a, double b) {
  const auto f = static_cast<float>(b);
  return a == f || std::nextafter(a, f) == f;
}

/// The index of the value nearest y, an exact tie taking the larger.
template <std::size_t N>
std::uint32_t reference_code(const quantization_map<N>& m, float y) {
  std::uint32_t best = 0;
  for (std::uint32_t k = 1; k < N; ++k) {
    const double d = std::fabs(double(y) - m.values[k]), best_d = std::fabs(double(y) - m.values[best]);
    if (d <= best_d) best = k;
  }
  return best;
}

/// The inputs that decide a map's codes: every value, the floats beside every exact midpoint (and the
/// midpoint itself where it is a float), the extremes, and random values of every magnitude.
template <std::size_t N>
std::vector<float> probes(const quantization_map<N>& m) {
  std::vector<float> y = {0.0f, -0.0f, 1.0f, -1.0f, std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                          -std::numeric_limits<float>::min(), 1e-30f, -1e-30f};
  for (std::size_t k = 0; k < N; ++k) y.push_back(m.values[k]);
  for (std::size_t k = 0; k + 1 < N; ++k) {
    const double mid = (double(m.values[k]) + m.values[k + 1]) / 2;
    const auto f = static_cast<float>(mid);
    for (float g : {f, std::nextafter(f, -2.0f), std::nextafter(f, 2.0f)}) y.push_back(g);
  }
  std::mt19937_64 rng(45);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-30.0f, 0.0f);
  for (int i = 0; i < 20000; ++i) {
    y.push_back(unit(rng));
    y.push_back(std::copysign(std::pow(10.0f, exponent(rng)), unit(rng)));
  }
  return y;
}

template <std::size_t N>
void check_codes(const quantization_map<N>& m) {
  for (std::uint32_t k = 0; k < N; ++k) REQUIRE(mpopt::detail::nearest_code(m, m.values[k]) == k);
  for (float y : probes(m)) {
    CAPTURE(y);
    REQUIRE(mpopt::detail::nearest_code(m, y) == reference_code(m, y));
  }
}

/// Quantizes a block as the definition reads, in double where it can, and checks each element's
/// code and decoded value.
template <std::size_t N>
void check_block(const quantization_map<N>& m, std::span<const float> x) {
  double largest = 0;
  for (float e : x) largest = std::max(largest, std::fabs(double(e)));
  const float s = mpopt::detail::block_scale(x.data(), x.size());
  REQUIRE(double(s) == largest);
  for (float e : x) {
    const float y = s > 0 ? e / s : 0.0f;
    const auto code = mpopt::detail::encode(m, e, s);
    REQUIRE(code == reference_code(m, y));
    REQUIRE(mpopt::detail::decode(m, code, s) == m.values[reference_code(m, y)] * s);
  }
}

}  // namespace

TEST_CASE("the 8-bit dynamic maps are bitsandbytes' dynamic data type") {
  for (bool is_signed : {true, false}) {
    CAPTURE(is_signed);
    const auto& m = is_signed ? mpopt::detail::map8<true> : mpopt::detail::map8<false>;
    const auto ref = reference_dynamic_map(is_signed, 8);
    REQUIRE(ref.size() == 256);
    for (std::size_t k = 0; k < 256; ++k) {
      CAPTURE(k);
      CHECK(within_one_ulp(m.values[k], ref[k]));
      if (k > 0) CHECK(m.values[k - 1] < m.values[k]);
    }
    CHECK(m.values[255] == 1.0f);
    CHECK(std::count(m.values.begin(), m.values.end(), 0.0f) == 1);
    CHECK(std::count_if(m.values.begin(), m.values.end(), [](float v) { return v < 0; }) == (is_signed ? 127 : 0));
  }
  // The smallest magnitudes: the first decade (10^-6) holds one mean (signed) or two (unsigned).
  CHECK(within_one_ulp(mpopt::detail::map8<true>.values[128], 0.55e-6));
  CHECK(within_one_ulp(mpopt::detail::map8<false>.values[1], 0.325e-6));
  CHECK(within_one_ulp(mpopt::detail::map8<true>.values[0], -(0.1 + 0.9 * 63.5 / 64)));
}

TEST_CASE("the 4-bit maps are torchao's: dynamic signed, and k/16 without 0") {
  // torchao.optim.subclass_4bit: create_dynamic_map(True, 3, 4), worked out by hand.
  const double signed4[16] = {-0.8875, -0.6625, -0.4375, -0.2125, -0.0775, -0.0325, -0.0055, 0,
                              0.0055,  0.0325,  0.0775,  0.2125,  0.4375,  0.6625,  0.8875,  1};
  for (std::size_t k = 0; k < 16; ++k) {
    CAPTURE(k);
    CHECK(within_one_ulp(mpopt::detail::map4<true>.values[k], signed4[k]));
    CHECK(mpopt::detail::map4<false>.values[k] == float(k + 1) / 16);
  }
  const auto ref = reference_dynamic_map(true, 4);
  for (std::size_t k = 0; k < 16; ++k) CHECK(within_one_ulp(mpopt::detail::map4<true>.values[k], ref[k]));
}

TEST_CASE("a code is the nearest map value, an exact tie taking the larger") {
  check_codes(mpopt::detail::map8<true>);
  check_codes(mpopt::detail::map8<false>);
  check_codes(mpopt::detail::map4<true>);
  check_codes(mpopt::detail::map4<false>);
  // An exact midpoint that is a float: 0.5 and 0.5625 are neighbours in the linear map; 0.53125 ties.
  CHECK(mpopt::detail::nearest_code(mpopt::detail::map4<false>, 0.53125f) == 8);
  CHECK(mpopt::detail::nearest_code(mpopt::detail::map4<false>, std::nextafter(0.53125f, 0.0f)) == 7);
}

namespace {

/// Every bucket of m holds at most one threshold (so bucket_code is exact), and bucket_code agrees
/// with nearest_code at both ends of every bucket and on the probes.
template <std::size_t N>
void check_buckets(const quantization_map<N>& m) {
  using namespace mpopt::detail;
  for (std::size_t i = 0; i < 2 * buckets_per_sign; ++i) {
    CAPTURE(i);
    const auto [least, greatest] = bucket_ends(i);
    REQUIRE(least <= greatest);
    REQUIRE(bucket_of(least) == i);
    REQUIRE(bucket_of(greatest) == i);
    REQUIRE(nearest_code(m, greatest) - nearest_code(m, least) <= 1);
    REQUIRE(bucket_code(m, least) == nearest_code(m, least));
    REQUIRE(bucket_code(m, greatest) == nearest_code(m, greatest));
  }
  // Consecutive buckets meet: every float of [-1, 1] has one.
  for (std::size_t i = 1; i < buckets_per_sign; ++i) {
    CHECK(std::nextafter(bucket_ends(i - 1).second, 2.0f) == bucket_ends(i).first);
    CHECK(std::nextafter(bucket_ends(buckets_per_sign + i - 1).first, -2.0f) == bucket_ends(buckets_per_sign + i).second);
  }
  for (float y : probes(m)) {
    CAPTURE(y);
    REQUIRE(bucket_code(m, y) == nearest_code(m, y));
  }
  CHECK(bucket_code(m, std::numeric_limits<float>::quiet_NaN()) == nearest_code(m, std::numeric_limits<float>::quiet_NaN()));
}

}  // namespace

TEST_CASE("a code by bucket, one lookup and one comparison, is the nearest code") {
  check_buckets(mpopt::detail::map8<true>);
  check_buckets(mpopt::detail::map8<false>);
  check_buckets(mpopt::detail::map4<true>);
  check_buckets(mpopt::detail::map4<false>);
}

TEST_CASE("blocks: the scale is the largest magnitude, every element the nearest code") {
  std::mt19937_64 rng(256);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-12.0f, 4.0f);
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(2), std::size_t(3), std::size_t(127),
                        std::size_t(128), std::size_t(255), std::size_t(256)}) {
    CAPTURE(n);
    std::vector<float> x(n);
    for (auto& e : x) e = normal(rng) * std::pow(10.0f, exponent(rng));
    std::vector<float> v(n);  // a second moment: never negative
    for (std::size_t i = 0; i < n; ++i) v[i] = x[i] * x[i];
    check_block(mpopt::detail::map8<true>, x);
    check_block(mpopt::detail::map4<true>, x);
    check_block(mpopt::detail::map8<false>, v);
    check_block(mpopt::detail::map4<false>, v);
  }
  // The element at the block's maximum decodes exactly; its negative to the signed map's least.
  const std::vector<float> x = {0.25f, -3.0f, 3.0f, 1e-7f};
  const float s = mpopt::detail::block_scale(x.data(), x.size());
  const auto& m = mpopt::detail::map8<true>;
  CHECK(mpopt::detail::decode(m, mpopt::detail::encode(m, 3.0f, s), s) == 3.0f);
  CHECK(mpopt::detail::decode(m, mpopt::detail::encode(m, -3.0f, s), s) == m.values[0] * 3.0f);
  // Subnormal blocks: the scale is subnormal, the quotients are not.
  const std::vector<float> tiny = {std::numeric_limits<float>::denorm_min() * 3, -std::numeric_limits<float>::min() / 4,
                                   std::numeric_limits<float>::min() / 8};
  check_block(mpopt::detail::map8<true>, tiny);
  check_block(mpopt::detail::map4<true>, tiny);
}

TEST_CASE("blocks: all zero decodes to zero; a NaN or an infinity makes the whole block NaN") {
  const std::vector<float> zeros(7, 0.0f);
  const float s0 = mpopt::detail::block_scale(zeros.data(), zeros.size());
  CHECK(s0 == 0.0f);
  for (float e : zeros) {
    CHECK(mpopt::detail::decode(mpopt::detail::map8<true>, mpopt::detail::encode(mpopt::detail::map8<true>, e, s0), s0) == 0.0f);
    // The linear map has no 0: its least value times a zero scale.
    CHECK(mpopt::detail::decode(mpopt::detail::map4<false>, mpopt::detail::encode(mpopt::detail::map4<false>, e, s0), s0) == 0.0f);
  }
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    CAPTURE(bad);
    const std::vector<float> x = {1.0f, bad, -2.0f};
    const float s = mpopt::detail::block_scale(x.data(), x.size());
    CHECK(std::isnan(s));
    for (float e : x)
      CHECK(std::isnan(mpopt::detail::decode(mpopt::detail::map8<true>, mpopt::detail::encode(mpopt::detail::map8<true>, e, s), s)));
  }
}

TEST_CASE("fp8 E4M3: every code's value, and each float's nearest code with ties to even") {
  for (int c = 0; c < 256; ++c) {
    CAPTURE(c);
    const double ref = reference_e4m3(std::uint8_t(c));
    const float v = mpopt::detail::e4m3_value(std::uint8_t(c));
    if (std::isnan(ref)) {
      CHECK(std::isnan(v));
      continue;
    }
    CHECK(double(v) == ref);
    CHECK(std::signbit(v) == bool(c & 0x80));
    CHECK(mpopt::detail::e4m3_code(v) == c);  // every finite code round-trips, -0 included
  }
  CHECK(mpopt::detail::e4m3_value(0x7E) == mpopt::detail::e4m3_max);
  CHECK(mpopt::detail::e4m3_value(0x08) == std::ldexp(1.0f, -6));
  CHECK(mpopt::detail::e4m3_value(0x01) == std::ldexp(1.0f, -9));
  CHECK(mpopt::detail::e4m3_value(0x38) == 1.0f);

  std::vector<float> y = {0.0f, -0.0f, 448.0f, 464.0f, 480.0f, 1e6f, -1e30f, std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min()};
  for (int c = 0; c < 0x7E; ++c) {  // beside every midpoint between neighbouring codes, both signs
    const float mid = float((reference_e4m3(std::uint8_t(c)) + reference_e4m3(std::uint8_t(c + 1))) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      y.push_back(f);
      y.push_back(-f);
    }
  }
  std::mt19937_64 rng(8);
  std::uniform_real_distribution<float> exponent(-14.0f, 9.5f), sign(-1.0f, 1.0f);
  for (int i = 0; i < 20000; ++i) y.push_back(std::copysign(std::exp2(exponent(rng)), sign(rng)));
  for (float f : y) {
    CAPTURE(f);
    const auto code = mpopt::detail::e4m3_code(f);
    if (std::isnan(f)) CHECK((code & 0x7F) == 0x7F);
    else CHECK(code == reference_e4m3_code(f));
  }
}

TEST_CASE("fp8 blocks: the scale is the largest magnitude over 448") {
  std::mt19937_64 rng(448);
  std::normal_distribution<float> normal;
  for (std::size_t n : {std::size_t(1), std::size_t(3), std::size_t(255), std::size_t(256)}) {
    CAPTURE(n);
    std::vector<float> x(n);
    for (auto& e : x) e = normal(rng) * 1e-3f;
    const float s = mpopt::detail::block_scale(x.data(), n) / mpopt::detail::e4m3_max;
    float largest = 0;
    for (float e : x) largest = std::max(largest, std::fabs(e));
    CHECK(s == largest / 448.0f);
    for (float e : x) {
      const auto code = mpopt::detail::e4m3_code(e / s);
      CHECK(code == reference_e4m3_code(e / s));
      // Within half a step of E4M3's 3 mantissa bits (relative 1/16), or of its subnormal spacing.
      CHECK(std::fabs(double(mpopt::detail::e4m3_value(code)) * s - e) <=
            std::max(std::fabs(double(e)) / 16, std::ldexp(double(s), -10)) * (1 + 1e-6));
    }
  }
}

namespace {

/// A block coded and decoded by one lane type: its codes (and a byte past them that must keep its
/// value), its scale, and its values decoded (and a value past them, likewise).
struct coded_block {
  std::vector<std::uint8_t> codes;
  float scale = 0;
  std::vector<float> decoded;
};

constexpr std::uint8_t untouched_byte = 0xA5;
constexpr float untouched_value = 1234.5f;

template <class S, class L>
void code_and_decode(const float* x, std::size_t n, bool nonnegative, std::uint8_t* codes, float* scale, float* decoded) {
  mpopt::detail::quantize_block<S, L>(x, n, nonnegative, codes, scale);
  mpopt::detail::dequantize_block<S, L>(codes, n, *scale, nonnegative, decoded);
}

#if MPOPT_X86_SIMD
template <class S>
MPOPT_TARGET_ENTRY(MPOPT_ISA_AVX512)
void code_and_decode_avx512(const float* x, std::size_t n, bool nonnegative, std::uint8_t* codes, float* scale, float* decoded) {
  code_and_decode<S, mpopt::detail::avx512_lanes>(x, n, nonnegative, codes, scale, decoded);
}
template <class S>
MPOPT_TARGET_ENTRY(MPOPT_ISA_AVX2)
void code_and_decode_avx2(const float* x, std::size_t n, bool nonnegative, std::uint8_t* codes, float* scale, float* decoded) {
  code_and_decode<S, mpopt::detail::avx2_lanes>(x, n, nonnegative, codes, scale, decoded);
}
#endif

/// Block x coded and decoded at SIMD level `level`.
template <class S>
coded_block code_block(const std::vector<float>& x, bool nonnegative, [[maybe_unused]] mpopt::simd_level level) {
  auto run = code_and_decode<S, mpopt::detail::scalar_lanes>;
#if MPOPT_X86_SIMD
  if (level == mpopt::simd_level::avx512) run = code_and_decode_avx512<S>;
  if (level == mpopt::simd_level::avx2) run = code_and_decode_avx2<S>;
#endif
  coded_block b;
  b.codes.assign(mpopt::detail::code_bytes<S>(x.size()) + 1, untouched_byte);
  b.decoded.assign(x.size() + 1, untouched_value);
  run(x.data(), x.size(), nonnegative, b.codes.data(), &b.scale, b.decoded.data());
  return b;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// The blocks of every size up to S::block from a pool of inputs: each map's thresholds and their
/// neighbours under a scale of 1 (or 448 for fp8: the quotients are the inputs themselves), values of
/// every magnitude, zeros and subnormals, and blocks holding a NaN or an infinity.
template <class S>
std::vector<std::vector<float>> test_blocks(bool nonnegative) {
  std::vector<float> pool;
  if constexpr (std::is_same_v<S, mpopt::fp8_state>) {
    for (int c = 0; c < 0x7F; ++c) {
      const float v = mpopt::detail::e4m3_value(std::uint8_t(c)), next = mpopt::detail::e4m3_value(std::uint8_t(c + 1));
      const auto mid = static_cast<float>((double(v) + next) / 2);
      for (float y : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
        pool.push_back(y);
        pool.push_back(-y);
      }
    }
  } else {
    const auto& m = nonnegative ? mpopt::detail::storage_map<S, false>() : mpopt::detail::storage_map<S, true>();
    pool = probes(m);
    pool.resize(std::min<std::size_t>(pool.size(), 4000));
  }
  pool.push_back(std::numeric_limits<float>::denorm_min());
  pool.push_back(-0.0f);
  if (nonnegative)
    for (auto& y : pool) y = std::fabs(y);
  const float top = std::is_same_v<S, mpopt::fp8_state> ? mpopt::detail::e4m3_max : 1.0f;
  std::mt19937_64 rng(S::bits * 2 + nonnegative);
  std::uniform_int_distribution<std::size_t> pick(0, pool.size() - 1);
  std::vector<std::vector<float>> blocks;
  for (std::size_t n = 1; n <= S::block; ++n) {
    std::vector<float> x(n);
    for (auto& y : x) y = pool[pick(rng)];
    x[pick(rng) % n] = top;  // the scale is 1: each quotient is the input
    blocks.push_back(x);
  }
  blocks.push_back(std::vector<float>(S::block - 3, 0.0f));
  std::vector<float> tiny(37, std::numeric_limits<float>::denorm_min() * 5);
  tiny[4] = std::numeric_limits<float>::min();
  blocks.push_back(tiny);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> x(S::block / 2 + 1, 0.25f);
    x[7] = bad;
    blocks.push_back(x);
  }
  return blocks;
}

template <class S>
void check_lanes_code_as_scalar() {
  for (bool nonnegative : {false, true}) {
    for (const auto& x : test_blocks<S>(nonnegative)) {
      CAPTURE(nonnegative);
      CAPTURE(x.size());
      const coded_block scalar = code_block<S>(x, nonnegative, mpopt::simd_level::scalar);
      REQUIRE(scalar.codes.back() == untouched_byte);
      REQUIRE(std::memcmp(&scalar.decoded.back(), &untouched_value, sizeof(float)) == 0);
      for (const auto level : {mpopt::simd_level::avx2, mpopt::simd_level::avx512}) {
        if (!MPOPT_X86_SIMD || !mpopt::cpu_supports(level)) continue;
        CAPTURE(mpopt::to_string(level));
        const coded_block vector = code_block<S>(x, nonnegative, level);
        REQUIRE(vector.codes == scalar.codes);
        REQUIRE(std::memcmp(&vector.scale, &scalar.scale, sizeof(float)) == 0);
        REQUIRE(same_bits(vector.decoded, scalar.decoded));
      }
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("every SIMD level codes and decodes a block of any size as the scalar formulas do, bit for bit",
                   S, mpopt::blockwise8_state, mpopt::blockwise4_state, mpopt::fp8_state) {
  check_lanes_code_as_scalar<S>();
}
