// mpopt — Muon's element formulas around its orthogonalization (newton_schulz.hpp), as
// torch.optim.Muon computes them: the momentum, the update it hands to the iteration, the learning
// rate a matrix's shape adjusts, and the decoupled weight decay with the orthogonalized step.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "../config.hpp"
#include "../lanes/lanes.hpp"

namespace mpopt::detail {

/// How a matrix's shape scales Muon's rate: Keller Jordan's sqrt(max(1, rows / cols)), so that the
/// update's RMS does not depend on the shape, or Moonshot's 0.2 sqrt(max(rows, cols)), which matches
/// AdamW's update RMS so that AdamW's rate and weight decay carry over.
enum class muon_lr_adjustment { original, match_rms_adamw };

/// The rate of a rows x cols matrix's orthogonalized update (torch's _adjust_lr).
inline double muon_adjusted_lr(double lr, std::size_t rows, std::size_t cols, muon_lr_adjustment a) {
  const double r = double(rows), c = double(cols);
  return lr * (a == muon_lr_adjustment::original ? std::sqrt(std::max(1.0, r / c)) : 0.2 * std::sqrt(std::max(r, c)));
}

/// Per-group, per-step scalars of Muon's element formulas, rounded once from double.
struct muon_coefficients {
  float momentum;            ///< mu
  float one_minus_momentum;  ///< 1 - mu
  bool nesterov;
  float decay;               ///< 1 - lr * weight_decay, with the unadjusted rate
};

/// The momentum buffer as torch keeps it, buf = mu buf + (1 - mu) g (its documentation's
/// mu B + g, times 1 - mu), updated in place; returns what the iteration orthogonalizes:
/// (1 - mu) g + mu buf with Nesterov, else buf. g is the true, clipped gradient.
template <class V>
MPOPT_HOST_DEVICE V muon_momentum(V g, V& buf, const muon_coefficients& c) {
  const V mu(c.momentum), scaled_g = V(c.one_minus_momentum) * g;
  buf = fma(mu, buf, scaled_g);
  return c.nesterov ? fma(mu, buf, scaled_g) : buf;
}

/// The parameter after the step: decayed, then moved by the orthogonalized update o at the
/// shape-adjusted rate.
template <class V>
MPOPT_HOST_DEVICE V muon_apply(V p, V o, float decay, float adjusted_lr) {
  return fma(V(-adjusted_lr), o, V(decay) * p);
}

}  // namespace mpopt::detail
