// mpopt — options with fields (fields.hpp) as JSON records, for checkpoints: each field under its
// name, a nested struct as an object. Compiled once, not once per options type; declared over
// nlohmann/json's forward declarations, so that the typed side of a checkpoint parses no JSON library.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "../config.hpp"
#include "field_refs.hpp"
#include "validate.hpp"

namespace mpopt::detail {

MPOPT_DECL nlohmann::json fields_json(std::span<const field_ref> fields);
/// The record as compact JSON text (what ranks compare).
MPOPT_DECL std::string fields_text(std::span<const field_ref> fields);

/// Reads every field from j, which must hold each with its type; `prefix` names them in messages.
/// Values are not checked here (check_fields), and members j has besides are ignored.
MPOPT_DECL void read_fields(const nlohmann::json& j, std::span<const field_ref> fields, const std::string& prefix);

/// Which of `names` record j holds: its one member, which must be one of them (chooses_fields).
MPOPT_DECL std::size_t chosen_member(const nlohmann::json& j, std::span<const std::string_view> names,
                                     const std::string& prefix);

/// An options object from a record fields_json wrote, unchecked.
template <class O>
O options_from_json(const nlohmann::json& j, const std::string& prefix) {
  O o{};
  if constexpr (chooses_fields<O>) o.choose(chosen_member(j, O::choices, prefix));
  read_fields(j, field_refs(o), prefix);
  return o;
}

/// An options object's record (where <nlohmann/json.hpp> is included), or its text.
template <class O, class Json = nlohmann::json>
Json options_json(const O& o) {
  return fields_json(field_refs(o));
}
template <class O>
std::string options_text(const O& o) {
  return fields_text(field_refs(o));
}

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "fields_json.ipp"
#endif
