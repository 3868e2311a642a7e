// mpopt — one JSON object of a configuration file, read key by key: each value is checked for its
// type and range, and every message starts with the key's path ("zero_optimization.stage"). Keys
// the reader does not list are refused, so a misspelt key never goes unnoticed.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "../config.hpp"
#include "validate.hpp"

namespace mpopt::detail {

/// A JSON value as messages show it, cut short.
MPOPT_DECL std::string json_brief(const nlohmann::json& v);

class config_object {
 public:
  /// `path` names the object in messages ("" for the top level).
  MPOPT_DECL config_object(const nlohmann::json& j, std::string path);

  const nlohmann::json& json() const { return *j_; }
  const std::string& path() const { return path_; }

  /// The path of `key` in this object.
  std::string at(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }

  /// Refuses the first key (in sorted order) that `known` does not list, naming it and the known
  /// ones (`who` reads them: "Adam", "mpopt").
  MPOPT_DECL void allow_only(std::span<const std::string_view> known, std::string_view who) const;
  void allow_only(std::initializer_list<std::string_view> known, std::string_view who) const {
    allow_only(std::span<const std::string_view>(known.begin(), known.size()), who);
  }

  /// Whether `key` is there (with any value).
  bool has(std::string_view key) const { return j_->contains(std::string(key)); }

  /// The value of `key`, or null when it is absent. "auto" is refused: it is a placeholder that
  /// the Hugging Face Trainer replaces before DeepSpeed sees the file.
  MPOPT_DECL const nlohmann::json* find(std::string_view key) const;

  /// true or false (not 0 or 1, not a string).
  MPOPT_DECL bool flag(std::string_view key, bool fallback) const;

  /// A number (JSON has no infinities or NaN).
  MPOPT_DECL double number(std::string_view key, double fallback) const;

  /// A whole number in [lo, hi]; written as an integer or as a float with nothing after the point
  /// (DeepSpeed's documentation writes bucket sizes as 5e8).
  MPOPT_DECL std::int64_t integer(std::string_view key, std::int64_t fallback, std::int64_t lo, std::int64_t hi) const;

  /// A string.
  MPOPT_DECL std::string text(std::string_view key, std::string fallback) const;

 private:
  const nlohmann::json* j_;
  std::string path_;
};

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "config_object.ipp"
#endif
