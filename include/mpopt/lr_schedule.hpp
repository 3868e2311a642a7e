// mpopt — learning-rate schedules. Before each step, the optimizer sets every group's rate from the
// number of steps that group has applied, k (skipped steps do not count: DeepSpeed's engine does not
// step its scheduler on an overflow), and the group's own rate, its base (what add_group, set_lr or
// set_options gave it; a schedule never changes it):
//   opt.set_schedule(mpopt::warmup_cosine_lr{.total_num_steps = 10000, .warmup_num_steps = 500});
// DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR and OneCycle follow deepspeed/runtime/
// lr_schedules.py, defaults included: the step after k applied steps uses what DeepSpeed's scheduler
// gives at last_batch_iteration = k - 1 (for k = 0, what it sets when it is made). Three shapes
// PyTorch users know follow the rate of LambdaLR at last_epoch = k: linear warm-up then cosine or
// linear decay (transformers' get_cosine_with_min_lr_schedule_with_warmup and
// get_linear_schedule_with_warmup) and step decay (torch's StepLR).
// docs/design.md §3.13 has the formulas.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "detail/config.hpp"

namespace mpopt {

/// How a DeepSpeed warm-up rises from its start to its end: log(k) / log(steps), or k / steps.
enum class warmup_shape : std::uint8_t { log, linear };
constexpr std::array<std::string_view, 2> choice_names(warmup_shape) { return {"log", "linear"}; }

/// WarmupLR: from warmup_min_lr to warmup_max_lr over warmup_num_steps, then warmup_max_lr.
struct warmup_lr {
  double warmup_min_lr = 0.0;
  std::optional<double> warmup_max_lr = std::nullopt;  ///< unset: each group's base rate (DeepSpeed's None)
  std::int64_t warmup_num_steps = 1000;  ///< at least 1; the rise takes max(2, it) steps
  warmup_shape warmup_type = warmup_shape::log;
};

/// WarmupDecayLR: WarmupLR's rise, then linearly to 0 at total_num_steps.
struct warmup_decay_lr {
  std::int64_t total_num_steps = 0;  ///< required: at least 1
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  std::int64_t warmup_num_steps = 1000;
  warmup_shape warmup_type = warmup_shape::log;
};

/// WarmupCosineLR: each group's base rate times a ratio rising from warmup_min_ratio to 1, then
/// falling along a cosine to cos_min_ratio at total_num_steps, where it stays.
struct warmup_cosine_lr {
  std::int64_t total_num_steps = 0;  ///< required: at least 1
  double warmup_min_ratio = 0.0;
  std::int64_t warmup_num_steps = 1000;
  double cos_min_ratio = 0.0001;
  warmup_shape warmup_type = warmup_shape::log;
};

/// OneCycle: up from cycle_min_lr to cycle_max_lr over cycle_first_step_size steps and back over
/// cycle_second_step_size (in stairs, where a stair count is set), then cycle_min_lr / (1 +
/// decay_lr_rate * steps since / decay_step_size). With cycle_momentum, beta1 cycles the other way,
/// between cycle_max_mom and cycle_min_mom, and beta2 is 0.99, as DeepSpeed sets them (under a rule
/// set, in the groups whose rule has betas).
struct one_cycle {
  std::optional<double> cycle_min_lr = std::nullopt;  ///< required
  std::optional<double> cycle_max_lr = std::nullopt;  ///< required
  double decay_lr_rate = 0.0;
  double cycle_first_step_size = 2000;
  std::optional<double> cycle_second_step_size = std::nullopt;  ///< unset: cycle_first_step_size
  std::int64_t cycle_first_stair_count = 0;       ///< 0: no stairs
  std::optional<std::int64_t> cycle_second_stair_count = std::nullopt;  ///< unset: cycle_first_stair_count
  double decay_step_size = 0;                     ///< 0: no decay after the cycle
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;  ///< mpopt takes only 0: DeepSpeed's (1 + rate * i) leaves [0, 1)
};

/// Linear warm-up from 0, then a half cosine from the base rate down to min_ratio of it at
/// total_steps, where it stays.
struct cosine_with_warmup {
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 0;  ///< required: above warmup_steps
  double min_ratio = 0.0;
};

/// Linear warm-up from 0, then linearly down to 0 at total_steps, where it stays.
struct linear_with_warmup {
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 0;  ///< required: above warmup_steps
};

/// The base rate times gamma for every step_size steps applied.
struct step_decay {
  std::int64_t step_size = 0;  ///< required: at least 1
  double gamma = 0.1;
};

using lr_schedule =
    std::variant<warmup_lr, warmup_decay_lr, warmup_cosine_lr, one_cycle, cosine_with_warmup, linear_with_warmup,
                 step_decay>;

/// A schedule's name, as DeepSpeed's configuration writes it where it has one.
MPOPT_DECL std::string_view schedule_name(const lr_schedule& s);

/// Throws mpopt::error naming the field if `s` has one out of range or a required one unset.
MPOPT_DECL void validate(const lr_schedule& s);

/// The rate of the step after k applied steps, for a group of base rate `base`.
MPOPT_DECL double scheduled_rate(const lr_schedule& s, std::uint64_t k, double base);

/// The betas of that step where the schedule sets them (OneCycle with cycle_momentum).
struct scheduled_betas {
  double beta1, beta2;
};
MPOPT_DECL std::optional<scheduled_betas> scheduled_momentum(const lr_schedule& s, std::uint64_t k);

namespace detail {
/// The schedule as (name, value) pairs for ranks to compare, as many whatever the schedule: its
/// type ("none" where none), then each field ("WarmupLR.warmup_num_steps", "1000"), then blanks.
MPOPT_DECL std::vector<std::pair<std::string, std::string>> schedule_settings(const std::optional<lr_schedule>& s);
}  // namespace detail

}  // namespace mpopt

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "lr_schedule.ipp"
#endif
