// Command-line flags for the examples: a refused flag is a usage_error naming it and what it takes.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>

namespace example {

struct usage_error {
  std::string message;
};

/// The number `text` holds, at least `min` (and whole, for an integral T).
template <class T>
T parse_number(std::string_view flag, const std::string& text, T min) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  constexpr bool integral = std::is_integral_v<T>;
  if (text.empty() || *end != '\0' || errno != 0 || !std::isfinite(v) || v < double(min) ||
      (integral && (v != std::floor(v) || v > 1e15))) {
    char expected[64];
    std::snprintf(expected, sizeof expected, "%s >= %g", integral ? "an integer" : "a number", double(min));
    throw usage_error{std::string(flag) + " expects " + expected + ", got '" + text + "'"};
  }
  return T(v);
}

/// `value`, if it is one of `choices`.
inline const std::string& check_choice(std::string_view flag, const std::string& value,
                                       std::initializer_list<std::string_view> choices) {
  if (std::ranges::find(choices, value) != choices.end()) return value;
  std::string list;
  for (auto c : choices) {
    if (!list.empty()) list += '|';
    list += c;
  }
  throw usage_error{std::string(flag) + " must be " + list + ", got '" + value + "'"};
}

}  // namespace example
