// mpopt — the options of the 0/1 Adam rule (zero_one_adam.hpp), on their own: what a configuration
// reader needs without the rule's driver.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <cstdint>
#include <string>
#include <string_view>

#include "compression_options.hpp"
#include "detail/validate.hpp"

namespace mpopt {

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

  void validate(std::string_view group) const {
    const std::string g(group);
    detail::require_adam_family(g, *this);
    compression.validate(g);
    auto at_least_one = [&](const char* name, std::uint64_t x) {
      if (x < 1) detail::fail(g, ".", name, " must be >= 1, got 0");
    };
    at_least_one("var_update_scaler", var_update_scaler);
    at_least_one("local_step_scaler", local_step_scaler);
    at_least_one("local_step_clipper", local_step_clipper);
  }
};

}  // namespace mpopt
