// mpopt — the element math of 1-bit LAMB's compression stage (DeepSpeed deepspeed/runtime/fp16/onebit/
// lamb.py), shared by every backend. Warm-up is plain LAMB (lamb_math.hpp). Afterwards each rank
// advances its momentum with its local gradient, scales it (so all tensors compress at a similar
// magnitude), and the compressed all-reduce averages it; the variance stays frozen, and a fresh one,
// fed by the gradient the averaged momentum implies, only steers the per-tensor factor.
#pragma once

#include "../config.hpp"
#include "lamb_math.hpp"
#include "../lanes/lanes.hpp"

namespace mpopt::detail {

/// What this rank sends: scaling * (beta1 m + (1 - beta1) g), g its local gradient.
template <class V>
MPOPT_HOST_DEVICE V onebit_local_momentum(V g, V m, V scaling, const lamb_coefficients& c) {
  return lamb_first_moment(g, m, c) * scaling;
}

/// One element once the averaged momentum m_new is known (m_prev: the momentum before this step).
/// Advances the fresh variance with the reconstructed gradient (m_new - beta1 m_prev) / (1 - beta1)
/// and returns the direction u = m_new / (sqrt(v) + eps) + wd p with v frozen (lamb_direction),
/// setting u0 = u without decay and ratio = (sqrt(v) + eps) / (sqrt(v_fresh) + eps).
template <class V>
MPOPT_HOST_DEVICE V onebit_lamb_direction(V m_new, V m_prev, V& v_fresh, V v, V p, const lamb_coefficients& c,
                                          V& u0, V& ratio) {
  const V g = fma(V(-c.beta1), m_prev, m_new) / V(c.one_minus_beta1);
  v_fresh = fma(V(c.beta2), v_fresh, (V(c.one_minus_beta2) * g) * g);
  const V den = sqrt(v) + V(c.eps);
  u0 = m_new / den;
  ratio = den / (sqrt(v_fresh) + V(c.eps));
  return lamb_direction(m_new, v, p, c);
}

}  // namespace mpopt::detail
