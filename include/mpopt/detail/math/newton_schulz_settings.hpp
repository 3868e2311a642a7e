// mpopt — what Muon's orthogonalization (newton_schulz.hpp) is told: apart from it, so that the rule
// vocabulary (rule.hpp) names it without a BLAS.
#pragma once

namespace mpopt::detail {

/// How the iteration keeps its values.
enum class newton_schulz_precision { fp32, bf16 };

/// The iteration: the quintic's coefficients, the steps and the norm's floor (torch.optim.Muon's
/// defaults, from Keller Jordan's Muon).
struct newton_schulz_settings {
  double a = 3.4445, b = -4.7750, c = 2.0315;
  int steps = 5;
  double eps = 1e-7;
  newton_schulz_precision precision = newton_schulz_precision::fp32;
};

}  // namespace mpopt::detail
