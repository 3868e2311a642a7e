// mpopt — the Adam/AdamW element update, shared by every backend.
#pragma once

#include "../config.hpp"
#include "../lanes/lanes.hpp"

namespace mpopt::detail {

/// Per-group, per-step scalars of one Adam update, precomputed in double on the host.
struct adam_coefficients {
  float lr;
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float inv_bias_correction1;  ///< 1 / (1 - beta1^t), or 1 without bias correction
  float inv_bias_correction2;  ///< 1 / (1 - beta2^t), or 1 without bias correction
  float eps;
  float weight_decay;
  bool decoupled;  ///< AdamW: decay added to the update; otherwise L2: added to the gradient
};

/// FusedAdam (DeepSpeed csrc/adam/multi_tensor_adam.cu): g is the true, clipped gradient; m and v are
/// updated in place; returns the new parameter.
template <class V>
MPOPT_HOST_DEVICE V adam_update(V g, V& m, V& v, V p, const adam_coefficients& c) {
  const V wd(c.weight_decay);
  if (!c.decoupled) g = fma(wd, p, g);
  m = fma(V(c.beta1), m, V(c.one_minus_beta1) * g);
  v = fma(V(c.beta2), v, (V(c.one_minus_beta2) * g) * g);
  V u = (m * V(c.inv_bias_correction1)) / (sqrt(v * V(c.inv_bias_correction2)) + V(c.eps));
  if (c.decoupled) u = fma(wd, p, u);
  return fma(V(-c.lr), u, p);
}

}  // namespace mpopt::detail
