// mpopt — the options of the 1-bit LAMB rule (onebit_lamb.hpp), on their own: what a configuration
// reader needs without the rule's driver.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <cfloat>
#include <cstdint>
#include <string>
#include <string_view>

#include "compression_options.hpp"
#include "detail/validate.hpp"

namespace mpopt {

/// Per parameter group. Defaults are DeepSpeed's OnebitLamb's. DeepSpeed counts its first call,
/// which only sets up state, as a step: its freeze_step F gives F - 1 warm-up updates, ours F.
struct onebit_lamb_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double min_coeff = 0.01;  ///< clamp of the warm-up LAMB coefficient
  double max_coeff = 10.0;
  /// Warm-up steps of full LAMB before compressed communication starts (DeepSpeed's tutorial:
  /// 15-25% of training). The same for every group: the compression stage starts for all at once.
  std::uint64_t freeze_step = 100000;
  /// Running average of the warm-up coefficient; 1 / (1 - coeff_beta) should not exceed freeze_step.
  double coeff_beta = 0.9;
  double factor_max = 4.0;        ///< clamp of the compression-stage factor
  double factor_min = 0.5;
  double factor_threshold = 0.1;  ///< the factor moves at most this fraction per step
  /// The compressed all-reduce's choices (compression_options.hpp); the same in every group.
  compression_options compression = {};

  void validate(std::string_view group) const {
    const std::string g(group);
    detail::require_adam_family(g, *this);
    compression.validate(g);
    detail::require_coeff_clamp(g, *this);
    if (freeze_step < 1)
      detail::fail(g, ".freeze_step must be >= 1, got 0: the frozen variance and coefficient come from warm-up");
    detail::require_beta(g + ".coeff_beta", coeff_beta);
    detail::require_positive(g + ".factor_min", factor_min);
    detail::require_positive(g + ".factor_max", factor_max);
    if (factor_min > factor_max)
      detail::fail(g, ".factor_min (", factor_min, ") must be <= factor_max (", factor_max, ")");
    detail::require_non_negative(g + ".factor_threshold", factor_threshold);
    if (!(factor_threshold < 1)) detail::fail(g, ".factor_threshold must be < 1, got ", factor_threshold);
    // The update's float factor: lr times the frozen coefficient times the compression factor.
    const double largest = lr * max_coeff * factor_max;
    if (!(largest <= FLT_MAX))
      detail::fail(g, ".lr (", lr, ") times max_coeff (", max_coeff, ") and factor_max (", factor_max,
                   ") is beyond the largest float");
  }
};

}  // namespace mpopt
