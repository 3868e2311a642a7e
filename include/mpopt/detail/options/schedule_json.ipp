// mpopt — schedule_json's definitions (schedule_json.hpp): inline header-only, else compiled once
// by <mpopt/src.hpp>.
#pragma once

#include "schedule_json.hpp"

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../error.hpp"
#include "schedule_fields.hpp"

namespace mpopt::detail {

template <class T>
inline constexpr bool is_optional_field = false;
template <class T>
inline constexpr bool is_optional_field<std::optional<T>> = true;

MPOPT_DECL nlohmann::json schedule_json(const lr_schedule& schedule) {
  nlohmann::json params = nlohmann::json::object();
  std::visit(
      [&](const auto& s) {
        for_each_schedule_field(s, [&]<class T>(std::string_view name, const T& value) {
          nlohmann::json& out = params[std::string(name)];
          if constexpr (std::is_same_v<T, warmup_shape>) out = choice_names(value)[std::size_t(value)];
          else if constexpr (is_optional_field<T>) out = value ? nlohmann::json(*value) : nlohmann::json();
          else out = value;
        });
      },
      schedule);
  return {{"type", schedule_name(schedule)}, {"params", std::move(params)}};
}

/// The default-made schedule that `name` names, if any of the variant's does.
template <std::size_t... I>
std::optional<lr_schedule> schedule_named(std::string_view name, std::index_sequence<I...>) {
  for (const lr_schedule& s : {lr_schedule(std::in_place_index<I>)...})
    if (schedule_name(s) == name) return s;
  return std::nullopt;
}

/// Reads `key` of `o` into `value`, a field of one of the types a schedule's fields have.
template <class T>
void read_schedule_field(const config_object& o, std::string_view key, T& value) {
  const nlohmann::json* j = o.find(key);
  if (!j) return;
  if (j->is_array())
    fail(o.at(key), ": a list (a value per group) is not supported: mpopt's schedules take one value for every group");
  constexpr std::int64_t big = std::numeric_limits<std::int64_t>::max();
  if constexpr (is_optional_field<T>) {
    if (j->is_null()) {
      value.reset();
    } else {
      typename T::value_type v{};
      read_schedule_field(o, key, v);
      value = v;
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    value = o.flag(key, value);
  } else if constexpr (std::is_same_v<T, warmup_shape>) {
    const std::string name = o.text(key, "");
    const auto names = choice_names(value);
    std::size_t i = 0;
    while (i < names.size() && names[i] != name) ++i;
    if (i == names.size()) fail(o.at(key), " must be \"log\" or \"linear\", got ", json_brief(*j));
    value = warmup_shape(i);
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    value = o.integer(key, value, -big - 1, big);
  } else {
    static_assert(std::is_same_v<T, double>);
    value = o.number(key, value);
  }
}

MPOPT_DECL lr_schedule read_schedule(const config_object& block, schedule_source from) {
  const bool deepspeed = from == schedule_source::deepspeed_config;
  block.allow_only({"type", "params"}, "mpopt");
  const std::string type = block.text("type", "");
  constexpr std::size_t types = std::variant_size_v<lr_schedule>;
  std::optional<lr_schedule> made = schedule_named(type, std::make_index_sequence<types>{});
  constexpr std::size_t deepspeeds = 4;  // the variant's first: WarmupLR ... OneCycle
  if (deepspeed && made && made->index() >= deepspeeds) made.reset();
  if (!made) {
    if (!block.has("type")) fail(block.at("type"), ": required");
    if (deepspeed && type == "LRRangeTest")
      fail(block.at("type"), ": \"LRRangeTest\" is not supported (a range test for tuning the rate, not a schedule "
                             "to train with)");
    fail(block.at("type"), ": \"", type, "\" is not a schedule mpopt reads here (",
         deepspeed ? "DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR and OneCycle; torch.optim's schedulers "
                     "are not read, and mpopt::cosine_with_warmup, linear_with_warmup and step_decay are set in code"
                   : "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, cosine_with_warmup, linear_with_warmup, "
                     "step_decay",
         ")");
  }
  lr_schedule schedule = *made;
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json* given = block.find("params");
  const config_object params(given ? *given : empty, block.at("params"), block);
  std::visit(
      [&](auto& s) {
        std::vector<std::string_view> keys;
        for_each_schedule_field(s, [&](std::string_view name, const auto&) { keys.push_back(name); });
        if (deepspeed) keys.push_back("last_batch_iteration");
        params.allow_only(keys, type);
        for_each_schedule_field(s, [&](std::string_view name, auto& value) { read_schedule_field(params, name, value); });
      },
      schedule);
  if (deepspeed) {
    std::int64_t last = -1;
    read_schedule_field(params, "last_batch_iteration", last);
    if (last != -1)
      fail(params.at("last_batch_iteration"), ": only -1 (the start) is supported: a resumed run takes its place "
                                              "in the schedule from the optimizer's checkpoint");
  }
  try {
    validate(schedule);
  } catch (const error& e) {
    fail(block.path(), ": ", e.message());
  }
  return schedule;
}

}  // namespace mpopt::detail
