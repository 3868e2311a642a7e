// Tests for mpopt/numeric.hpp and mpopt/detail/lanes/float_bits.hpp: the 16-bit storage types and their
// scalar conversions, checked against references written here from the format definitions
// (ldexp decoding, nearest-value search over all representable values), not the library's bit tricks.
#include <doctest/doctest.h>

#include <mpopt/numeric.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

using mpopt::bfloat16;
using mpopt::half;
using namespace mpopt::detail;

namespace {

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }
float float_of(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint64_t bits_of(double d) { return std::bit_cast<std::uint64_t>(d); }

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// Counts failures and keeps the first few messages, so millions of comparisons cost one assertion.
struct mismatches {
  std::size_t count = 0;
  std::string first;
  void add(const std::string& what) {
    if (count++ < 5) first += what + "\n";
  }
};

// Decoders written from the format definitions: (-1)^s * m * 2^e, via ldexp.
double decode_half(std::uint16_t h) {
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  double mag = 0;
  if (e == 0) {
    mag = std::ldexp(m, -24);  // subnormal: 0.m * 2^-14
  } else if (e == 31) {
    mag = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else {
    mag = std::ldexp(1024 + m, e - 25);  // 1.m * 2^(e-15)
  }
  return (h & 0x8000) ? -mag : mag;
}

double decode_bf16(std::uint16_t b) {
  const int e = (b >> 7) & 0xFF;
  const int m = b & 0x7F;
  double mag = 0;
  if (e == 0) {
    mag = std::ldexp(m, -133);  // subnormal: 0.m * 2^-126
  } else if (e == 255) {
    mag = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else {
    mag = std::ldexp(128 + m, e - 134);  // 1.m * 2^(e-127)
  }
  return (b & 0x8000) ? -mag : mag;
}

// Round to nearest, ties to even, by searching all non-negative finite values of a format
// (IEEE 754-2019 §4.3.1 roundTiesToEven with unbounded exponent: the value past max is the next
// power of two, and anything rounding to it overflows to infinity).
class nearest_table {
 public:
  nearest_table(double (*decode)(std::uint16_t), std::uint16_t inf_bits, double beyond_max) : inf_bits_(inf_bits) {
    for (unsigned b = 0; b < inf_bits; ++b) values_.push_back(decode(static_cast<std::uint16_t>(b)));
    values_.push_back(beyond_max);  // stands at index inf_bits
  }
  const std::vector<double>& values() const { return values_; }

  // Bits of the nearest value to x, for finite x >= 0.
  std::uint16_t round(double x) const {
    if (x >= values_.back()) return inf_bits_;
    const auto hi = static_cast<std::size_t>(std::upper_bound(values_.begin(), values_.end(), x) - values_.begin());
    const std::size_t lo = hi - 1;  // values_[0] == 0 <= x
    return pick(x, lo);
  }
  // Nearest of values_[lo] <= x < values_[lo + 1].
  std::uint16_t pick(double x, std::size_t lo) const {
    const double mid = (values_[lo] + values_[lo + 1]) / 2;  // exact: the values have few bits
    std::size_t r = 0;
    if (x < mid) {
      r = lo;
    } else if (x > mid) {
      r = lo + 1;
    } else {
      r = lo % 2 == 0 ? lo : lo + 1;  // the encoding's last bit is the mantissa's last bit
    }
    return static_cast<std::uint16_t>(r);
  }

 private:
  std::vector<double> values_;
  std::uint16_t inf_bits_;
};

const nearest_table& half_table() {
  static const nearest_table t(decode_half, 0x7C00, 65536.0);
  return t;
}
const nearest_table& bf16_table() {
  static const nearest_table t(decode_bf16, 0x7F80, std::ldexp(1.0, 128));
  return t;
}

// Reference results. NaN rules are the specification (x86 F16C for half), not derived.
std::uint16_t ref_half(double x, std::uint16_t nan_payload) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return static_cast<std::uint16_t>(sign | 0x7E00 | nan_payload);
  return static_cast<std::uint16_t>(sign | half_table().round(std::fabs(x)));
}
std::uint16_t ref_half(float f) { return ref_half(f, static_cast<std::uint16_t>((bits_of(f) >> 13) & 0x3FF)); }
std::uint16_t ref_half(double d) { return ref_half(d, static_cast<std::uint16_t>((bits_of(d) >> 42) & 0x3FF)); }

std::uint16_t ref_bf16(double x, std::uint16_t nan_payload) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return static_cast<std::uint16_t>(sign | 0x7FC0 | nan_payload);
  return static_cast<std::uint16_t>(sign | bf16_table().round(std::fabs(x)));
}
std::uint16_t ref_bf16(float f) { return ref_bf16(f, static_cast<std::uint16_t>((bits_of(f) >> 16) & 0x7F)); }
std::uint16_t ref_bf16(double d) { return ref_bf16(d, static_cast<std::uint16_t>((bits_of(d) >> 45) & 0x7F)); }

constexpr std::size_t batch = std::size_t{1} << 22;  // 4,194,304

std::vector<float> uniform_floats(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(batch);
  for (auto& f : v) f = float_of(static_cast<std::uint32_t>(rng()));
  return v;
}

// Edges named in the spec plus, for random finite halves, the values themselves, the midpoints to
// the next value (ties) and their neighbours a few float ulps away, or a random float in between.
std::vector<float> half_boundary_floats(std::uint64_t seed) {
  std::vector<float> v = {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, std::nextafter(65520.0f, 0.0f),
                          65536.0f, std::ldexp(1.0f, -14), std::ldexp(1.0f, -24), std::ldexp(1.0f, -25),
                          std::nextafter(std::ldexp(1.0f, -25), 1.0f), std::ldexp(3.0f, -26),
                          std::ldexp(1023.5f, -24), std::nextafter(std::ldexp(1023.5f, -24), 0.0f),
                          std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::min(), std::numeric_limits<float>::infinity()};
  std::mt19937_64 rng(seed);
  while (v.size() < batch) {
    const auto h = static_cast<std::uint16_t>(rng() % 0x7C00);
    const double lo = decode_half(h);
    const double hi = h == 0x7BFF ? 65536.0 : decode_half(static_cast<std::uint16_t>(h + 1));
    std::uint32_t u = 0;
    switch (rng() % 4) {
      case 0:
        u = bits_of(static_cast<float>(lo)) + static_cast<std::uint32_t>(rng() % 5);
        break;
      case 1:
      case 2:
        u = bits_of(static_cast<float>((lo + hi) / 2)) + static_cast<std::uint32_t>(rng() % 9) - 4u;
        break;
      default: {
        const std::uint32_t a = bits_of(static_cast<float>(lo));
        const std::uint32_t b = bits_of(static_cast<float>(hi));
        u = a + static_cast<std::uint32_t>(rng() % (b - a + 1));
      }
    }
    v.push_back(float_of(u | (rng() & 1 ? 0x80000000u : 0u)));
  }
  return v;
}

// For random finite bfloat16 b: b itself, ties (b << 16 | 0x8000) and neighbours, and random bits.
std::vector<float> bf16_boundary_floats(std::uint64_t seed) {
  static constexpr std::uint32_t low[] = {0x0000, 0x0001, 0x7FFE, 0x7FFF, 0x8000, 0x8001, 0x8002, 0xFFFF};
  std::vector<float> v = {0.0f, -0.0f, float_of(0x7F7F7FFF), float_of(0x7F7F8000), float_of(0x7F7FFFFF),
                          float_of(0x00008000), float_of(0x00018000), float_of(0x007FFFFF), float_of(0x007F8000)};
  std::mt19937_64 rng(seed);
  while (v.size() < batch) {
    const auto b = static_cast<std::uint32_t>(rng() % 0x7F80);
    const auto r = rng();
    const std::uint32_t l = (r & 8) ? static_cast<std::uint32_t>(r >> 16) & 0xFFFF : low[r & 7];
    v.push_back(float_of(((b << 16) + l) | ((r >> 4) & 1 ? 0x80000000u : 0u)));
  }
  return v;
}

template <class Convert, class Reference>
void check_against_reference(const std::vector<float>& inputs, Convert convert, Reference reference) {
  mismatches bad;
  for (float f : inputs) {
    const std::uint16_t got = convert(f);
    const std::uint16_t want = reference(f);
    if (got != want) bad.add(hex(bits_of(f)) + " -> " + hex(got) + ", expected " + hex(want));
  }
  INFO(bad.first);
  CHECK(bad.count == 0);
}

}  // namespace

TEST_SUITE("numeric") {
  TEST_CASE("half and bfloat16 are 2-byte, trivially copyable, standard-layout, non-aggregate types") {
    static_assert(sizeof(half) == 2 && alignof(half) == 2);
    static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2);
    static_assert(std::is_trivially_copyable_v<half> && std::is_trivially_copyable_v<bfloat16>);
    static_assert(std::is_standard_layout_v<half> && std::is_standard_layout_v<bfloat16>);
    static_assert(std::is_trivially_default_constructible_v<half>);
    static_assert(std::is_trivially_default_constructible_v<bfloat16>);
    static_assert(!std::is_aggregate_v<half> && !std::is_aggregate_v<bfloat16>);
    // Explicit from float/double, implicit to float.
    static_assert(!std::is_convertible_v<float, half> && std::is_constructible_v<half, float>);
    static_assert(!std::is_convertible_v<double, bfloat16> && std::is_constructible_v<bfloat16, double>);
    static_assert(std::is_convertible_v<half, float> && std::is_convertible_v<bfloat16, float>);
    CHECK(half{}.bits == 0);
    CHECK(bfloat16{}.bits == 0);
  }

  TEST_CASE("conversions and from_bits work in constant expressions") {
    static_assert(half(1.0f).bits == 0x3C00);
    static_assert(half(-2.0).bits == 0xC000);
    static_assert(static_cast<float>(half::from_bits(0x3555)) == 0x1.554p-2f);
    static_assert(bfloat16(1.0f).bits == 0x3F80);
    static_assert(static_cast<float>(bfloat16::from_bits(0xC040)) == -3.0f);
    static_assert(half_bits_to_float(0x0001) == 0x1p-24f);
    CHECK(true);
  }

  TEST_CASE("dtype_name_v gives the safetensors codes F32, F16 and BF16") {
    static_assert(mpopt::dtype_name_v<float> == "F32");
    static_assert(mpopt::dtype_name_v<half> == "F16");
    static_assert(mpopt::dtype_name<bfloat16>::value == "BF16");
    CHECK(mpopt::dtype_name_v<bfloat16> == "BF16");
  }

  TEST_CASE("== compares values: NaN != NaN, +0 == -0, equal values are equal") {
    const half qnan = std::numeric_limits<half>::quiet_NaN();
    CHECK_FALSE(qnan == qnan);
    CHECK(qnan != qnan);
    CHECK(half::from_bits(0x0000) == half::from_bits(0x8000));
    CHECK(half(1.5f) == half(1.5));
    CHECK(half(1.0f) != half(2.0f));
    const bfloat16 bnan = std::numeric_limits<bfloat16>::quiet_NaN();
    CHECK(bnan != bnan);
    CHECK(bfloat16::from_bits(0x0000) == bfloat16::from_bits(0x8000));
    CHECK(bfloat16(3.0f) == bfloat16(3.0));
    CHECK(bfloat16(1.0f) != bfloat16(-1.0f));
  }

  TEST_CASE("half widening is exact for all 65536 patterns; NaN gets the quiet bit and payload << 13") {
    mismatches bad;
    for (std::uint32_t h = 0; h < 0x10000; ++h) {
      const auto hb = static_cast<std::uint16_t>(h);
      const float got = half_bits_to_float(hb);
      const double want = decode_half(hb);
      if (std::isnan(want)) {
        // VCVTPH2PS: sign | 0x7FC00000 | payload << 13, also for signalling NaNs (0x7C01 -> 0x7FC02000).
        const std::uint32_t expect = ((h & 0x8000u) << 16) | 0x7FC00000u | ((h & 0x3FFu) << 13);
        if (bits_of(got) != expect) bad.add(hex(h) + " -> " + hex(bits_of(got)));
      } else if (static_cast<double>(got) != want || std::signbit(got) != std::signbit(want)) {
        bad.add(hex(h) + " -> " + hex(bits_of(got)));
      }
      if (static_cast<float>(half::from_bits(hb)) != got && !std::isnan(got)) bad.add("operator float " + hex(h));
    }
    INFO(bad.first);
    CHECK(bad.count == 0);
    CHECK(bits_of(half_bits_to_float(0x7C01)) == 0x7FC02000u);
    CHECK(bits_of(half_bits_to_float(0xFE00)) == 0xFFC00000u);
  }

  TEST_CASE("bfloat16 widening is exact for all 65536 patterns; NaN bits move unchanged (bits << 16)") {
    mismatches bad;
    for (std::uint32_t b = 0; b < 0x10000; ++b) {
      const auto bb = static_cast<std::uint16_t>(b);
      const float got = bfloat16_bits_to_float(bb);
      const double want = decode_bf16(bb);
      if (std::isnan(want)) {
        if (bits_of(got) != b << 16) bad.add(hex(b) + " -> " + hex(bits_of(got)));
      } else if (static_cast<double>(got) != want || std::signbit(got) != std::signbit(want)) {
        bad.add(hex(b) + " -> " + hex(bits_of(got)));
      }
      if (bits_of(static_cast<float>(bfloat16::from_bits(bb))) != bits_of(got)) bad.add("operator float " + hex(b));
    }
    INFO(bad.first);
    CHECK(bad.count == 0);
  }

  TEST_CASE("every half pattern round-trips half->float->half; a NaN comes back with only 0x0200 added") {
    mismatches bad;
    for (std::uint32_t h = 0; h < 0x10000; ++h) {
      const auto hb = static_cast<std::uint16_t>(h);
      const bool nan = (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0;
      const std::uint16_t expect = nan ? static_cast<std::uint16_t>(h | 0x0200u) : hb;  // same sign, payload
      if (float_to_half_bits(half_bits_to_float(hb)) != expect) bad.add(hex(h));
      if (half(static_cast<float>(half::from_bits(hb))).bits != expect) bad.add("via half " + hex(h));
    }
    INFO(bad.first);
    CHECK(bad.count == 0);
  }

  TEST_CASE("every bfloat16 pattern round-trips bf16->float->bf16; a NaN comes back with only 0x0040 added") {
    mismatches bad;
    for (std::uint32_t b = 0; b < 0x10000; ++b) {
      const auto bb = static_cast<std::uint16_t>(b);
      const bool nan = (b & 0x7F80u) == 0x7F80u && (b & 0x7Fu) != 0;
      const std::uint16_t expect = nan ? static_cast<std::uint16_t>(b | 0x0040u) : bb;
      if (float_to_bfloat16_bits(bfloat16_bits_to_float(bb)) != expect) bad.add(hex(b));
      if (bfloat16(static_cast<float>(bfloat16::from_bits(bb))).bits != expect) bad.add("via bfloat16 " + hex(b));
    }
    INFO(bad.first);
    CHECK(bad.count == 0);
  }

  TEST_CASE("float->half rounds to nearest even at ties, subnormal edges and overflow") {
    CHECK(float_to_half_bits(1.0f) == 0x3C00);
    CHECK(float_to_half_bits(-0.0f) == 0x8000);
    CHECK(float_to_half_bits(1.0f + 0x1p-11f) == 0x3C00);          // tie, 0x3C00 even
    CHECK(float_to_half_bits(1.0f + 3 * 0x1p-11f) == 0x3C02);      // tie, 0x3C02 even
    CHECK(float_to_half_bits(1.0f + 0x1p-11f + 0x1p-23f) == 0x3C01);  // just above the tie
    CHECK(float_to_half_bits(65504.0f) == 0x7BFF);
    CHECK(float_to_half_bits(std::nextafter(65520.0f, 0.0f)) == 0x7BFF);
    CHECK(float_to_half_bits(65520.0f) == 0x7C00);  // tie between max and the next power of two
    CHECK(float_to_half_bits(-1e30f) == 0xFC00);
    CHECK(float_to_half_bits(0x1p-24f) == 0x0001);
    CHECK(float_to_half_bits(0x1p-25f) == 0x0000);                 // tie to even 0
    CHECK(float_to_half_bits(-std::nextafter(0x1p-25f, 1.0f)) == 0x8001);
    CHECK(float_to_half_bits(3 * 0x1p-25f) == 0x0002);              // 1.5 ulp, tie to even 2
    CHECK(float_to_half_bits(3 * 0x1p-26f) == 0x0001);              // 0.75 ulp
    CHECK(float_to_half_bits(1023.5f * 0x1p-24f) == 0x0400);        // largest subnormal rounds up to min normal
    CHECK(float_to_half_bits(std::nextafter(1023.5f * 0x1p-24f, 0.0f)) == 0x03FF);
    CHECK(float_to_half_bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
    CHECK(float_to_half_bits(-std::numeric_limits<float>::infinity()) == 0xFC00);
    CHECK(float_to_half_bits(float_of(0x7F800001)) == 0x7E00);  // sNaN, payload below bit 13: quiet NaN
    CHECK(float_to_half_bits(float_of(0xFFA02000)) == 0xFF01);  // sign, quiet bit and upper payload kept
  }

  TEST_CASE("float->bfloat16 rounds to nearest even without flushing subnormals") {
    CHECK(float_to_bfloat16_bits(1.0f) == 0x3F80);
    CHECK(float_to_bfloat16_bits(float_of(0x3F808000)) == 0x3F80);  // tie, even
    CHECK(float_to_bfloat16_bits(float_of(0x3F818000)) == 0x3F82);  // tie, even
    CHECK(float_to_bfloat16_bits(float_of(0x3F808001)) == 0x3F81);
    CHECK(float_to_bfloat16_bits(float_of(0x7F7F7FFF)) == 0x7F7F);
    CHECK(float_to_bfloat16_bits(float_of(0x7F7F8000)) == 0x7F80);  // tie past max -> inf
    CHECK(float_to_bfloat16_bits(float_of(0xFF7FFFFF)) == 0xFF80);
    CHECK(float_to_bfloat16_bits(float_of(0x00008000)) == 0x0000);  // subnormal tie to even 0
    CHECK(float_to_bfloat16_bits(float_of(0x00018000)) == 0x0002);  // subnormal tie to even 2
    CHECK(float_to_bfloat16_bits(float_of(0x007FFFFF)) == 0x0080);  // largest float subnormal -> min normal
    CHECK(float_to_bfloat16_bits(float_of(0x80000001)) == 0x8000);
    CHECK(float_to_bfloat16_bits(float_of(0x7F800001)) == 0x7FC0);  // sNaN -> quiet
    CHECK(float_to_bfloat16_bits(float_of(0xFFA12345)) == 0xFFE1);
  }

  TEST_CASE("float->half matches a nearest-value search on 4M uniform bit patterns and 4M boundary values") {
    const auto& t = half_table();
    REQUIRE(std::is_sorted(t.values().begin(), t.values().end()));
    REQUIRE(std::adjacent_find(t.values().begin(), t.values().end()) == t.values().end());
    auto lib = [](float f) { return float_to_half_bits(f); };
    auto ref = [](float f) { return ref_half(f); };
    check_against_reference(uniform_floats(1), lib, ref);
    check_against_reference(half_boundary_floats(2), lib, ref);
    check_against_reference(half_boundary_floats(3), [](float f) { return half(f).bits; }, ref);
  }

  TEST_CASE("float->bfloat16 matches a nearest-value search on 4M uniform bit patterns and 4M boundary values") {
    const auto& t = bf16_table();
    REQUIRE(std::is_sorted(t.values().begin(), t.values().end()));
    REQUIRE(std::adjacent_find(t.values().begin(), t.values().end()) == t.values().end());
    auto lib = [](float f) { return float_to_bfloat16_bits(f); };
    auto ref = [](float f) { return ref_bf16(f); };
    check_against_reference(uniform_floats(4), lib, ref);
    check_against_reference(bf16_boundary_floats(5), lib, ref);
    check_against_reference(bf16_boundary_floats(6), [](float f) { return bfloat16(f).bits; }, ref);
  }

  TEST_CASE("half(double) and bfloat16(double) round once, correctly, not twice through float") {
    // 1 + 2^-11 + 2^-40 is just above a half tie; through float the 2^-40 is lost and the tie goes down.
    const double above_tie = 1.0 + 0x1p-11 + 0x1p-40;
    CHECK(half(above_tie).bits == 0x3C01);
    CHECK(half(static_cast<float>(above_tie)).bits == 0x3C00);
    const double above_bf_tie = 1.0 + 0x1p-8 + 0x1p-40;
    CHECK(bfloat16(above_bf_tie).bits == 0x3F81);
    CHECK(bfloat16(static_cast<float>(above_bf_tie)).bits == 0x3F80);
    CHECK(half(1e300).bits == 0x7C00);
    CHECK(bfloat16(-1e300).bits == 0xFF80);
    CHECK(bfloat16(std::ldexp(1.0, -1074)).bits == 0x0000);
    CHECK(half(-std::numeric_limits<double>::infinity()).bits == 0xFC00);
    CHECK(std::isnan(static_cast<float>(half(std::numeric_limits<double>::quiet_NaN()))));

    // 1M values from each boundary set with random bits below float precision, and raw bit patterns.
    std::mt19937_64 rng(7);
    mismatches bad;
    auto check_one = [&](double d) {
      if (half(d).bits != ref_half(d)) bad.add("half " + hex(bits_of(d)));
      if (bfloat16(d).bits != ref_bf16(d)) bad.add("bf16 " + hex(bits_of(d)));
    };
    const std::vector<float> half_edges = half_boundary_floats(8);
    for (std::size_t i = 0; i < batch / 4; ++i) {
      const double d = half_edges[i];
      check_one(d);
      check_one(std::bit_cast<double>(bits_of(d) ^ (rng() & 0x1FFFFFFFu)));  // perturb below float precision
      check_one(std::bit_cast<double>(rng()));
    }
    const std::vector<float> bf16_edges = bf16_boundary_floats(9);
    for (std::size_t i = 0; i < batch / 4; ++i) {
      const double d = bf16_edges[i];
      check_one(std::bit_cast<double>(bits_of(d) ^ (rng() & 0x1FFFFFFFu)));
    }
    INFO(bad.first);
    CHECK(bad.count == 0);
  }

  TEST_CASE("numeric_limits<half> holds the binary16 constants") {
    using L = std::numeric_limits<half>;
    static_assert(L::is_specialized && L::is_signed && !L::is_integer && !L::is_exact && L::is_iec559);
    static_assert(L::has_infinity && L::has_quiet_NaN && L::has_signaling_NaN && L::has_denorm == std::denorm_present);
    static_assert(L::round_style == std::round_to_nearest && L::is_bounded && !L::is_modulo && !L::traps);
    static_assert(L::radix == 2 && L::digits == 11 && L::digits10 == 3 && L::max_digits10 == 5);
    static_assert(L::min_exponent == -13 && L::max_exponent == 16);
    static_assert(L::min_exponent10 == -4 && L::max_exponent10 == 4);
    static_assert(std::numeric_limits<const half>::digits == 11);
    CHECK(static_cast<float>(L::max()) == 65504.0f);
    CHECK(static_cast<float>(L::lowest()) == -65504.0f);
    CHECK(static_cast<float>(L::min()) == std::ldexp(1.0f, -14));
    CHECK(static_cast<float>(L::denorm_min()) == std::ldexp(1.0f, -24));
    CHECK(static_cast<float>(L::epsilon()) == std::ldexp(1.0f, -10));
    CHECK(static_cast<float>(L::round_error()) == 0.5f);
    CHECK(static_cast<float>(L::infinity()) == std::numeric_limits<float>::infinity());
    CHECK(L::infinity().bits == 0x7C00);
    CHECK(std::isnan(static_cast<float>(L::quiet_NaN())));
    CHECK((L::quiet_NaN().bits & 0x0200) != 0);
    CHECK(std::isnan(static_cast<float>(L::signaling_NaN())));
    CHECK((L::signaling_NaN().bits & 0x0200) == 0);
    // epsilon is the gap above 1; max is the value below 2^16; digits10 decimal digits survive.
    CHECK(static_cast<float>(half::from_bits(0x3C01)) - 1.0f == static_cast<float>(L::epsilon()));
    CHECK(static_cast<double>(static_cast<float>(L::max())) == 65536.0 - std::ldexp(1.0, 16 - L::digits));
    // 10^max_exponent10 is finite, 10^(max_exponent10 + 1) is not; likewise for min.
    CHECK(std::isfinite(static_cast<float>(half(1e4f))));
    CHECK(std::isinf(static_cast<float>(half(1e5f))));
    CHECK(1e-4f >= static_cast<float>(L::min()));
    CHECK(1e-5f < static_cast<float>(L::min()));
  }

  TEST_CASE("numeric_limits<bfloat16> holds the bfloat16 constants") {
    using L = std::numeric_limits<bfloat16>;
    static_assert(L::is_specialized && L::is_signed && !L::is_integer && !L::is_exact && !L::is_iec559);
    static_assert(L::has_infinity && L::has_quiet_NaN && L::has_signaling_NaN && L::has_denorm == std::denorm_present);
    static_assert(L::round_style == std::round_to_nearest && L::is_bounded && !L::is_modulo);
    static_assert(L::radix == 2 && L::digits == 8 && L::digits10 == 2 && L::max_digits10 == 4);
    static_assert(L::min_exponent == std::numeric_limits<float>::min_exponent);
    static_assert(L::max_exponent == std::numeric_limits<float>::max_exponent);
    static_assert(L::min_exponent10 == std::numeric_limits<float>::min_exponent10);
    static_assert(L::max_exponent10 == std::numeric_limits<float>::max_exponent10);
    CHECK(L::max().bits == 0x7F7F);
    CHECK(static_cast<double>(static_cast<float>(L::max())) == std::ldexp(255.0, 120));
    CHECK(L::lowest().bits == 0xFF7F);
    CHECK(static_cast<float>(L::lowest()) == -static_cast<float>(L::max()));
    CHECK(static_cast<float>(L::min()) == std::numeric_limits<float>::min());
    CHECK(static_cast<float>(L::denorm_min()) == std::ldexp(1.0f, -133));
    CHECK(static_cast<float>(L::epsilon()) == std::ldexp(1.0f, -7));
    CHECK(static_cast<float>(bfloat16::from_bits(0x3F81)) - 1.0f == static_cast<float>(L::epsilon()));
    CHECK(static_cast<float>(L::round_error()) == 0.5f);
    CHECK(L::infinity().bits == 0x7F80);
    CHECK(std::isinf(static_cast<float>(L::infinity())));
    CHECK(std::isnan(static_cast<float>(L::quiet_NaN())));
    CHECK((L::quiet_NaN().bits & 0x0040) != 0);
    CHECK(std::isnan(static_cast<float>(L::signaling_NaN())));
    CHECK((L::signaling_NaN().bits & 0x0040) == 0);
  }

#if defined(__F16C__)
  TEST_CASE("scalar half conversions match the F16C instructions (VCVTPH2PS, VCVTPS2PH) bit for bit") {
    mismatches bad;
    for (std::uint32_t h = 0; h < 0x10000; ++h) {
      const float hw = _cvtsh_ss(static_cast<unsigned short>(h));
      if (bits_of(hw) != bits_of(half_bits_to_float(static_cast<std::uint16_t>(h)))) bad.add("widen " + hex(h));
    }
    for (const auto& set : {uniform_floats(10), half_boundary_floats(11)}) {
      for (float f : set) {
        const __m128i ph = _mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const auto hw = static_cast<std::uint16_t>(_mm_cvtsi128_si32(ph));
        if (hw != float_to_half_bits(f)) bad.add("narrow " + hex(bits_of(f)));
      }
    }
    INFO(bad.first);
    CHECK(bad.count == 0);
  }
#endif

  // Slow (about 30 s): run with --no-skip.
  TEST_CASE("exhaustive: every float rounds to the nearest half and bfloat16 (monotone sweep)" * doctest::skip()) {
    const auto& ht = half_table().values();
    const auto& bt = bf16_table().values();
    std::size_t hlo = 0;
    std::size_t blo = 0;
    mismatches bad;
    for (std::uint32_t u = 0; u < 0x7F800000u; ++u) {  // positive finite floats, increasing
      const float f = float_of(u);
      const double x = f;
      while (hlo + 1 < ht.size() && ht[hlo + 1] <= x) ++hlo;
      while (blo + 1 < bt.size() && bt[blo + 1] <= x) ++blo;
      const std::uint16_t wh = hlo + 1 < ht.size() ? half_table().pick(x, hlo) : 0x7C00;
      const std::uint16_t wb = bf16_table().pick(x, blo);  // 2^128 is beyond every finite float
      if (float_to_half_bits(f) != wh || float_to_half_bits(-f) != (wh | 0x8000)) bad.add("half " + hex(u));
      if (float_to_bfloat16_bits(f) != wb || float_to_bfloat16_bits(-f) != (wb | 0x8000)) bad.add("bf16 " + hex(u));
    }
    for (std::uint64_t u = 0x7F800000u; u <= 0xFFFFFFFFu; ++u) {  // +inf, NaNs, -0, negatives already covered
      if (u >= 0x80000000u && u < 0xFF800000u) u = 0xFF800000u;
      const float f = float_of(static_cast<std::uint32_t>(u));
      if (float_to_half_bits(f) != ref_half(f)) bad.add("half " + hex(u));
      if (float_to_bfloat16_bits(f) != ref_bf16(f)) bad.add("bf16 " + hex(u));
    }
    INFO(bad.first);
    CHECK(bad.count == 0);
  }
}
