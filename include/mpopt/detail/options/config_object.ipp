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

MPOPT_DECL config_object::config_object(const nlohmann::json& j, std::string path) : j_(&j), path_(std::move(path)) {
  if (!j.is_object()) fail(path_.empty() ? "the configuration" : path_, " must be a JSON object, got ", json_brief(j));
}

MPOPT_DECL void config_object::allow_only(std::span<const std::string_view> known, std::string_view who) const {
  for (const auto& item : j_->items()) {
    if (std::find(known.begin(), known.end(), std::string_view(item.key())) != known.end()) continue;
    std::string list;
    for (std::string_view k : known) list += (list.empty() ? "" : ", ") + std::string(k);
    fail(at(item.key()), ": unknown key (", who, " reads ", list, ")");
  }
}

MPOPT_DECL const nlohmann::json* config_object::find(std::string_view key) const {
  const auto it = j_->find(std::string(key));
  if (it == j_->end()) return nullptr;
  if (it->is_string() && it->get_ref<const std::string&>() == "auto")
    fail(at(key), ": \"auto\" is a placeholder that the Hugging Face Trainer fills in; write the value itself");
  return &*it;
}

MPOPT_DECL bool config_object::flag(std::string_view key, bool fallback) const {
  const nlohmann::json* v = find(key);
  if (!v) return fallback;
  if (!v->is_boolean()) fail(at(key), " must be true or false, got ", json_brief(*v));
  return v->get<bool>();
}

MPOPT_DECL double config_object::number(std::string_view key, double fallback) const {
  const nlohmann::json* v = find(key);
  if (!v) return fallback;
  if (!v->is_number()) fail(at(key), " must be a number, got ", json_brief(*v));
  return v->get<double>();
}

MPOPT_DECL std::int64_t config_object::integer(std::string_view key, std::int64_t fallback, std::int64_t lo,
                                               std::int64_t hi) const {
  const nlohmann::json* v = find(key);
  if (!v) return fallback;
  auto refuse = [&] { fail(at(key), " must be an integer in [", lo, ", ", hi, "], got ", json_brief(*v)); };
  if (v->is_number_unsigned()) {
    const std::uint64_t x = v->get<std::uint64_t>();
    if (x > std::uint64_t(hi) || (lo > 0 && x < std::uint64_t(lo))) refuse();
    return std::int64_t(x);
  }
  if (v->is_number_integer()) {
    const std::int64_t x = v->get<std::int64_t>();
    if (x < lo || x > hi) refuse();
    return x;
  }
  if (v->is_number_float()) {
    const double x = v->get<double>();
    // Compared as doubles: hi may round up, so the cast below is checked again.
    if (!(std::floor(x) == x && x >= double(lo) && x <= double(hi)) || x >= 0x1p63) refuse();
    return std::int64_t(x);
  }
  refuse();
  return 0;
}

MPOPT_DECL std::string config_object::text(std::string_view key, std::string fallback) const {
  const nlohmann::json* v = find(key);
  if (!v) return fallback;
  if (!v->is_string()) fail(at(key), " must be a string, got ", json_brief(*v));
  return v->get<std::string>();
}

}  // namespace mpopt::detail
