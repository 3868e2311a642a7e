// mpopt — the message builders' and checks' definitions (validate.hpp): inline header-only, else
// compiled once by <mpopt/src.hpp>.
#pragma once

#include "validate.hpp"

#include <cstdio>

namespace mpopt::detail {

MPOPT_DECL void append_signed(std::string& s, std::int64_t x) { s += std::to_string(x); }
MPOPT_DECL void append_unsigned(std::string& s, std::uint64_t x) { s += std::to_string(x); }
MPOPT_DECL void append_double(std::string& s, double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", x);
  s += text;
}
MPOPT_DECL void throw_error(const std::string& message) { throw error(message); }

MPOPT_DECL void require_coeff_order(std::string_view group, double min_coeff, double max_coeff) {
  if (min_coeff > max_coeff) fail(group, ".min_coeff (", min_coeff, ") must be <= max_coeff (", max_coeff, ")");
}

}  // namespace mpopt::detail
