// mpopt — the options of the 1-bit LAMB rule (onebit_lamb.hpp), on their own: what a configuration
// reader needs without the rule's driver.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <cfloat>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>

#include "compression_options.hpp"
#include "detail/options/validate.hpp"
#include "detail/options/adam_family.hpp"
#include "fields.hpp"

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

  static constexpr auto fields = std::tuple_cat(detail::adam_family_fields<onebit_lamb_options>(), mpopt::fields(
      field{"min_coeff", &onebit_lamb_options::min_coeff, checks::at_least(0)},
      field{"max_coeff", &onebit_lamb_options::max_coeff, checks::above(0)},
      field{"freeze_step", &onebit_lamb_options::freeze_step,
            checks::at_least(1).because("the frozen variance and coefficient come from warm-up")},
      field{"coeff_beta", &onebit_lamb_options::coeff_beta, checks::beta},
      field{"factor_max", &onebit_lamb_options::factor_max, checks::above(0)},
      field{"factor_min", &onebit_lamb_options::factor_min, checks::above(0)},
      field{"factor_threshold", &onebit_lamb_options::factor_threshold, checks::half_open(0, 1)},
      field{"compression", &onebit_lamb_options::compression}));

  /// The clamps are intervals, and the update's float factor fits a float: lr times the frozen
  /// coefficient times the compression factor.
  void validate(std::string_view group) const {
    detail::require_coeff_order(group, min_coeff, max_coeff);
    if (factor_min > factor_max)
      detail::fail(group, ".factor_min (", factor_min, ") must be <= factor_max (", factor_max, ")");
    const double largest = lr * max_coeff * factor_max;
    if (!(largest <= FLT_MAX))
      detail::fail(group, ".lr (", lr, ") times max_coeff (", max_coeff, ") and factor_max (", factor_max,
                   ") is beyond the largest float");
  }
};

}  // namespace mpopt
