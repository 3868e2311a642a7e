// mpopt — the one exception type the library throws.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <stdexcept>
#include <string>
#include <string_view>

namespace mpopt {

/// Thrown for every invalid option, mismatched tensor, corrupt file or unrecoverable numeric state.
/// The message names the offending field or tensor. When an operation throws, the optimizer's
/// observable state (parameters, masters, moments, counters, loss scale) is unchanged.
class error : public std::runtime_error {
 public:
  explicit error(const std::string& what) : std::runtime_error(std::string(prefix) + what) {}
  /// The message without the "mpopt: " prefix: for code that adds context and throws again.
  std::string_view message() const { return std::string_view(what()).substr(prefix.size()); }

 private:
  static constexpr std::string_view prefix = "mpopt: ";
};

}  // namespace mpopt
