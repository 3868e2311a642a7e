// mpopt — fields of checkpoint metadata, read with an exact type and range check. A file can hold
// anything JSON can: 1e30 where a counter belongs (converting it to an integer is undefined
// behaviour), -1 (which wraps), a string. Each read throws mpopt::error naming the field instead.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "validate.hpp"

namespace mpopt::detail {

/// parent[key], which must exist; `name` is the field as messages call it (key when empty).
inline const nlohmann::json& json_field(const nlohmann::json& parent, std::string_view key, std::string_view name = {}) {
  if (!parent.is_object()) fail(name.empty() ? key : name, ": its parent is not a JSON object");
  const auto it = parent.find(std::string(key));
  if (it == parent.end()) fail(name.empty() ? key : name, " is missing");
  return *it;
}

/// A count in [0, hi], written as a JSON integer: never a float, a string or a bool.
inline std::uint64_t json_count(const nlohmann::json& parent, std::string_view key, std::uint64_t hi,
                                std::string_view name = {}) {
  const nlohmann::json& v = json_field(parent, key, name);
  const bool whole = v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0);
  if (!whole || v.get<std::uint64_t>() > hi)
    fail(name.empty() ? key : name, " must be an integer in [0, ", hi, "], got ", v.dump());
  return v.get<std::uint64_t>();
}

/// An integer in [lo, hi], written as a JSON integer.
inline std::int64_t json_integer(const nlohmann::json& parent, std::string_view key, std::int64_t lo, std::int64_t hi,
                                 std::string_view name = {}) {
  const nlohmann::json& v = json_field(parent, key, name);
  const bool fits = v.is_number_integer() && !(v.is_number_unsigned() && v.get<std::uint64_t>() > std::uint64_t(hi));
  if (!fits || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
    fail(name.empty() ? key : name, " must be an integer in [", lo, ", ", hi, "], got ", v.dump());
  return v.get<std::int64_t>();
}

/// A number (integer or float; JSON has no infinities), as a double. Ranges are the options' checks.
inline double json_number(const nlohmann::json& parent, std::string_view key, std::string_view name = {}) {
  const nlohmann::json& v = json_field(parent, key, name);
  if (!v.is_number()) fail(name.empty() ? key : name, " must be a number, got ", v.dump());
  return v.get<double>();
}

/// true or false, nothing else (not 0 or 1).
inline bool json_flag(const nlohmann::json& parent, std::string_view key, std::string_view name = {}) {
  const nlohmann::json& v = json_field(parent, key, name);
  if (!v.is_boolean()) fail(name.empty() ? key : name, " must be true or false, got ", v.dump());
  return v.get<bool>();
}

}  // namespace mpopt::detail
