// mpopt — the errors that name what is wrong (fail), and the few checks no fields table holds.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "../../error.hpp"
#include "../config.hpp"

namespace mpopt::detail {

// A message is built by non-template code, part by part: fail() instantiates one small function
// per list of argument types, not a stream per call site.
MPOPT_DECL void append_signed(std::string& s, std::int64_t x);
MPOPT_DECL void append_unsigned(std::string& s, std::uint64_t x);
/// 17 significant digits, as printf's %.17g: every double reads back as itself.
MPOPT_DECL void append_double(std::string& s, double x);
[[noreturn]] MPOPT_DECL void throw_error(const std::string& message);

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

/// The parts' text: strings as they are, numbers as printf's %.17g or %d would write them, bools
/// as true or false.
template <class... Parts>
std::string text_of(const Parts&... parts) {
  std::string s;
  (append_part(s, parts), ...);
  return s;
}

/// Throws mpopt::error with the parts' text (text_of).
template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw_error(text_of(parts...));
}

/// The most steps a checkpoint may count: 2^53, beyond which counts are no longer exact doubles
/// (bias corrections raise the betas to the step count in double). No run comes near it.
inline constexpr std::uint64_t max_steps = std::uint64_t{1} << 53;

/// A trust-ratio clamp [min_coeff, max_coeff] of `group` (LAMB, 1-bit LAMB) is an interval.
MPOPT_DECL void require_coeff_order(std::string_view group, double min_coeff, double max_coeff);

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "validate.ipp"
#endif
