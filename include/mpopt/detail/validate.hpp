// mpopt — option checks that name the offending field. Each throws mpopt::error before anything changes.
#pragma once

#include <cfloat>
#include <cmath>
#include <sstream>
#include <string>
#include <string_view>

#include "../error.hpp"

namespace mpopt::detail {

template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream s;
  s.precision(17);
  (s << ... << parts);
  throw error(s.str());
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

/// The options every Adam-family rule has (lr, beta1, beta2, eps, weight_decay) of group g.
template <class Options>
void require_adam_family(const std::string& g, const Options& o) {
  require_non_negative(g + ".lr", o.lr);
  require_float(g + ".lr", o.lr);
  require_beta(g + ".beta1", o.beta1);
  require_beta(g + ".beta2", o.beta2);
  require_float_divisor(g + ".eps", o.eps);
  require_non_negative(g + ".weight_decay", o.weight_decay);
  require_float(g + ".weight_decay", o.weight_decay);
}

/// A trust-ratio clamp [min_coeff, max_coeff] of group g (LAMB, 1-bit LAMB).
template <class Options>
void require_coeff_clamp(const std::string& g, const Options& o) {
  require_non_negative(g + ".min_coeff", o.min_coeff);
  require_positive(g + ".max_coeff", o.max_coeff);
  if (o.min_coeff > o.max_coeff) fail(g, ".min_coeff (", o.min_coeff, ") must be <= max_coeff (", o.max_coeff, ")");
}

}  // namespace mpopt::detail
