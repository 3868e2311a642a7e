// mpopt — what the overflow-and-norm pass decides about a step: skip it, or multiply the gradients
// by the unscale times the clip coefficient. The device backend decides (replicated, no host read
// sits between the norm and the update, whose passes read the decision where they run; under ZeRO
// the host reads it before the update); the host backend across ranks, sum_by_shard and 1-bit LAMB
// decide on the host, by the same rule, and hand the decision to the backend.
#pragma once

#include <cmath>
#include <cstddef>

#include "../config.hpp"

namespace mpopt::detail {

/// One step's decision; the status reads it after the update.
struct step_decision {
  double sumsq = 0;      ///< squared global L2 norm of the true gradient (local: this rank's share)
  double nonfinite = 0;  ///< chunks holding inf or NaN (a count: it comes from a sum)
  double norm = 0;       ///< global L2 norm of the true gradient
  double clip = 1;       ///< clip coefficient, 1 when not clipped
  float grad_scale = 1;  ///< what the update passes multiply the gradients by: unscale * clip
  bool skip = false;     ///< skipped: the update passes see empty chunks and change nothing
};

/// The optimizer's options for this step, in the form the decision needs.
struct step_rule {
  double unscale;         ///< 1 / (loss scale * divisor * send scale)
  double local;           ///< the ranks whose norms sumsq adds (1-bit compression), else 1
  double clip_grad;       ///< max global norm; 0 disables clipping
  bool skip_nonfinite;

  /// Whether the update depends on the gradient's norm or finiteness (clipping, or skipping a
  /// non-finite step): only then must the gradient be read before the update.
  MPOPT_HOST_DEVICE bool needs_gradient_first() const { return clip_grad > 0 || skip_nonfinite; }

  /// d from its sums (sumsq, nonfinite). The squares are summed in double (square_sum64): finite
  /// gradients, even at FLT_MAX, give a finite norm and so a clip coefficient, never a skip. (Beyond
  /// a norm of about 1e38 clip_grad, the coefficient times the unscale is a float subnormal, with
  /// fewer bits.)
  MPOPT_HOST_DEVICE void decide(step_decision& d) const {
    d.skip = skip_nonfinite && d.nonfinite > 0;
    d.norm = ::sqrt(d.sumsq / local);
    const double c = clip_grad / (d.norm + 1e-6);
    d.clip = clip_grad > 0 && c < 1.0 ? c : 1.0;  // a NaN norm does not clip
    d.grad_scale = float(unscale * d.clip);
  }
};

/// The decision as a one-index kernel: sums[0] the squared norm, sums[1] the non-finite chunks.
struct decide_step {
  step_rule rule;
  const double* sums;
  step_decision* out;
  MPOPT_HOST_DEVICE void operator()(std::size_t) const {
    step_decision d;
    d.sumsq = sums[0];
    d.nonfinite = sums[1];
    rule.decide(d);
    *out = d;
  }
};

/// f, on a step the decision does not skip.
template <class F>
struct unless_skipped {
  const step_decision* decision;
  F f;
  MPOPT_HOST_DEVICE void operator()(std::size_t i) const {
    if (!decision->skip) f(i);
  }
};

}  // namespace mpopt::detail
