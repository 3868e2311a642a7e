// mpopt — the LAMB element math, shared by every backend. LAMB needs per-tensor norms of the weights
// and of the update before any weight may change, so a step is two element passes: lamb_direction
// advances the moments and yields the update direction u (whose squares the backend sums per tensor);
// the second pass recomputes u from the stored moments, bit for bit, and applies lamb_apply
// (mpopt::lamb's stages, lamb.hpp).
#pragma once

#include <cmath>
#include <cstddef>

#include "../config.hpp"
#include "../lanes/lanes.hpp"

namespace mpopt::detail {

/// Per-group, per-step scalars of a LAMB update, precomputed in double on the host.
struct lamb_coefficients {
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float eps;
  float weight_decay;
  bool eps_inside_sqrt;
  double step_size;  ///< lr * sqrt(1 - beta2^t) / (1 - beta1^t), or lr
  double min_coeff, max_coeff;  ///< the trust ratio's clamp
};

/// FusedLamb (DeepSpeed csrc/lamb/fused_lamb_cuda_kernel.cu): uncorrected moments,
/// u = m / (sqrt(v) + eps) + wd * p (or sqrt(v + eps) with eps inside).
template <class V>
MPOPT_HOST_DEVICE V lamb_direction(V m, V v, V p, const lamb_coefficients& c) {
  const V den = c.eps_inside_sqrt ? sqrt(v + V(c.eps)) : sqrt(v) + V(c.eps);
  return fma(V(c.weight_decay), p, m / den);
}

/// beta1 m + (1 - beta1) g: the first moment after gradient g.
template <class V>
MPOPT_HOST_DEVICE V lamb_first_moment(V g, V m, const lamb_coefficients& c) {
  return fma(V(c.beta1), m, V(c.one_minus_beta1) * g);
}

/// Advances the moments with the true gradient g; returns the direction u.
template <class V>
MPOPT_HOST_DEVICE V lamb_moments(V g, V& m, V& v, V p, const lamb_coefficients& c) {
  m = lamb_first_moment(g, m, c);
  v = fma(V(c.beta2), v, (V(c.one_minus_beta2) * g) * g);
  return lamb_direction(m, v, p, c);
}

/// DeepSpeed's 1-bit Adam and 0/1 Adam move their moments and direction as FusedLamb does
/// (uncorrected, eps outside the root), without the trust ratio: the step size is lr.
template <class Options>
lamb_coefficients uncorrected_adam(const Options& o) {
  return {float(o.beta1), float(o.beta2), float(1.0 - o.beta1), float(1.0 - o.beta2), float(o.eps),
          float(o.weight_decay), false, o.lr, 1.0, 1.0};
}

/// p - alpha * u, with alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t) * trust_ratio for this tensor.
template <class V>
MPOPT_HOST_DEVICE V lamb_apply(V u, V p, float alpha) {
  return fma(V(-alpha), u, p);
}

/// One step of uncorrected_adam on an element view (rule.hpp): both moments, then p -= lr u.
template <class E>
MPOPT_HOST_DEVICE void uncorrected_adam_step(const lamb_coefficients& k, E& e) {
  auto m = e.state(0), v = e.state(1);
  const auto p = e.param();
  const auto u = lamb_moments(e.grad(), m, v, p, k);
  e.set_state(0, m);
  e.set_state(1, v);
  e.set_param(lamb_apply(u, p, float(k.step_size)));
}

/// FusedLamb's trust ratio: ||p|| / ||u|| clamped to [min_coeff, max_coeff]; 1 when either norm is 0.
MPOPT_HOST_DEVICE double lamb_trust_ratio(double weight_norm, double update_norm, double min_coeff,
                                          double max_coeff) {
  if (weight_norm == 0 || update_norm == 0) return 1.0;
  const double r = weight_norm / update_norm;
  return r < min_coeff ? min_coeff : (r > max_coeff ? max_coeff : r);
}

}  // namespace mpopt::detail
