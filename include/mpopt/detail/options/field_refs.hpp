// mpopt — the fields of one options object (fields.hpp) as runtime descriptors, and what is derived
// from them without knowing the options type: the checks and each field's value as text. Only
// field_refs() is a template, a few lines per options type; the rest is compiled once.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../fields.hpp"
#include "../config.hpp"
#include "validate.hpp"

namespace mpopt::detail {

enum class field_kind : std::uint8_t { number, flag, integer, choice, group };

/// One field of one options object: where its value is, and how to read it.
struct field_ref {
  std::string_view name;
  field_kind kind;
  void* at;                                   ///< the member in the object
  const check* rule = nullptr;                ///< number, integer
  std::uint8_t bytes = 0;                     ///< number (4 or 8), integer, choice
  bool is_signed = false;                     ///< integer, choice
  std::span<const std::string_view> choices = {};  ///< choice: the names, by underlying value
  std::vector<field_ref> (*members)(void*) = nullptr;  ///< group: the nested struct's fields
};

template <class O>
std::vector<field_ref> field_refs(O& o);

template <class T>
inline constexpr auto choice_names_of = choice_names(T{});

/// The descriptor of one row of O's table, bound to o.
template <class O, class T>
field_ref bind_field(const field<O, T>& f, O& o) {
  field_ref r{.name = f.name, .kind = field_kind::flag, .at = &(o.*f.member)};
  if constexpr (std::is_same_v<T, bool>) {
    return r;
  } else if constexpr (std::is_floating_point_v<T>) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "mpopt: a number field is a float or a double");
    r.kind = field_kind::number;
    r.rule = &f.rule;
    r.bytes = std::uint8_t(sizeof(T));
  } else if constexpr (std::is_integral_v<T>) {
    r.kind = field_kind::integer;
    r.rule = &f.rule;
    r.bytes = std::uint8_t(sizeof(T));
    r.is_signed = std::is_signed_v<T>;
  } else if constexpr (choice<T>) {
    using U = std::underlying_type_t<T>;
    r.kind = field_kind::choice;
    r.bytes = std::uint8_t(sizeof(U));
    r.is_signed = std::is_signed_v<U>;
    r.choices = choice_names_of<T>;
  } else {
    static_assert(described<T>, "mpopt: a field is a number, a bool, an integer, an enum with choice_names(E), or "
                                "a struct that declares `fields` (fields.hpp)");
    r.kind = field_kind::group;
    r.members = [](void* p) { return field_refs(*static_cast<T*>(p)); };
  }
  return r;
}

template <class O, std::size_t... I>
std::vector<field_ref> bind_fields(O& o, std::index_sequence<I...>) {
  return {bind_field(std::get<I>(O::fields), o)...};
}

/// Options that hold one of several options types (a rule set's: rules.hpp): their fields are one
/// record, named by what was chosen, holding the chosen options' fields.
template <class O>
concept chooses_fields = requires(O& o) {
  { o.chosen_fields() } -> std::same_as<std::vector<field_ref>>;
};

/// o's fields, in the order of its table.
template <class O>
std::vector<field_ref> field_refs(O& o) {
  if constexpr (chooses_fields<O>) {
    return o.chosen_fields();
  } else {
    static_assert(described<O>, "mpopt: this options type declares no `fields` table (fields.hpp)");
    return bind_fields(o, std::make_index_sequence<std::tuple_size_v<decltype(O::fields)>>());
  }
}
/// The record of options `chosen` as a field named `name` (chooses_fields).
template <class T>
field_ref chosen_record(std::string_view name, T& chosen) {
  return {.name = name, .kind = field_kind::group, .at = &chosen,
          .members = [](void* p) { return field_refs(*static_cast<T*>(p)); }};
}
template <class O>
std::vector<field_ref> field_refs(const O& o) {
  return field_refs(const_cast<O&>(o));  // read only
}

// Reading and writing a value through its descriptor.

MPOPT_DECL double number_value(const field_ref& f);
MPOPT_DECL void set_number(const field_ref& f, double x);

/// An integer field's value, widened: `negative` with its magnitude.
struct wide_integer {
  bool negative = false;
  std::uint64_t magnitude = 0;
};

MPOPT_DECL wide_integer integer_value(const field_ref& f);

/// The largest magnitude the field holds, with sign `negative`.
MPOPT_DECL std::uint64_t integer_limit(const field_ref& f, bool negative);

/// Writes v; false (changing nothing) if the field cannot hold it.
MPOPT_DECL bool set_integer(const field_ref& f, wide_integer v);
/// v as a double for a check, rounded away from zero where it has no double of its own (beyond
/// 2^53): a value past a bound then never rounds back onto it.
MPOPT_DECL double integer_outward(wide_integer v);

MPOPT_DECL bool flag_value(const field_ref& f);

/// A choice's index (its underlying value); -1 if it is negative.
MPOPT_DECL std::int64_t choice_index(const field_ref& f);
MPOPT_DECL std::string_view choice_name(const field_ref& f);

/// The index of `name` among `names`; an error naming `field` if it is none of them.
MPOPT_DECL std::size_t find_choice(std::span<const std::string_view> names, std::string_view name,
                                   std::string_view field);

/// The value of choice E named `name`; an error naming `field` if there is none.
template <choice E>
E choice_of(std::string_view name, std::string_view field) {
  return E(find_choice(choice_names_of<E>, name, field));
}

/// The shortest text that reads back as x.
MPOPT_DECL std::string shortest_text(double x);

/// A leaf field's value as text, exactly: numbers in the shortest form that reads back as them.
MPOPT_DECL std::string field_text(const field_ref& f);

/// Throws naming `name` if x (the field's value) fails c; the message shows `shown` where given (an
/// integer's exact text), else x.
MPOPT_DECL void require_check(const std::string& name, double x, const check& c, std::string_view shown = {});

/// Checks every field (nested ones too), naming each as prefix + name.
MPOPT_DECL void check_fields(std::span<const field_ref> fields, const std::string& prefix);

/// What a struct with fields declares beyond them: a check involving several fields.
template <class O>
concept validates = requires(const O& o, std::string_view where) { o.validate(where); };

/// o's fields checked, then (where O has one) its validate(); `label` names o in messages ("group
/// 0"; empty for top-level options).
template <class O>
void check_options(const O& o, std::string_view label) {
  check_fields(field_refs(o), label.empty() ? std::string() : std::string(label) + ".");
  if constexpr (validates<O>) o.validate(label);
}

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "field_refs.ipp"
#endif
