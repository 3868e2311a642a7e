// mpopt — the Muon update rule, as torch.optim.Muon computes it: momentum, then each matrix's
// momentum orthogonalized by a few Newton-Schulz steps (detail/math/newton_schulz.hpp, on the host's
// BLAS), decoupled weight decay, and a step at a rate its shape adjusts. A matrix rule (rule.hpp):
// every tensor of its groups is registered with its shape; more than two dimensions are flattened
// to the first by the rest. Needs OpenBLAS or BLIS (docs/install.md).
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "detail/config.hpp"
#include "detail/math/muon_math.hpp"
#include "matrix_rule.hpp"
#include "muon_options.hpp"

namespace mpopt {

struct muon {
  using lr_adjustment = muon_options::lr_adjustment;
  using iteration_precision = muon_options::iteration_precision;
  using options = muon_options;

  static constexpr std::string_view name = "muon";
  static constexpr std::array<std::string_view, 1> state = {"momentum_buffer"};

  struct scalars {
    detail::muon_coefficients element;
    double lr;
    lr_adjustment adjustment;
    detail::newton_schulz_settings iteration;
  };
  static scalars prepare(const options& o, std::uint64_t) {
    const auto& c = o.ns_coefficients;
    return {{float(o.momentum), float(1.0 - o.momentum), o.nesterov, float(1.0 - o.lr * o.weight_decay)},
            o.lr,
            o.adjust_lr_fn,
            {c.a, c.b, c.c, o.ns_steps, o.eps, o.ns_precision}};
  }

  /// The momentum, and what the matrix stage orthogonalizes.
  template <class E>
  MPOPT_HOST_DEVICE static void direction(const scalars& k, E& e) {
    auto buf = e.state(0);
    const auto u = detail::muon_momentum(e.grad(), buf, k.element);
    e.set_state(0, buf);
    e.set_matrix(u);
  }
  /// The orthogonalized update in place; the matrix's rate.
  template <class M>
  static float matrix(const scalars& k, M& m) {
    m.orthogonalize(k.iteration);
    return float(detail::muon_adjusted_lr(k.lr, m.rows(), m.cols(), k.adjustment));
  }
  /// The iteration's multiply-adds per step on a rows x cols matrix, m <= n its sides: the Gram
  /// matrix (half of m x n x m), (c A) A and B X; what a layer-wise partition balances.
  static double matrix_cost(std::size_t rows, std::size_t cols) {
    const double m = double(std::min(rows, cols)), n = double(std::max(rows, cols));
    return m * m * n / 2 + m * m * m + m * m * n;
  }
  template <class E>
  MPOPT_HOST_DEVICE static void update(const scalars& k, E& e) {
    e.set_param(detail::muon_apply(e.param(), e.matrix(), k.element.decay, e.tensor_scale()));
  }
};

}  // namespace mpopt
