// mpopt — the options of the 0/1 Adam rule (zero_one_adam.hpp), on their own: what a configuration
// reader needs without the rule's driver.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <cstdint>

#include "compression_options.hpp"
#include "detail/options/adam_family.hpp"
#include "detail/options/validate.hpp"
#include "fields.hpp"

namespace mpopt {

namespace detail {
/// A count of steps, at least lo: at most max_steps, as a checkpoint's counts.
constexpr check step_count(double lo) { return checks::closed(lo, double(max_steps)); }
}  // namespace detail

/// Per parameter group. Defaults are DeepSpeed's ZeroOneAdam's. The schedule is DeepSpeed's in
/// its step count s, which counts the call that only sets up state: our applied step t is s - 1.
struct zero_one_adam_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  ///< added to the update, as AdamW: u += wd p
  /// Phase 1 lasts this many applied steps (the paper's largest T_v).
  std::uint64_t var_freeze_step = 100000;
  /// The interval between variance steps (1 at first) doubles after this many of them (kappa).
  std::uint64_t var_update_scaler = 16;
  /// The interval between sync steps in phase 2 (1 at first) doubles after this many phase-2
  /// steps (DeepSpeed's default is 32678, not 2^15) ...
  std::uint64_t local_step_scaler = 32678;
  /// ... up to this many steps (H).
  std::uint64_t local_step_clipper = 16;
  /// The compressed all-reduce's choices (compression_options.hpp); the same in every group.
  compression_options compression = {};

  static constexpr auto fields = std::tuple_cat(detail::adam_family_fields<zero_one_adam_options>(), mpopt::fields(
      field{"var_freeze_step", &zero_one_adam_options::var_freeze_step, detail::step_count(0)},
      field{"var_update_scaler", &zero_one_adam_options::var_update_scaler, detail::step_count(1)},
      field{"local_step_scaler", &zero_one_adam_options::local_step_scaler, detail::step_count(1)},
      field{"local_step_clipper", &zero_one_adam_options::local_step_clipper, detail::step_count(1)},
      field{"compression", &zero_one_adam_options::compression}));
};

}  // namespace mpopt
