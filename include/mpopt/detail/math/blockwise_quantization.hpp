// mpopt — blockwise quantization of optimizer state (docs/design.md, "State precision"): each block
// of a state buffer keeps one scale, the largest magnitude in it, and per element the code of a
// sorted map of 2^bits values in [-1, 1]:
//   encode  s = max |x| over the block;  y = x / s (0 where s is 0);  code = the map value nearest y
//           (an exact tie takes the larger)
//   decode  x' = map[code] * s
// A block with a NaN or an infinity gets the scale NaN, so all of it decodes to NaN: a non-finite
// moment is never rounded into a finite one.
//
// The maps (codes are indices into the ascending values, as bitsandbytes and torchao number them):
// - dynamic_map: bitsandbytes' dynamic data type (Dettmers et al., arXiv 2110.02861, 1511.04561),
//   bitsandbytes.functional.create_dynamic_map and torchao's copy. A code's leading bits say its
//   decade, 10^(i - (E-1)) for i = 0..E-1, and decade i holds the midpoints of an even split of
//   [0.1, 1] into 2^i parts (signed) or 2^(i+1) parts (unsigned; bitsandbytes counts the bits alike
//   for both); with 0 and 1 added. Evaluated here in double and rounded once to float, where
//   bitsandbytes computes in float32: a value may differ from theirs in its last bit.
// - linear_map: torchao's 4-bit map for the second moment (after Li et al., arXiv 2309.01507): k/16
//   for k = 1..16, without 0, so that no element of v decodes to 0 in a block that is not all 0.
// fp8 E4M3 (OCP's E4M3FN: no infinities, largest 448) with a per-block scale, as torchao's
// AdamWFp8: s = max |x| / 448, code = x / s rounded to nearest even (beyond 448: 448), x' = code * s.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "../config.hpp"
#include "../lanes/float_bits.hpp"

namespace mpopt::detail {

/// The buckets that find a code with one table lookup and one comparison (bucket_code): magnitudes
/// below 2^-23 in bucket 0, then per binade up to 1 one bucket per value of the mantissa's first
/// `bucket_bits` bits; negative values in buckets of their own, after the positive ones. A bucket
/// spans 2^-8 of its values, less than any map's relative spacing, so it holds at most one threshold
/// (tests/quantization.cpp checks every bucket of every map).
inline constexpr int bucket_bits = 8;
inline constexpr std::uint32_t bucket_low_exponent = 127 - 23;  // biased: 2^-23
inline constexpr std::size_t buckets_per_sign = (std::size_t(127 - bucket_low_exponent) << bucket_bits) + 2;

/// The bucket of y, for |y| <= 1 (larger magnitudes and NaN share the last bucket of their sign).
constexpr std::uint32_t bucket_of(float y) {
  const auto b = std::bit_cast<std::uint32_t>(y);
  const std::uint32_t a = b & 0x7FFFFFFFu, e = a >> 23, top = (a >> (23 - bucket_bits)) & ((1u << bucket_bits) - 1);
  std::uint32_t i = e < bucket_low_exponent ? 0u : ((e - bucket_low_exponent) << bucket_bits | top) + 1;
  if (i >= buckets_per_sign) i = std::uint32_t(buckets_per_sign - 1);
  return i + (b >> 31) * std::uint32_t(buckets_per_sign);
}

/// The least and the greatest float of bucket i.
constexpr std::pair<float, float> bucket_ends(std::size_t i) {
  const bool negative = i >= buckets_per_sign;
  const std::size_t k = negative ? i - buckets_per_sign : i;
  const std::uint32_t lo = k == 0 ? 0u
                                  : std::uint32_t(bucket_low_exponent + (k - 1) / (1u << bucket_bits)) << 23 |
                                        std::uint32_t((k - 1) % (1u << bucket_bits)) << (23 - bucket_bits);
  const std::uint32_t last = (k == 0 ? bucket_low_exponent << 23 : lo + (1u << (23 - bucket_bits))) - 1;
  if (negative) return {-std::bit_cast<float>(last), -std::bit_cast<float>(lo)};
  return {std::bit_cast<float>(lo), std::bit_cast<float>(last)};
}

/// A sorted map of N values and its decision thresholds: code(y) = #{k : y >= thresholds[k]}, where
/// thresholds[k] is the smallest float at or above the exact midpoint of values k and k+1, so that
/// comparing floats decides as the exact midpoint would; the thresholds again in the order a binary
/// search meets them (`search`: level l's 2^l candidates from offset 2^l - 1, candidate k being
/// thresholds[(2k + 1) * N / 2^(l+1) - 1]); and the code of each bucket's least float.
template <std::size_t N>
struct quantization_map {
  static_assert(N >= 2 && N <= 256 && std::has_single_bit(N), "a map has 2^bits values, 8 bits at most");
  std::array<float, N> values{};
  std::array<float, N - 1> thresholds{};
  std::array<float, N - 1> search{};
  // (3 spare bytes: AVX2's gather reads the last bucket's code as the first of 4 bytes)
  std::array<std::uint8_t, 2 * buckets_per_sign + 3> bucket_codes{};
};

/// The code of y in a map of N values with these thresholds, by definition: a binary search (NaN:
/// code 0). The host's passes use bucket_code, which gives the same; the device's, this.
template <std::size_t N>
constexpr MPOPT_HOST_DEVICE std::uint32_t nearest_code(const float* thresholds, float y) {
  std::uint32_t code = 0;
  for (std::uint32_t step = N / 2; step > 0; step /= 2)
    if (thresholds[code + step - 1] <= y) code += step;
  return code;
}
template <std::size_t N>
constexpr std::uint32_t nearest_code(const quantization_map<N>& m, float y) {
  return nearest_code<N>(m.thresholds.data(), y);
}

/// The smallest float at or above x (x in float range).
constexpr float float_at_or_above(double x) {
  const float f = static_cast<float>(x);
  if (static_cast<double>(f) >= x) return f;
  const auto b = std::bit_cast<std::uint32_t>(f);
  return std::bit_cast<float>(b >> 31 ? b - 1 : b + 1);  // one float toward +infinity
}

/// The map of values v (ascending, distinct), with its thresholds.
template <std::size_t N>
constexpr quantization_map<N> map_of(const std::array<double, N>& v) {
  quantization_map<N> m;
  for (std::size_t k = 0; k < N; ++k) m.values[k] = static_cast<float>(v[k]);
  for (std::size_t k = 0; k + 1 < N; ++k)
    m.thresholds[k] = float_at_or_above((static_cast<double>(m.values[k]) + m.values[k + 1]) / 2);
  for (std::size_t level = 0, first = 0; (std::size_t{1} << level) < N; first += std::size_t{1} << level, ++level)
    for (std::size_t k = 0; k < (std::size_t{1} << level); ++k)
      m.search[first + k] = m.thresholds[(2 * k + 1) * (N >> (level + 1)) - 1];
  // Each bucket's least float has nearest_code's answer: walked in y's order (the positive buckets
  // up, the negative ones from -1 up), the code only grows.
  std::uint32_t c = 0;
  for (std::size_t i = 2 * buckets_per_sign; i-- > buckets_per_sign;) {
    while (c + 1 < N && m.thresholds[c] <= bucket_ends(i).first) ++c;
    m.bucket_codes[i] = static_cast<std::uint8_t>(c);
  }
  for (std::size_t i = 0; i < buckets_per_sign; ++i) {
    while (c + 1 < N && m.thresholds[c] <= bucket_ends(i).first) ++c;
    m.bucket_codes[i] = static_cast<std::uint8_t>(c);
  }
  return m;
}

/// 10^e, correctly rounded for |e| <= 22.
constexpr double power_of_ten(int e) {
  double p = 1;
  for (int i = 0; i < (e < 0 ? -e : e); ++i) p *= 10;
  return e < 0 ? 1 / p : p;
}

/// The values of bitsandbytes' dynamic map with N = 2^bits values and every non-sign bit an exponent
/// bit (create_dynamic_map(signed, max_exponent_bits = bits - 1, total_bits = bits)), ascending.
template <std::size_t N>
constexpr std::array<double, N> dynamic_values(bool is_signed) {
  constexpr int exponent_bits = std::bit_width(N) - 2;
  std::array<double, N> v{};
  std::size_t n = 0;
  for (int i = 0; i < exponent_bits; ++i) {
    const int parts = is_signed ? 1 << i : 1 << (i + 1);
    const double decade = power_of_ten(i - (exponent_bits - 1));
    for (int j = 0; j < parts; ++j) {
      const double mean = 0.1 + 0.9 * (j + 0.5) / parts;
      v[n++] = decade * mean;
      if (is_signed) v[n++] = -(decade * mean);
    }
  }
  v[n++] = 0;
  v[n++] = 1;
  for (std::size_t a = 1; a < N; ++a)  // insertion sort: constexpr, and run once per map
    for (std::size_t b = a; b > 0 && v[b - 1] > v[b]; --b) std::swap(v[b - 1], v[b]);
  return v;
}

/// k / N for k = 1..N.
template <std::size_t N>
constexpr std::array<double, N> linear_values() {
  std::array<double, N> v{};
  for (std::size_t k = 0; k < N; ++k) v[k] = static_cast<double>(k + 1) / N;
  return v;
}

/// The maps of those values, with their thresholds.
template <std::size_t N>
constexpr quantization_map<N> dynamic_map(bool is_signed) {
  return map_of(dynamic_values<N>(is_signed));
}
template <std::size_t N>
constexpr quantization_map<N> linear_map() {
  return map_of(linear_values<N>());
}

/// The maps of the state precisions, for signed state (the first moment) and state that is never
/// negative (the second): variable templates, so that only a unit that uses a map evaluates it.
template <bool Signed>
inline constexpr auto map8 = dynamic_map<256>(Signed);
template <bool Signed>
inline constexpr auto map4 = Signed ? dynamic_map<16>(true) : linear_map<16>();

/// A block's scale: its largest magnitude, or NaN if it holds a NaN or an infinity.
MPOPT_HOST_DEVICE float block_scale(const float* x, std::size_t n) {
  float s = 0;
  bool finite = true;
  for (std::size_t i = 0; i < n; ++i) {
    const float a = bit_cast<float>(bit_cast<std::uint32_t>(x[i]) & 0x7FFFFFFFu);
    finite = finite && a <= 0x1.fffffep127f;
    s = a > s ? a : s;
  }
  return finite ? s : bit_cast<float>(0x7FC00000u);
}

/// nearest_code(m, y), by y's bucket: the code of its least float, or the next where y reaches the
/// threshold between them.
template <std::size_t N>
constexpr std::uint32_t bucket_code(const quantization_map<N>& m, float y) {
  if (y != y) return 0;  // NaN, as nearest_code
  const std::uint32_t c = m.bucket_codes[bucket_of(y)];
  return c + (c + 1 < N && m.thresholds[c] <= y);
}

/// The code of x in a block of scale s: nearest_code(m, x / s), or of 0 where s is 0.
template <std::size_t N>
constexpr std::uint32_t encode(const quantization_map<N>& m, float x, float s) {
  return bucket_code(m, s > 0 ? x / s : 0.0f);
}

/// The value of a code in a block of scale s.
template <std::size_t N>
constexpr float decode(const quantization_map<N>& m, std::uint32_t code, float s) {
  return m.values[code] * s;
}

/// The largest fp8 E4M3 value.
inline constexpr float e4m3_max = 448.0f;

/// The value of an E4M3FN code: S.EEEE.MMM, exponent bias 7, subnormals below 2^-6, S.1111.111 NaN.
constexpr MPOPT_HOST_DEVICE float e4m3_value(std::uint8_t code) {
  const std::uint32_t e = (code >> 3) & 0xFu, m = code & 0x7u;
  if (e == 0xF && m == 0x7) return bit_cast<float>(0x7FC00000u);
  // the float with the same exponent and the mantissa in its top bits; subnormals as m * 2^-9
  const float magnitude = e == 0 ? static_cast<float>(m) / 512.0f
                                 : bit_cast<float>(((e + 127 - 7) << 23) | (m << 20));
  return code & 0x80u ? -magnitude : magnitude;
}

/// Every E4M3FN code's value, for decoding by table.
inline constexpr std::array<float, 256> e4m3_values = [] {
  std::array<float, 256> v{};
  for (std::size_t c = 0; c < v.size(); ++c) v[c] = e4m3_value(static_cast<std::uint8_t>(c));
  return v;
}();

/// The E4M3FN code nearest y, an exact tie to the even mantissa; beyond 448 in magnitude (infinities
/// too), 448; NaN to NaN (a block's NaN scale is what marks a non-finite block). Works on y's bits: the three kept mantissa bits, rounded on the bits dropped.
constexpr MPOPT_HOST_DEVICE std::uint8_t e4m3_code(float y) {
  const auto bits = bit_cast<std::uint32_t>(y);
  const std::uint8_t sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t a = bits & 0x7FFFFFFFu;  // |y|
  if (a > 0x7F800000u) return sign | 0x7Fu;
  if (a >= 0x43E00000u) return sign | 0x7Eu;  // |y| >= 448
  if (a < 0x3C800000u) {  // below 2^-6: a multiple of 2^-9, rounded to nearest even (exact in float)
    const float q = bit_cast<float>(a) * 512.0f;
    auto m = static_cast<std::uint32_t>(q);
    const float rest = q - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return sign | static_cast<std::uint8_t>(m);  // m = 8 is 2^-6, the least normal: the same bits
  }
  // normal: re-bias the exponent, keep 3 mantissa bits, round to nearest even on the 20 dropped
  const std::uint32_t kept = ((a >> 23) - 127 + 7) << 3 | ((a >> 20) & 0x7u);
  const std::uint32_t dropped = a & 0xFFFFFu;
  const std::uint32_t rounded = kept + (dropped > 0x80000u || (dropped == 0x80000u && (kept & 1u)));
  return sign | static_cast<std::uint8_t>(rounded > 0x7Eu ? 0x7Eu : rounded);
}

}  // namespace mpopt::detail
