// mpopt — memory_report's definitions (memory_report.hpp): inline header-only, else compiled once
// by <mpopt/src.hpp>.
#pragma once

#include "memory_report.hpp"

#include <cstdio>

namespace mpopt {

MPOPT_DECL std::string memory_report::to_string() const {
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

MPOPT_DECL std::size_t memory_report::sum(bool owned) const {
  std::size_t n = 0;
  for (const auto& b : buffers)
    if (b.owned == owned) n += b.bytes;
  return n;
}

}  // namespace mpopt
