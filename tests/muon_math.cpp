// Muon's element formulas (detail/math/muon_math.hpp) with its orthogonalization, step after step on
// one matrix, against the float64 Muon of muon_reference.hpp, written from torch.optim.Muon's
// documented algorithm: tall, wide and square matrices, Nesterov on and off, both rate adjustments,
// the iteration in fp32 and in bf16.
#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include <mpopt/detail/math/muon_math.hpp>
#include <mpopt/detail/math/newton_schulz.hpp>

#include "muon_reference.hpp"
#include "newton_schulz_reference.hpp"

namespace {

using mpopt::detail::muon_lr_adjustment;
using mpopt::detail::newton_schulz_precision;
using mpopt::detail::newton_schulz_settings;
using muon_reference::muon_settings;
using muon_reference::reference_step;

/// The same with muon_math.hpp's formulas in float and the orthogonalization of newton_schulz.hpp.
void float_step(std::vector<float>& p, std::vector<float>& buf, const std::vector<float>& g, std::size_t rows,
                std::size_t cols, const muon_settings& s, mpopt::detail::newton_schulz& ns) {
  const mpopt::detail::muon_coefficients c{.momentum = float(s.momentum),
                                           .one_minus_momentum = float(1 - s.momentum),
                                           .nesterov = s.nesterov,
                                           .decay = float(1 - s.lr * s.weight_decay)};
  std::vector<float> update(p.size());
  for (std::size_t k = 0; k < p.size(); ++k) update[k] = mpopt::detail::muon_momentum(g[k], buf[k], c);
  ns(update, rows, cols, s.ns);
  const float rate = float(mpopt::detail::muon_adjusted_lr(s.lr, rows, cols, s.adjustment));
  for (std::size_t k = 0; k < p.size(); ++k) p[k] = mpopt::detail::muon_apply(p[k], update[k], c.decay, rate);
}

}  // namespace

TEST_CASE("the adjusted rate is torch's _adjust_lr") {
  using mpopt::detail::muon_adjusted_lr;
  CHECK(muon_adjusted_lr(0.02, 768, 3072, muon_lr_adjustment::original) == 0.02);
  CHECK(muon_adjusted_lr(0.02, 3072, 768, muon_lr_adjustment::original) == doctest::Approx(0.04).epsilon(1e-15));
  CHECK(muon_adjusted_lr(1e-3, 768, 3072, muon_lr_adjustment::match_rms_adamw) ==
        doctest::Approx(0.2e-3 * std::sqrt(3072.0)).epsilon(1e-15));
  CHECK(muon_adjusted_lr(1e-3, 3072, 768, muon_lr_adjustment::match_rms_adamw) ==
        doctest::Approx(0.2e-3 * std::sqrt(3072.0)).epsilon(1e-15));
}

TEST_CASE("Muon's steps on one matrix follow the float64 algorithm: tall, wide, square, Nesterov on and off, both "
          "rate adjustments, the iteration in fp32 and bf16") {
  struct shape {
    std::size_t rows, cols;
  };
  mpopt::detail::newton_schulz ns;
  for (const shape& sh : {shape{12, 5}, shape{5, 12}, shape{8, 8}})
    for (bool nesterov : {true, false})
      for (auto adjustment : {muon_lr_adjustment::original, muon_lr_adjustment::match_rms_adamw})
        for (auto precision : {newton_schulz_precision::fp32, newton_schulz_precision::bf16}) {
          const std::size_t rows = sh.rows, cols = sh.cols, n = rows * cols;
          CAPTURE(rows);
          CAPTURE(cols);
          CAPTURE(nesterov);
          CAPTURE(int(adjustment));
          CAPTURE(int(precision));
          muon_settings s;
          s.nesterov = nesterov;
          s.adjustment = adjustment;
          s.ns.precision = precision;
          std::mt19937 gen(unsigned(rows * 31 + cols));
          std::normal_distribution<float> normal(0.0f, 1.0f);
          std::vector<float> p(n), buf(n, 0.0f), g(n);
          for (float& v : p) v = 0.1f * normal(gen);
          std::vector<double> p_ref(p.begin(), p.end()), b_ref(n, 0.0);
          const std::vector<double> p0 = p_ref;
          for (int step = 1; step <= 6; ++step) {
            CAPTURE(step);
            for (float& v : g) v = 0.01f * normal(gen);
            reference_step(p_ref, b_ref, g, rows, cols, s);
            float_step(p, buf, g, rows, cols, s, ns);
            // The buffer: torch's, (1 - mu) times the documented one, to float rounding.
            std::vector<double> scaled(b_ref);
            for (double& v : scaled) v *= 1 - s.momentum;
            CHECK(newton_schulz_reference::relative_error(buf, scaled) < 1e-6);
            // The parameters' movement: to float rounding (observed: at most 2e-6). In bf16 a value
            // within float error of a bf16 midpoint may round the other way than the reference's
            // exact one (a BLAS sums in its own order), costing about 1e-3; one rounding left out
            // costs 2-4%.
            std::vector<double> moved(n), want(n);
            for (std::size_t k = 0; k < n; ++k) moved[k] = double(p[k]) - p0[k], want[k] = p_ref[k] - p0[k];
            CHECK(newton_schulz_reference::relative_error(moved, want) < (precision == newton_schulz_precision::fp32 ? 1e-5 : 5e-3));
          }
        }
}
