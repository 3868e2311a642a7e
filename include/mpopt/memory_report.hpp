// mpopt — what memory the optimizer uses on this rank, buffer by buffer, so users can check it
// against what they measure (and against the ZeRO formulas once state is partitioned).
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace mpopt {

struct memory_buffer {
  std::string name;
  std::string purpose;
  std::size_t bytes = 0;
  bool owned = true;  ///< allocated by the optimizer; false for the user's own tensors
};

struct memory_report {
  std::vector<memory_buffer> buffers;

  std::size_t owned_bytes() const { return sum(true); }
  std::size_t user_bytes() const { return sum(false); }

  /// One line per buffer, then the totals.
  std::string to_string() const {
    std::string out;
    char line[256];
    for (const auto& b : buffers) {
      std::snprintf(line, sizeof line, "  %-26s %12zu B  %s%s\n", b.name.c_str(), b.bytes, b.purpose.c_str(),
                    b.owned ? "" : " (yours)");
      out += line;
    }
    std::snprintf(line, sizeof line, "  %-26s %12zu B  (+ %zu B in your tensors)\n", "optimizer total",
                  owned_bytes(), user_bytes());
    return out + line;
  }

 private:
  std::size_t sum(bool owned) const {
    std::size_t n = 0;
    for (const auto& b : buffers)
      if (b.owned == owned) n += b.bytes;
    return n;
  }
};

}  // namespace mpopt
