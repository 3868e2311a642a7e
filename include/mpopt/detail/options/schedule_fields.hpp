// mpopt — each learning-rate schedule's fields (lr_schedule.hpp) by name, in DeepSpeed's order and
// under DeepSpeed's keys: what the configuration reader reads, checkpoints write and ranks compare.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "../../lr_schedule.hpp"

namespace mpopt::detail {

template <class S, class T>
struct schedule_field {
  using member_pointer = T S::*;
  std::string_view name;
  member_pointer member;
};
template <class S, class T>
schedule_field(std::string_view, T S::*) -> schedule_field<S, T>;

template <class S>
constexpr auto schedule_fields() {
  using F = std::string_view;
  if constexpr (std::is_same_v<S, warmup_lr>) {
    return std::tuple{schedule_field{F("warmup_min_lr"), &S::warmup_min_lr},
                      schedule_field{F("warmup_max_lr"), &S::warmup_max_lr},
                      schedule_field{F("warmup_num_steps"), &S::warmup_num_steps},
                      schedule_field{F("warmup_type"), &S::warmup_type}};
  } else if constexpr (std::is_same_v<S, warmup_decay_lr>) {
    return std::tuple{schedule_field{F("total_num_steps"), &S::total_num_steps},
                      schedule_field{F("warmup_min_lr"), &S::warmup_min_lr},
                      schedule_field{F("warmup_max_lr"), &S::warmup_max_lr},
                      schedule_field{F("warmup_num_steps"), &S::warmup_num_steps},
                      schedule_field{F("warmup_type"), &S::warmup_type}};
  } else if constexpr (std::is_same_v<S, warmup_cosine_lr>) {
    return std::tuple{schedule_field{F("total_num_steps"), &S::total_num_steps},
                      schedule_field{F("warmup_min_ratio"), &S::warmup_min_ratio},
                      schedule_field{F("warmup_num_steps"), &S::warmup_num_steps},
                      schedule_field{F("cos_min_ratio"), &S::cos_min_ratio},
                      schedule_field{F("warmup_type"), &S::warmup_type}};
  } else if constexpr (std::is_same_v<S, one_cycle>) {
    return std::tuple{schedule_field{F("cycle_min_lr"), &S::cycle_min_lr},
                      schedule_field{F("cycle_max_lr"), &S::cycle_max_lr},
                      schedule_field{F("decay_lr_rate"), &S::decay_lr_rate},
                      schedule_field{F("cycle_first_step_size"), &S::cycle_first_step_size},
                      schedule_field{F("cycle_second_step_size"), &S::cycle_second_step_size},
                      schedule_field{F("cycle_first_stair_count"), &S::cycle_first_stair_count},
                      schedule_field{F("cycle_second_stair_count"), &S::cycle_second_stair_count},
                      schedule_field{F("decay_step_size"), &S::decay_step_size},
                      schedule_field{F("cycle_momentum"), &S::cycle_momentum},
                      schedule_field{F("cycle_min_mom"), &S::cycle_min_mom},
                      schedule_field{F("cycle_max_mom"), &S::cycle_max_mom},
                      schedule_field{F("decay_mom_rate"), &S::decay_mom_rate}};
  } else if constexpr (std::is_same_v<S, cosine_with_warmup>) {
    return std::tuple{schedule_field{F("warmup_steps"), &S::warmup_steps},
                      schedule_field{F("total_steps"), &S::total_steps},
                      schedule_field{F("min_ratio"), &S::min_ratio}};
  } else if constexpr (std::is_same_v<S, linear_with_warmup>) {
    return std::tuple{schedule_field{F("warmup_steps"), &S::warmup_steps},
                      schedule_field{F("total_steps"), &S::total_steps}};
  } else {
    static_assert(std::is_same_v<S, step_decay>, "a schedule of lr_schedule's variant");
    return std::tuple{schedule_field{F("step_size"), &S::step_size}, schedule_field{F("gamma"), &S::gamma}};
  }
}

/// The most fields any schedule has.
template <std::size_t... I>
constexpr std::size_t most_schedule_fields(std::index_sequence<I...>) {
  return std::max({std::tuple_size_v<decltype(schedule_fields<std::variant_alternative_t<I, lr_schedule>>())>...});
}
inline constexpr std::size_t most_fields_of_a_schedule =
    most_schedule_fields(std::make_index_sequence<std::variant_size_v<lr_schedule>>());

/// Calls f(name, member) for each field of schedule `s` (const or not), in order.
template <class S, class F>
void for_each_schedule_field(S& s, F&& f) {
  std::apply([&](const auto&... field) { (f(field.name, s.*field.member), ...); },
             schedule_fields<std::remove_const_t<S>>());
}

}  // namespace mpopt::detail
