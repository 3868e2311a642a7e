// mpopt — the learning-rate schedules' definitions (lr_schedule.hpp): inline header-only, else
// compiled once by <mpopt/src.hpp>. Each formula is DeepSpeed's or PyTorch's, operation for
// operation in double, so the rates match theirs to the last bit.
#pragma once

#include "lr_schedule.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numbers>
#include <string>
#include <type_traits>

#include "detail/options/field_refs.hpp"
#include "detail/options/schedule_fields.hpp"
#include "detail/options/validate.hpp"
#include "fields.hpp"

namespace mpopt {

namespace detail {

/// What a schedule's rate may be: a rate (>= 0, finite as a float).
inline void require_rate(std::string_view schedule, std::string_view field, double x) {
  require_check(std::string(schedule) + "." + std::string(field), x, checks::rate);
}
inline void require_in(std::string_view schedule, std::string_view field, double x, const check& c) {
  require_check(std::string(schedule) + "." + std::string(field), x, c);
}

/// DeepSpeed's warm-up fraction at last_batch_iteration `it` (0 <= it < steps): log(it + 1) /
/// log(steps), or it / steps.
inline double warmup_fraction(warmup_shape shape, double it, double steps) {
  if (shape == warmup_shape::linear) return it / steps;
  return (1.0 / std::log(steps)) * std::log(it + 1);
}

/// DeepSpeed's warm-up length: max(2, warmup_num_steps).
inline double warmup_steps_of(std::int64_t warmup_num_steps) { return double(std::max<std::int64_t>(2, warmup_num_steps)); }

/// OneCycle's position in its cycle at last_batch_iteration `it` (< the cycle's length), in [0, 1].
inline double one_cycle_scale(const one_cycle& s, double it) {
  const double first = s.cycle_first_step_size, second = s.cycle_second_step_size.value_or(first);
  const double total = first + second, step_ratio = first / total;
  const double batch = it + 1;
  const double cycle = std::floor(1 + batch / total);
  const double x = 1. + batch / total - cycle;
  double scale;
  std::int64_t stairs;
  if (x <= step_ratio) {
    scale = x / step_ratio;
    stairs = s.cycle_first_stair_count;
  } else {
    scale = (x - 1) / (step_ratio - 1);
    stairs = s.cycle_second_stair_count.value_or(s.cycle_first_stair_count);
  }
  if (stairs > 0) {  // held flat across each stair, from the integer offset in the cycle
    const double at = std::fmod(batch, total);
    const double position = at <= first ? at * double(stairs) / first : (total - at) * double(stairs) / second;
    scale = std::floor(position) / double(stairs);
  }
  return scale;
}

inline double one_cycle_length(const one_cycle& s) {
  return s.cycle_first_step_size + s.cycle_second_step_size.value_or(s.cycle_first_step_size);
}

}  // namespace detail

MPOPT_DECL std::string_view schedule_name(const lr_schedule& s) {
  constexpr std::string_view names[] = {"WarmupLR",           "WarmupDecayLR",      "WarmupCosineLR", "OneCycle",
                                        "cosine_with_warmup", "linear_with_warmup", "step_decay"};
  return names[s.index()];
}

MPOPT_DECL void validate(const lr_schedule& schedule) {
  using detail::require_in;
  using detail::require_rate;
  const std::string_view n = schedule_name(schedule);
  const check at_least_one = checks::closed(1, double(detail::max_steps));
  const check ratio = checks::closed(0, 1);
  auto warmup = [&](std::int64_t steps) { require_in(n, "warmup_num_steps", double(steps), at_least_one); };
  std::visit(
      [&](const auto& s) {
        using S = std::remove_cvref_t<decltype(s)>;
        if constexpr (std::is_same_v<S, warmup_lr>) {
          require_rate(n, "warmup_min_lr", s.warmup_min_lr);
          if (s.warmup_max_lr) require_rate(n, "warmup_max_lr", *s.warmup_max_lr);
          warmup(s.warmup_num_steps);
        } else if constexpr (std::is_same_v<S, warmup_decay_lr>) {
          require_in(n, "total_num_steps", double(s.total_num_steps), at_least_one);
          require_rate(n, "warmup_min_lr", s.warmup_min_lr);
          require_rate(n, "warmup_max_lr", s.warmup_max_lr);
          warmup(s.warmup_num_steps);
        } else if constexpr (std::is_same_v<S, warmup_cosine_lr>) {
          require_in(n, "total_num_steps", double(s.total_num_steps), at_least_one);
          require_in(n, "warmup_min_ratio", s.warmup_min_ratio, ratio);
          require_in(n, "cos_min_ratio", s.cos_min_ratio, ratio);
          warmup(s.warmup_num_steps);
        } else if constexpr (std::is_same_v<S, one_cycle>) {
          if (!s.cycle_min_lr || !s.cycle_max_lr)
            detail::fail(n, ": cycle_min_lr and cycle_max_lr are required (DeepSpeed has no defaults for them)");
          require_rate(n, "cycle_min_lr", *s.cycle_min_lr);
          require_rate(n, "cycle_max_lr", *s.cycle_max_lr);
          require_in(n, "decay_lr_rate", s.decay_lr_rate, checks::at_least(0));
          require_in(n, "cycle_first_step_size", s.cycle_first_step_size, checks::at_least(1));
          if (s.cycle_second_step_size) require_in(n, "cycle_second_step_size", *s.cycle_second_step_size, checks::at_least(1));
          require_in(n, "cycle_first_stair_count", double(s.cycle_first_stair_count), checks::at_least(0));
          if (s.cycle_second_stair_count)
            require_in(n, "cycle_second_stair_count", double(*s.cycle_second_stair_count), checks::at_least(0));
          require_in(n, "decay_step_size", s.decay_step_size, checks::at_least(0));
          if (s.cycle_momentum) {
            require_in(n, "cycle_min_mom", s.cycle_min_mom, checks::beta);
            require_in(n, "cycle_max_mom", s.cycle_max_mom, checks::beta);
            require_in(n, "decay_mom_rate", s.decay_mom_rate,
                       checks::closed(0, 0).because("DeepSpeed's momentum decay, beta1 * (1 + rate * i), leaves [0, 1)"));
          }
        } else if constexpr (std::is_same_v<S, cosine_with_warmup> || std::is_same_v<S, linear_with_warmup>) {
          require_in(n, "warmup_steps", double(s.warmup_steps), checks::closed(0, double(detail::max_steps)));
          require_in(n, "total_steps", double(s.total_steps),
                     checks::closed(double(s.warmup_steps) + 1, double(detail::max_steps)).because("above warmup_steps"));
          if constexpr (std::is_same_v<S, cosine_with_warmup>) require_in(n, "min_ratio", s.min_ratio, ratio);
        } else {
          require_in(n, "step_size", double(s.step_size), at_least_one);
          require_in(n, "gamma", s.gamma, ratio);
        }
      },
      schedule);
}

MPOPT_DECL double scheduled_rate(const lr_schedule& schedule, std::uint64_t k, double base) {
  const double it = double(k) - 1;  // DeepSpeed's last_batch_iteration
  return std::visit(
      [&](const auto& s) -> double {
        using S = std::remove_cvref_t<decltype(s)>;
        if constexpr (std::is_same_v<S, warmup_lr> || std::is_same_v<S, warmup_decay_lr>) {
          double max_lr;
          if constexpr (std::is_same_v<S, warmup_lr>) max_lr = s.warmup_max_lr.value_or(base);
          else max_lr = s.warmup_max_lr;
          const double delta = max_lr - s.warmup_min_lr;
          if (it < 0) return s.warmup_min_lr;
          const double steps = detail::warmup_steps_of(s.warmup_num_steps);
          double gamma = 1.0;
          if (it < steps) gamma = detail::warmup_fraction(s.warmup_type, it, steps);
          else if constexpr (std::is_same_v<S, warmup_decay_lr>)
            gamma = std::max(0.0, (double(s.total_num_steps) - it) / std::max(1.0, double(s.total_num_steps) - steps));
          return s.warmup_min_lr + delta * gamma;
        } else if constexpr (std::is_same_v<S, warmup_cosine_lr>) {
          if (it < 0) return 0.0;
          const double steps = detail::warmup_steps_of(s.warmup_num_steps);
          double ratio;
          if (it < steps) {
            ratio = s.warmup_min_ratio + detail::warmup_fraction(s.warmup_type, it, steps) * (1. - s.warmup_min_ratio);
          } else {
            const double progress = std::min(1.0, (it - steps + 1) / std::max(1.0, double(s.total_num_steps) - steps));
            ratio = std::max(0.0, s.cos_min_ratio + (1. - s.cos_min_ratio) * ((1 + std::cos(std::numbers::pi * progress)) / 2));
          }
          return base * ratio;
        } else if constexpr (std::is_same_v<S, one_cycle>) {
          const double min_lr = *s.cycle_min_lr, max_lr = *s.cycle_max_lr;
          if (it < 0) return min_lr;
          const double length = detail::one_cycle_length(s);
          if (it < length) return min_lr + (max_lr - min_lr) * detail::one_cycle_scale(s, it);
          if (s.decay_step_size == 0 || s.decay_lr_rate == 0) return min_lr;
          return min_lr / (1 + s.decay_lr_rate * ((it - length + 1) / s.decay_step_size));
        } else if constexpr (std::is_same_v<S, cosine_with_warmup>) {
          const double step = double(k), warmup = double(s.warmup_steps);
          if (step < warmup) return base * (step / std::max(1.0, warmup));
          const double progress = std::min(1.0, (step - warmup) / std::max(1.0, double(s.total_steps) - warmup));
          const double factor = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
          return base * std::max(0.0, factor * (1 - s.min_ratio) + s.min_ratio);
        } else if constexpr (std::is_same_v<S, linear_with_warmup>) {
          const double step = double(k), warmup = double(s.warmup_steps), total = double(s.total_steps);
          if (step < warmup) return base * (step / std::max(1.0, warmup));
          return base * std::max(0.0, (total - step) / std::max(1.0, total - warmup));
        } else {
          return base * std::pow(s.gamma, double(k / std::uint64_t(s.step_size)));
        }
      },
      schedule);
}

MPOPT_DECL std::optional<scheduled_betas> scheduled_momentum(const lr_schedule& schedule, std::uint64_t k) {
  const auto* s = std::get_if<one_cycle>(&schedule);
  if (!s || !s->cycle_momentum) return std::nullopt;
  const double it = double(k) - 1;
  if (it < 0) return scheduled_betas{s->cycle_min_mom, 0.99};
  if (it < detail::one_cycle_length(*s))
    return scheduled_betas{s->cycle_max_mom - (s->cycle_max_mom - s->cycle_min_mom) * detail::one_cycle_scale(*s, it), 0.99};
  return scheduled_betas{s->cycle_max_mom, 0.99};  // decay_mom_rate is 0
}

namespace detail {

/// Each field of `schedule` as f(name, value text).
template <class F>
void for_each_field_text(const lr_schedule& schedule, F&& f) {
  std::visit(
      [&](const auto& s) {
        for_each_schedule_field(s, [&]<class T>(std::string_view name, const T& value) {
          char number[32];
          auto text_of = [&](auto x) { return std::string(number, std::to_chars(number, number + sizeof number, x).ptr); };
          if constexpr (std::is_same_v<T, bool>) f(name, std::string(value ? "true" : "false"));
          else if constexpr (std::is_same_v<T, warmup_shape>) f(name, std::string(choice_names(value)[std::size_t(value)]));
          else if constexpr (std::is_arithmetic_v<T>) f(name, text_of(value));
          else f(name, value ? text_of(*value) : std::string("none"));  // std::optional
        });
      },
      schedule);
}

MPOPT_DECL std::vector<std::pair<std::string, std::string>> schedule_settings(const std::optional<lr_schedule>& s) {
  std::vector<std::pair<std::string, std::string>> settings{
      {"learning-rate schedule", s ? std::string(schedule_name(*s)) : "none"}};
  if (s)
    for_each_field_text(*s, [&](std::string_view name, std::string value) {
      settings.emplace_back(std::string(schedule_name(*s)) + "." + std::string(name), std::move(value));
    });
  settings.resize(1 + most_fields_of_a_schedule, {"learning-rate schedule's fields", ""});
  return settings;
}

}  // namespace detail

}  // namespace mpopt
