// mpopt — the configuration reader's definitions (config_object.hpp): inline header-only, else
// compiled once by <mpopt/src.hpp>.
#pragma once

#include "config_object.hpp"

#include <algorithm>
#include <cmath>

namespace mpopt::detail {

MPOPT_DECL std::string json_brief(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

MPOPT_DECL void config_problems::add(std::string message) {
  if (std::find(list_.begin(), list_.end(), message) == list_.end()) list_.push_back(std::move(message));
}

MPOPT_DECL void config_problems::raise() const {
  if (list_.empty()) return;
  if (list_.size() == 1) throw_error(list_.front());
  std::string all = std::to_string(list_.size()) + " problems:";
  for (const std::string& p : list_) (all += "\n  ") += p;
  throw_error(all);
}

MPOPT_DECL config_object::config_object(const nlohmann::json& j, std::string path, config_problems* problems)
    : j_(&j), path_(std::move(path)), problems_(problems) {
  if (!j.is_object()) fail(path_.empty() ? "the configuration" : path_, " must be a JSON object, got ", json_brief(j));
}

MPOPT_DECL void config_object::allow_only(std::span<const std::string_view> known, std::string_view who) const {
  for (const auto& item : j_->items()) {
    if (std::find(known.begin(), known.end(), std::string_view(item.key())) != known.end()) continue;
    std::string list;
    for (std::string_view k : known) list += (list.empty() ? "" : ", ") + std::string(k);
    refuse(at(item.key()), ": unknown key (", who, " reads ", list, ")");
  }
}

MPOPT_DECL const nlohmann::json* config_object::find(std::string_view key) const {
  const auto it = j_->find(std::string(key));
  if (it == j_->end()) return nullptr;
  if (it->is_string() && it->get_ref<const std::string&>() == "auto") {
    refuse(at(key), ": \"auto\" is a placeholder that the Hugging Face Trainer fills in; write the value, or give "
                    "it in deepspeed_config::read's auto_values");
    return nullptr;
  }
  return &*it;
}

MPOPT_DECL bool config_object::flag(std::string_view key, bool fallback) const {
  const nlohmann::json* v = find(key);
  if (!v) return fallback;
  if (v->is_boolean()) return v->get<bool>();
  refuse(at(key), " must be true or false, got ", json_brief(*v));
  return fallback;
}

MPOPT_DECL double config_object::number(std::string_view key, double fallback) const {
  const nlohmann::json* v = find(key);
  if (!v) return fallback;
  if (v->is_number()) return v->get<double>();
  refuse(at(key), " must be a number, got ", json_brief(*v));
  return fallback;
}

MPOPT_DECL std::optional<std::int64_t> config_object::integer_if(std::string_view key, std::int64_t lo,
                                                                 std::int64_t hi) const {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) {
    const std::uint64_t x = v->get<std::uint64_t>();
    if (x <= std::uint64_t(hi) && (lo <= 0 || x >= std::uint64_t(lo))) return std::int64_t(x);
  } else if (v->is_number_integer()) {
    const std::int64_t x = v->get<std::int64_t>();
    if (x >= lo && x <= hi) return x;
  } else if (v->is_number_float()) {
    const double x = v->get<double>();
    // Compared as doubles: hi may round up, so the cast below is checked again.
    if (std::floor(x) == x && x >= double(lo) && x <= double(hi) && x < 0x1p63) return std::int64_t(x);
  }
  refuse(at(key), " must be an integer in [", lo, ", ", hi, "], got ", json_brief(*v));
  return std::nullopt;
}

MPOPT_DECL std::string config_object::text(std::string_view key, std::string fallback) const {
  const nlohmann::json* v = find(key);
  if (!v) return fallback;
  if (v->is_string()) return v->get<std::string>();
  refuse(at(key), " must be a string, got ", json_brief(*v));
  return fallback;
}

}  // namespace mpopt::detail
