// mpopt — the state accessors' checks (state_access.hpp): inline header-only, else compiled once by
// <mpopt/src.hpp>.
#pragma once

#include "state_access.hpp"

namespace mpopt::detail {

MPOPT_DECL void require_state(bool finalized, const char* accessor, std::size_t i, std::size_t registered) {
  if (!finalized)
    fail(accessor, "(", i, "): the optimizer state is made by finalize() or the first step(); call finalize() "
         "first (", registered, " tensors are registered)");
}

MPOPT_DECL std::uint64_t mask_hash(std::size_t i, std::span<const float> mask) {
  std::uint64_t h = 14695981039346656037ull;
  for (std::size_t k = 0; k < mask.size(); ++k) {
    if (mask[k] != 0.0f && mask[k] != 1.0f)
      fail("set_exp_avg_mask(", i, "): value ", k, " is ", mask[k], "; a mask holds 0 or 1");
    h = (h ^ (mask[k] != 0.0f ? 1u : 2u)) * 1099511628211ull;
  }
  return h;
}

}  // namespace mpopt::detail
