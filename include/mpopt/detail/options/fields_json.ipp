// mpopt — the JSON records' definitions (fields_json.hpp): inline header-only, else compiled once
// by <mpopt/src.hpp>.
#pragma once

#include "fields_json.hpp"

#include <cstdint>

#include <nlohmann/json.hpp>

#include "../checkpoint/json_fields.hpp"

namespace mpopt::detail {

MPOPT_DECL nlohmann::json fields_json(std::span<const field_ref> fields) {
  nlohmann::json j = nlohmann::json::object();
  for (const field_ref& f : fields) {
    nlohmann::json& v = j[std::string(f.name)];
    switch (f.kind) {
      case field_kind::number: v = number_value(f); break;
      case field_kind::flag: v = flag_value(f); break;
      case field_kind::integer: {
        const wide_integer x = integer_value(f);
        if (x.negative) v = -std::int64_t(x.magnitude - 1) - 1;
        else v = x.magnitude;
        break;
      }
      case field_kind::choice: v = std::string(choice_name(f)); break;
      case field_kind::group: v = fields_json(f.members(f.at)); break;
    }
  }
  return j;
}

MPOPT_DECL std::string fields_text(std::span<const field_ref> fields) { return fields_json(fields).dump(); }

MPOPT_DECL std::size_t chosen_member(const nlohmann::json& j, std::span<const std::string_view> names,
                                     const std::string& prefix) {
  std::string expected;
  for (const std::string_view n : names) expected += (expected.empty() ? "" : ", ") + std::string(n);
  if (!j.is_object() || j.size() != 1)
    fail(prefix.empty() ? std::string("options") : prefix, " must be a JSON object with one member, the rule the group "
         "takes (one of ", expected, "), got ", j.dump());
  return find_choice(names, j.begin().key(), prefix.empty() ? std::string("rule") : prefix + "rule");
}

MPOPT_DECL void read_fields(const nlohmann::json& j, std::span<const field_ref> fields, const std::string& prefix) {
  for (const field_ref& f : fields) {
    const std::string name = prefix + std::string(f.name);
    const nlohmann::json& v = json_field(j, f.name, name);
    switch (f.kind) {
      case field_kind::number: set_number(f, json_number(j, f.name, name)); break;
      case field_kind::flag: *static_cast<bool*>(f.at) = json_flag(j, f.name, name); break;
      case field_kind::integer: {
        wide_integer x;
        if (v.is_number_unsigned()) x = {false, v.get<std::uint64_t>()};
        else if (v.is_number_integer()) x = {v.get<std::int64_t>() < 0, std::uint64_t(v.get<std::int64_t>())};
        else fail(name, " must be an integer, got ", v.dump());
        if (x.negative) x.magnitude = ~x.magnitude + 1;
        if (!set_integer(f, x)) fail(name, " does not fit its integer type, got ", v.dump());
        break;
      }
      case field_kind::choice:
        if (!v.is_string()) fail(name, " must be a string, got ", v.dump());
        set_integer(f, {false, find_choice(f.choices, v.get<std::string>(), name)});
        break;
      case field_kind::group: {
        if (!v.is_object()) fail(name, " must be a JSON object, got ", v.dump());
        read_fields(v, f.members(f.at), name + ".");
        break;
      }
    }
  }
}

}  // namespace mpopt::detail
