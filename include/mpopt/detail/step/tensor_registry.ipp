// mpopt — the tensor registry's texts and checks (tensor_registry.hpp): inline header-only, else
// compiled once by <mpopt/src.hpp>.
#pragma once

#include "tensor_registry.hpp"

#include <limits>

namespace mpopt::detail {

MPOPT_DECL std::string shape_text(const tensor_shape& shape) {
  std::string s = "[";
  for (const std::int64_t d : shape.dims()) s += (s.size() > 1 ? ", " : "") + std::to_string(d);
  return s + "]";
}

MPOPT_DECL void check_shape(const std::string& name, const tensor_shape& shape, std::size_t size) {
  if (shape.empty()) return;
  std::uint64_t product = 1;
  bool overflow = false;
  for (const std::int64_t d : shape.dims()) {
    if (d < 0) fail("tensor '", name, "': shape ", shape_text(shape), " has a negative dimension");
    const auto ud = static_cast<std::uint64_t>(d);
    if (ud != 0 && product > std::numeric_limits<std::uint64_t>::max() / ud) overflow = true;
    product *= ud;
  }
  if (overflow || product != size)
    fail("tensor '", name, "': shape ", shape_text(shape), " holds ", overflow ? "more than 2^64" : std::to_string(product),
         " elements, the tensor has ", size);
}

}  // namespace mpopt::detail
