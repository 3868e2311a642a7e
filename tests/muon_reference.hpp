// Muon in double, one step on one matrix, as torch.optim.Muon's documentation states it:
//   B = mu B + g;  B~ = g + mu B with Nesterov, else B;  O = NS(B~);
//   p = p - lr wd p;  p = p - lr' O,  lr' = lr sqrt(max(1, A/B)) or 0.2 lr sqrt(max(A, B)).
// torch's code keeps (1 - mu) B as the buffer, and orthogonalizes (1 - mu) B~: the same direction,
// which the normalization keeps but for eps and, in bf16, the roundings; so this hands the
// iteration (1 - mu) B~, and a test compares a buffer with (1 - mu) B.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include <mpopt/detail/math/muon_math.hpp>

#include "newton_schulz_reference.hpp"

namespace muon_reference {

using mpopt::detail::muon_lr_adjustment;
using mpopt::detail::newton_schulz_settings;

struct muon_settings {
  double lr = 0.02, weight_decay = 0.1, momentum = 0.95;
  bool nesterov = true;
  muon_lr_adjustment adjustment = muon_lr_adjustment::original;
  newton_schulz_settings ns;
};

/// The documented algorithm in double, one step on p (rows x cols) with buffer b and gradient g.
template <class G>
void reference_step(std::vector<double>& p, std::vector<double>& b, const std::vector<G>& g, std::size_t rows,
                    std::size_t cols, const muon_settings& s) {
  std::vector<double> update(p.size());
  for (std::size_t k = 0; k < p.size(); ++k) {
    b[k] = s.momentum * b[k] + double(g[k]);
    update[k] = (1 - s.momentum) * (s.nesterov ? double(g[k]) + s.momentum * b[k] : b[k]);  // torch's scale
  }
  const std::vector<double> o = newton_schulz_reference::reference(update, rows, cols, s.ns);
  const double A = double(rows), B = double(cols);
  const double rate = s.lr * (s.adjustment == muon_lr_adjustment::original ? std::sqrt(std::max(1.0, A / B))
                                                                            : 0.2 * std::sqrt(std::max(A, B)));
  for (std::size_t k = 0; k < p.size(); ++k) p[k] = p[k] - s.lr * s.weight_decay * p[k] - rate * o[k];
}

}  // namespace muon_reference
