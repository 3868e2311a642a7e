// mpopt — option checks that name the offending field. Each throws mpopt::error before anything changes.
#pragma once

#include <cfloat>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>

#include "../error.hpp"
#include "config.hpp"

namespace mpopt::detail {

// A message is built by non-template code, part by part: fail() instantiates one small function
// per list of argument types, not a stream per call site.
MPOPT_COLD inline void append_signed(std::string& s, std::int64_t x) { s += std::to_string(x); }
MPOPT_COLD inline void append_unsigned(std::string& s, std::uint64_t x) { s += std::to_string(x); }
/// 17 significant digits, as printf's %.17g: every double reads back as itself.
MPOPT_COLD inline void append_double(std::string& s, double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", x);
  s += text;
}
[[noreturn]] MPOPT_COLD inline void throw_error(const std::string& message) { throw error(message); }

template <class T>
void append_part(std::string& s, const T& part) {
  if constexpr (std::is_same_v<T, bool>) s += part ? "true" : "false";
  else if constexpr (std::is_same_v<T, char>) s += part;
  else if constexpr (std::is_enum_v<T>) append_signed(s, std::int64_t(part));
  else if constexpr (std::signed_integral<T>) append_signed(s, part);
  else if constexpr (std::unsigned_integral<T>) append_unsigned(s, part);
  else if constexpr (std::floating_point<T>) append_double(s, double(part));
  else s += std::string_view(part);
}

/// Throws mpopt::error with the parts' text: strings as they are, numbers as printf's %.17g or %d
/// would write them, bools as true or false.
template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::string s;
  (append_part(s, parts), ...);
  throw_error(s);
}

inline void require_finite(std::string_view field, double x) {
  if (!std::isfinite(x)) fail(field, " must be a finite number, got ", x);
}

inline void require_positive(std::string_view field, double x) {
  require_finite(field, x);
  if (!(x > 0)) fail(field, " must be > 0, got ", x);
}

inline void require_non_negative(std::string_view field, double x) {
  require_finite(field, x);
  if (!(x >= 0)) fail(field, " must be >= 0, got ", x);
}

/// A value the backends compute with as a float: finite there too (1e300 is a finite double).
inline void require_float(std::string_view field, double x) {
  require_finite(field, x);
  if (!(std::fabs(x) <= FLT_MAX)) fail(field, " must be finite as a float (at most ", FLT_MAX, "), got ", x);
}

/// A float divisor (eps): at least the smallest normal float, so it neither rounds to 0 nor is flushed
/// to 0 where denormals are.
inline void require_float_divisor(std::string_view field, double x) {
  require_float(field, x);
  if (!(x >= FLT_MIN)) fail(field, " must be >= ", FLT_MIN, " (the smallest normal float: it divides), got ", x);
}

/// A factor whose reciprocal the backends use too: both normal floats, in [2^-126, 2^126].
inline void require_float_scale(std::string_view field, double x) {
  require_positive(field, x);
  if (!(x >= FLT_MIN && x <= 1 / FLT_MIN))
    fail(field, " must be in [2^-126, 2^126], where it and its reciprocal are normal floats, got ", x);
}

/// [0, 1): the range of an exponential-average coefficient.
inline void require_beta(std::string_view field, double x) {
  require_finite(field, x);
  if (!(x >= 0 && x < 1)) fail(field, " must be in [0, 1), got ", x);
}

/// A trust-ratio clamp [min_coeff, max_coeff] of `group` (LAMB, 1-bit LAMB) is an interval.
inline void require_coeff_order(std::string_view group, double min_coeff, double max_coeff) {
  if (min_coeff > max_coeff) fail(group, ".min_coeff (", min_coeff, ") must be <= max_coeff (", max_coeff, ")");
}

}  // namespace mpopt::detail
