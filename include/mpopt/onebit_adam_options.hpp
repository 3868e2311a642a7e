// mpopt — the options of the 1-bit Adam rule (onebit_adam.hpp), on their own: what a configuration
// reader needs without the rule's driver.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <cstdint>

#include "compression_options.hpp"
#include "detail/options/adam_family.hpp"
#include "fields.hpp"

namespace mpopt {

/// Per parameter group. Defaults are DeepSpeed's OnebitAdam's. DeepSpeed counts its first call,
/// which only sets up state, as a step: its freeze_step F gives F - 1 warm-up updates, ours F.
struct onebit_adam_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  ///< added to the update, as AdamW: u += wd p
  /// Warm-up steps of full Adam before compressed communication starts (DeepSpeed's tutorial:
  /// 15-25% of training). The same for every group: the compression stage starts for all at once.
  std::uint64_t freeze_step = 100000;
  /// The compressed all-reduce's choices (compression_options.hpp); the same in every group.
  compression_options compression = {};

  static constexpr auto fields = std::tuple_cat(detail::adam_family_fields<onebit_adam_options>(), mpopt::fields(
      field{"freeze_step", &onebit_adam_options::freeze_step,
            checks::at_least(1).because("the frozen variance comes from warm-up")},
      field{"compression", &onebit_adam_options::compression}));
};

}  // namespace mpopt
