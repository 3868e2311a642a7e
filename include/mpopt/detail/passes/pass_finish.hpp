// mpopt — what follows a summing pass once every chunk's sums are written: the step's sums (and
// decision) after the overflow-and-norm pass, a reducing rule's per-tensor sums and scales after its
// direction stage. Each is a kernel of one index that adds in order, as the host backend does; the
// device backend runs it in the pass's own kernel, by the block that finishes last (cuda.hpp), so
// the step needs no launch for it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../config.hpp"
#include "../math/step_decision.hpp"
#include "square_sum.hpp"

namespace mpopt::detail {

/// The overflow-and-norm pass's per-chunk results summed: sums[0] the squared norm, sums[1] the
/// non-finite chunks (step_sums); then, where nothing is to be agreed across ranks, the decision.
struct step_sums_finish {
  const double* chunk_sums;
  const std::uint8_t* chunk_nonfinite;
  std::size_t chunks;
  double* sums;
  bool decides;  ///< false: the ranks agree on the sums first, and decide after
  step_rule rule;
  step_decision* decision;

  /// rule null: no decision here.
  step_sums_finish(const double* s, const std::uint8_t* f, std::size_t n, double* out, const step_rule* r,
                   step_decision* d)
      : chunk_sums(s), chunk_nonfinite(f), chunks(n), sums(out), decides(r != nullptr), rule(r ? *r : step_rule{}),
        decision(d) {}

  MPOPT_HOST_DEVICE void operator()(std::size_t) const {
    sums[0] = sum_in_order(chunk_sums, 0, chunks);
    sums[1] = sum_in_order(chunk_nonfinite, 0, chunks);
    decide();
  }
  /// The decision from sums, where this finish makes it (one thread).
  MPOPT_HOST_DEVICE void decide() const {
    if (decides) decide_step{rule, sums, decision}(0);
  }
};

/// Per-chunk partials into per-tensor sums (segment_sum: sums[s] over [offsets[s], offsets[s + 1])),
/// then scale(t) for each of `tensors` tensors (a reducing rule's tensor_scales).
template <class Scale>
struct segments_finish {
  const float* partials;
  const std::size_t* offsets;
  std::size_t segments;
  double* sums;
  Scale scale;
  std::size_t tensors;

  MPOPT_HOST_DEVICE void operator()(std::size_t) const {
    for (std::size_t s = 0; s < segments; ++s) segment_sum<float>{partials, offsets, sums}(s);
    for (std::size_t t = 0; t < tensors; ++t) scale(t);
  }
};

}  // namespace mpopt::detail
