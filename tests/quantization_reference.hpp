// Quantized state's formats written from their definitions, in double, for the tests to check mpopt
// against (detail/math/blockwise_quantization.hpp is what they check): bitsandbytes' dynamic map,
// torchao's 4-bit maps, and fp8 E4M3FN's values and nearest codes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace quantization_reference {

/// bitsandbytes' create_dynamic_map(signed, max_exponent_bits = bits - 1, total_bits = bits), in
/// double: per decade, the means of neighbouring points of linspace(0.1, 1, items).
inline std::vector<double> reference_dynamic_map(bool is_signed, int bits) {
  const int non_sign_bits = bits - 1, exponent_bits = bits - 1;
  std::vector<double> v;
  for (int i = 0; i < exponent_bits; ++i) {
    const int items = is_signed ? (1 << (i + non_sign_bits - exponent_bits)) + 1
                                : (1 << (i + non_sign_bits - exponent_bits + 1)) + 1;
    std::vector<double> boundaries(static_cast<std::size_t>(items));
    for (int k = 0; k < items; ++k) boundaries[std::size_t(k)] = 0.1 + (1.0 - 0.1) * k / (items - 1);
    const double decade = std::pow(10.0, -(exponent_bits - 1) + i);
    for (std::size_t k = 0; k + 1 < boundaries.size(); ++k) {
      const double mean = (boundaries[k] + boundaries[k + 1]) / 2;
      v.push_back(decade * mean);
      if (is_signed) v.push_back(-decade * mean);
    }
  }
  v.push_back(0);
  v.push_back(1);
  std::sort(v.begin(), v.end());
  return v;
}

/// torchao's 4-bit map for non-negative state: k/16 for k = 1..16.
inline std::vector<double> reference_linear_map4() {
  std::vector<double> v;
  for (int k = 1; k <= 16; ++k) v.push_back(k / 16.0);
  return v;
}

/// An E4M3FN code's value from its fields: (1 + m/8) * 2^(e-7), or m * 2^-9 where e is 0.
inline double reference_e4m3(std::uint8_t code) {
  const int e = (code >> 3) & 0xF, m = code & 0x7;
  if (e == 0xF && m == 0x7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = e == 0 ? m * std::ldexp(1.0, -9) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
  return code & 0x80 ? -magnitude : magnitude;
}

/// The finite code nearest y (beyond 448: 448), an exact tie to the even code.
inline std::uint8_t reference_e4m3_code(float y) {
  if (std::isnan(y)) return std::signbit(y) ? 0xFF : 0x7F;
  const std::uint8_t sign = std::signbit(y) ? 0x80 : 0;
  const double a = std::fabs(double(y));
  std::uint8_t best = 0;
  for (std::uint8_t c = 1; c <= 0x7E; ++c) {
    const double d = std::fabs(a - reference_e4m3(c)), best_d = std::fabs(a - reference_e4m3(best));
    if (d < best_d || (d == best_d && (c & 1) == 0)) best = c;
  }
  return sign | best;
}

/// Every finite E4M3FN value, ascending (-0 and 0 both).
inline std::vector<double> reference_e4m3_values() {
  std::vector<double> v;
  for (int c = 0; c < 256; ++c)
    if (!std::isnan(reference_e4m3(std::uint8_t(c)))) v.push_back(reference_e4m3(std::uint8_t(c)));
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace quantization_reference
