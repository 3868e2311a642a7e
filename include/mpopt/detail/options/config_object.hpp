// mpopt — one JSON object of a configuration file, read key by key: each value is checked for its
// type and range, and every message starts with the key's path ("zero_optimization.stage"). Keys
// the reader does not list are refused, so a misspelt key never goes unnoticed. Read into a
// config_problems, every problem of a file is gathered and reported at once.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../error.hpp"
#include "../config.hpp"
#include "validate.hpp"

namespace mpopt::detail {

/// A JSON value as messages show it, cut short.
MPOPT_DECL std::string json_brief(const nlohmann::json& v);

/// The problems found reading one configuration, so that one run reports all of them.
class config_problems {
 public:
  MPOPT_DECL void add(std::string message);
  /// Runs f; an mpopt::error it throws becomes a problem, and the reading goes on.
  template <class F>
  void attempt(F&& f) {
    try {
      f();
    } catch (const error& e) {
      add(std::string(e.message()));
    }
  }
  bool empty() const { return list_.empty(); }
  /// Throws one mpopt::error naming every problem, if there is any: a single one as it is,
  /// several counted, one per line.
  MPOPT_DECL void raise() const;

 private:
  std::vector<std::string> list_;
};

class config_object {
 public:
  /// `path` names the object in messages ("" for the top level). Without `problems`, the first
  /// problem throws; with them, each is added there and the read goes on with the fallback.
  MPOPT_DECL config_object(const nlohmann::json& j, std::string path, config_problems* problems = nullptr);
  /// A member object, whose problems go where its parent's do.
  config_object(const nlohmann::json& j, std::string path, const config_object& parent)
      : config_object(j, std::move(path), parent.problems_) {}

  const nlohmann::json& json() const { return *j_; }
  const std::string& path() const { return path_; }

  /// The path of `key` in this object.
  std::string at(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }

  /// Refuses each key (in sorted order) that `known` does not list, naming it and the known ones
  /// (`who` reads them: "Adam", "mpopt").
  MPOPT_DECL void allow_only(std::span<const std::string_view> known, std::string_view who) const;
  void allow_only(std::initializer_list<std::string_view> known, std::string_view who) const {
    allow_only(std::span<const std::string_view>(known.begin(), known.size()), who);
  }

  /// Whether `key` is there (with any value).
  bool has(std::string_view key) const { return j_->contains(std::string(key)); }

  /// The value of `key`, or null when it is absent. "auto" is refused (and read as absent): it is a
  /// placeholder that the Hugging Face Trainer replaces before DeepSpeed sees the file.
  MPOPT_DECL const nlohmann::json* find(std::string_view key) const;

  /// true or false (not 0 or 1, not a string).
  MPOPT_DECL bool flag(std::string_view key, bool fallback) const;

  /// A number (JSON has no infinities or NaN).
  MPOPT_DECL double number(std::string_view key, double fallback) const;

  /// A whole number in [lo, hi]; written as an integer or as a float with nothing after the point
  /// (DeepSpeed's documentation writes bucket sizes as 5e8).
  std::int64_t integer(std::string_view key, std::int64_t fallback, std::int64_t lo, std::int64_t hi) const {
    return integer_if(key, lo, hi).value_or(fallback);
  }
  /// The same, none where `key` is absent or refused.
  MPOPT_DECL std::optional<std::int64_t> integer_if(std::string_view key, std::int64_t lo, std::int64_t hi) const;

  /// A string.
  MPOPT_DECL std::string text(std::string_view key, std::string fallback) const;

  /// A problem with the parts' text (text_of): added to the problems, or thrown without them.
  template <class... Parts>
  void refuse(const Parts&... parts) const {
    if (!problems_) fail(parts...);
    problems_->add(text_of(parts...));
  }
  /// Runs f; without problems an mpopt::error it throws goes on up, with them it is added there.
  template <class F>
  void attempt(F&& f) const {
    if (problems_) problems_->attempt(f);
    else f();
  }

 private:
  const nlohmann::json* j_;
  std::string path_;
  config_problems* problems_;
};

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "config_object.ipp"
#endif
