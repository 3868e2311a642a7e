// mpopt — the step accounting's definitions (step_counts.hpp): inline header-only, else compiled
// once by <mpopt/src.hpp>.
#pragma once

#include "step_counts.hpp"

namespace mpopt::detail {

MPOPT_DECL std::string nonfinite_report(const work_list& work, const std::uint8_t* chunk_nonfinite,
                                        std::size_t tensors,
                                        const std::function<const std::string&(std::size_t)>& name_of) {
  std::string names;
  std::size_t count = 0;
  for (std::size_t t = 0; t < tensors; ++t) {
    bool bad = false;
    for (std::size_t c = work.first_chunk(t); c < work.first_chunk(t + 1); ++c) bad |= chunk_nonfinite[c] != 0;
    if (!bad) continue;
    if (++count > 8) continue;
    if (!names.empty()) names += ", ";
    names.append("'").append(name_of(t)).append("'");
  }
  if (count == 0) return "no local gradient is non-finite: another rank's is";
  return "non-finite gradients in " + names + (count > 8 ? " and " + std::to_string(count - 8) + " more" : "");
}

}  // namespace mpopt::detail
