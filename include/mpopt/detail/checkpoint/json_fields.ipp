// mpopt — the checked metadata reads' definitions (json_fields.hpp): inline header-only, else
// compiled once by <mpopt/src.hpp>.
#pragma once

#include "json_fields.hpp"

namespace mpopt::detail {

MPOPT_DECL const nlohmann::json& json_field(const nlohmann::json& parent, std::string_view key, std::string_view name) {
  if (!parent.is_object()) fail(name.empty() ? key : name, ": its parent is not a JSON object");
  const auto it = parent.find(std::string(key));
  if (it == parent.end()) fail(name.empty() ? key : name, " is missing");
  return *it;
}

MPOPT_DECL std::uint64_t json_count(const nlohmann::json& parent, std::string_view key, std::uint64_t hi,
                                    std::string_view name) {
  const nlohmann::json& v = json_field(parent, key, name);
  const bool whole = v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0);
  if (!whole || v.get<std::uint64_t>() > hi)
    fail(name.empty() ? key : name, " must be an integer in [0, ", hi, "], got ", v.dump());
  return v.get<std::uint64_t>();
}

MPOPT_DECL std::int64_t json_integer(const nlohmann::json& parent, std::string_view key, std::int64_t lo,
                                     std::int64_t hi, std::string_view name) {
  const nlohmann::json& v = json_field(parent, key, name);
  const bool fits = v.is_number_integer() && !(v.is_number_unsigned() && v.get<std::uint64_t>() > std::uint64_t(hi));
  if (!fits || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
    fail(name.empty() ? key : name, " must be an integer in [", lo, ", ", hi, "], got ", v.dump());
  return v.get<std::int64_t>();
}

MPOPT_DECL double json_number(const nlohmann::json& parent, std::string_view key, std::string_view name) {
  const nlohmann::json& v = json_field(parent, key, name);
  if (!v.is_number()) fail(name.empty() ? key : name, " must be a number, got ", v.dump());
  return v.get<double>();
}

MPOPT_DECL bool json_flag(const nlohmann::json& parent, std::string_view key, std::string_view name) {
  const nlohmann::json& v = json_field(parent, key, name);
  if (!v.is_boolean()) fail(name.empty() ? key : name, " must be true or false, got ", v.dump());
  return v.get<bool>();
}

}  // namespace mpopt::detail
