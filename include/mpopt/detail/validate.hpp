// mpopt — option checks that name the offending field. Each throws mpopt::error before anything changes.
#pragma once

#include <cmath>
#include <sstream>
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

/// [0, 1): the range of an exponential-average coefficient.
inline void require_beta(std::string_view field, double x) {
  require_finite(field, x);
  if (!(x >= 0 && x < 1)) fail(field, " must be in [0, 1), got ", x);
}

}  // namespace mpopt::detail
