// mpopt — one JSON object of a configuration file, read key by key: each value is checked for its
// type and range, and every message starts with the key's path ("zero_optimization.stage"). Keys
// the reader does not list are refused, so a misspelt key never goes unnoticed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "validate.hpp"

namespace mpopt::detail {

/// A JSON value as messages show it, cut short.
inline std::string json_brief(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

class config_object {
 public:
  /// `path` names the object in messages ("" for the top level).
  config_object(const nlohmann::json& j, std::string path) : j_(&j), path_(std::move(path)) {
    if (!j.is_object()) fail(path_.empty() ? "the configuration" : path_, " must be a JSON object, got ", json_brief(j));
  }

  const nlohmann::json& json() const { return *j_; }
  const std::string& path() const { return path_; }

  /// The path of `key` in this object.
  std::string at(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }

  /// Refuses the first key (in sorted order) that `known` does not list, naming it and the known
  /// ones (`who` reads them: "Adam", "mpopt").
  void allow_only(std::initializer_list<std::string_view> known, std::string_view who) const {
    for (const auto& item : j_->items()) {
      if (std::find(known.begin(), known.end(), std::string_view(item.key())) != known.end()) continue;
      std::string list;
      for (std::string_view k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      fail(at(item.key()), ": unknown key (", who, " reads ", list, ")");
    }
  }

  /// Whether `key` is there (with any value).
  bool has(std::string_view key) const { return j_->contains(std::string(key)); }

  /// The value of `key`, or null when it is absent. "auto" is refused: it is a placeholder that
  /// the Hugging Face Trainer replaces before DeepSpeed sees the file.
  const nlohmann::json* find(std::string_view key) const {
    const auto it = j_->find(std::string(key));
    if (it == j_->end()) return nullptr;
    if (it->is_string() && it->get_ref<const std::string&>() == "auto")
      fail(at(key), ": \"auto\" is a placeholder that the Hugging Face Trainer fills in; write the value itself");
    return &*it;
  }

  /// true or false (not 0 or 1, not a string).
  bool flag(std::string_view key, bool fallback) const {
    const nlohmann::json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail(at(key), " must be true or false, got ", json_brief(*v));
    return v->get<bool>();
  }

  /// A number (JSON has no infinities or NaN).
  double number(std::string_view key, double fallback) const {
    const nlohmann::json* v = find(key);
    if (!v) return fallback;
    if (!v->is_number()) fail(at(key), " must be a number, got ", json_brief(*v));
    return v->get<double>();
  }

  /// A whole number in [lo, hi]; written as an integer or as a float with nothing after the point
  /// (DeepSpeed's documentation writes bucket sizes as 5e8).
  std::int64_t integer(std::string_view key, std::int64_t fallback, std::int64_t lo, std::int64_t hi) const {
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

  /// A string.
  std::string text(std::string_view key, std::string fallback) const {
    const nlohmann::json* v = find(key);
    if (!v) return fallback;
    if (!v->is_string()) fail(at(key), " must be a string, got ", json_brief(*v));
    return v->get<std::string>();
  }

 private:
  const nlohmann::json* j_;
  std::string path_;
};

}  // namespace mpopt::detail
