// mpopt — the fields of one options object (fields.hpp) as runtime descriptors, and what is derived
// from them without knowing the options type: the checks and each field's value as text. Only
// field_refs() is a template, a few lines per options type; the rest is compiled once.
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../fields.hpp"
#include "config.hpp"
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

/// o's fields, in the order of its table.
template <class O>
std::vector<field_ref> field_refs(O& o) {
  static_assert(described<O>, "mpopt: this options type declares no `fields` table (fields.hpp)");
  return bind_fields(o, std::make_index_sequence<std::tuple_size_v<decltype(O::fields)>>());
}
template <class O>
std::vector<field_ref> field_refs(const O& o) {
  return field_refs(const_cast<O&>(o));  // read only
}

// Reading and writing a value through its descriptor.

MPOPT_COLD inline double number_value(const field_ref& f) {
  if (f.bytes == 4) {
    float x;
    std::memcpy(&x, f.at, 4);
    return x;
  }
  double x;
  std::memcpy(&x, f.at, 8);
  return x;
}
MPOPT_COLD inline void set_number(const field_ref& f, double x) {
  if (f.bytes == 4) {
    const float y = float(x);
    std::memcpy(f.at, &y, 4);
  } else {
    std::memcpy(f.at, &x, 8);
  }
}

/// An integer field's value, widened: `negative` with its magnitude.
struct wide_integer {
  bool negative = false;
  std::uint64_t magnitude = 0;
};

MPOPT_COLD inline wide_integer integer_value(const field_ref& f) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, f.at, f.bytes);  // little-endian: the low bytes
  const unsigned width = 8u * f.bytes;
  if (f.is_signed && width < 64 && (bits >> (width - 1)) & 1) bits |= ~std::uint64_t(0) << width;  // sign-extend
  if (f.is_signed && std::int64_t(bits) < 0) return {true, ~bits + 1};
  return {false, bits};
}

/// The largest magnitude the field holds, with sign `negative`.
MPOPT_COLD inline std::uint64_t integer_limit(const field_ref& f, bool negative) {
  const unsigned width = 8u * f.bytes - (f.is_signed ? 1 : 0);
  const std::uint64_t most = width >= 64 ? ~std::uint64_t(0) : (std::uint64_t(1) << width) - 1;
  if (!negative) return most;
  return f.is_signed ? most + 1 : 0;
}

/// Writes v; false (changing nothing) if the field cannot hold it.
MPOPT_COLD inline bool set_integer(const field_ref& f, wide_integer v) {
  if (v.magnitude > integer_limit(f, v.negative)) return false;
  const std::uint64_t bits = v.negative ? ~v.magnitude + 1 : v.magnitude;
  std::memcpy(f.at, &bits, f.bytes);
  return true;
}

MPOPT_COLD inline double integer_as_double(wide_integer v) {
  return v.negative ? -double(v.magnitude) : double(v.magnitude);
}

MPOPT_COLD inline bool flag_value(const field_ref& f) { return *static_cast<const bool*>(f.at); }

/// A choice's index (its underlying value); -1 if it is negative.
MPOPT_COLD inline std::int64_t choice_index(const field_ref& f) {
  const wide_integer v = integer_value(f);
  return v.negative ? -1 : std::int64_t(v.magnitude);
}
MPOPT_COLD inline std::string_view choice_name(const field_ref& f) {
  const std::int64_t i = choice_index(f);
  return i >= 0 && std::size_t(i) < f.choices.size() ? f.choices[std::size_t(i)] : std::string_view("(invalid)");
}

/// The index of `name` among `names`; an error naming `field` if it is none of them.
MPOPT_COLD inline std::size_t find_choice(std::span<const std::string_view> names, std::string_view name,
                                          std::string_view field) {
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return i;
  std::string listed;
  for (const std::string_view n : names) listed += (listed.empty() ? "\"" : ", \"") + std::string(n) + "\"";
  fail(field, " must be one of ", listed, ", got \"", name, "\"");
}

/// The value of choice E named `name`; an error naming `field` if there is none.
template <choice E>
E choice_of(std::string_view name, std::string_view field) {
  return E(find_choice(choice_names_of<E>, name, field));
}

/// The shortest text that reads back as x.
MPOPT_COLD inline std::string shortest_text(double x) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, x).ptr;
  return std::string(text, end);
}

/// A leaf field's value as text, exactly: numbers in the shortest form that reads back as them.
MPOPT_COLD inline std::string field_text(const field_ref& f) {
  std::string s;
  switch (f.kind) {
    case field_kind::number: s = shortest_text(number_value(f)); break;
    case field_kind::flag: s = flag_value(f) ? "true" : "false"; break;
    case field_kind::integer: {
      const wide_integer v = integer_value(f);
      if (v.negative) s = "-";
      append_unsigned(s, v.magnitude);
      break;
    }
    case field_kind::choice: s = choice_name(f); break;
    case field_kind::group: s = "{...}"; break;
  }
  return s;
}

/// Throws naming `name` if x (the field's value) fails c.
MPOPT_COLD inline void require_check(const std::string& name, double x, const check& c) {
  const std::string_view why = c.why;
  auto failed = [&](auto... bound) { fail(name, " must be ", bound..., ", got ", x, why.empty() ? "" : ": ", why); };
  if (!std::isfinite(x)) failed("a finite number");
  if (c.as_float && !(std::fabs(x) <= FLT_MAX)) failed("finite as a float (at most ", FLT_MAX, ")");
  const bool low = c.lo_open ? !(x > c.lo) : !(x >= c.lo), high = c.hi_open ? !(x < c.hi) : !(x <= c.hi);
  if (!low && !high) return;
  const bool bounded_below = std::isfinite(c.lo), bounded_above = std::isfinite(c.hi);
  if (bounded_below && bounded_above)
    failed("in ", c.lo_open ? "(" : "[", c.lo, ", ", c.hi, c.hi_open ? ")" : "]");
  if (bounded_below) failed(c.lo_open ? "> " : ">= ", c.lo);
  failed(c.hi_open ? "< " : "<= ", c.hi);
}

/// Checks every field (nested ones too), naming each as prefix + name.
MPOPT_COLD inline void check_fields(std::span<const field_ref> fields, const std::string& prefix) {
  for (const field_ref& f : fields) {
    const std::string name = prefix + std::string(f.name);
    switch (f.kind) {
      case field_kind::number: require_check(name, number_value(f), *f.rule); break;
      case field_kind::integer: require_check(name, integer_as_double(integer_value(f)), *f.rule); break;
      case field_kind::choice:
        if (choice_index(f) < 0 || std::size_t(choice_index(f)) >= f.choices.size())
          fail(name, " holds no valid choice (", field_text(f), ")");
        break;
      case field_kind::group: check_fields(f.members(f.at), name + "."); break;
      case field_kind::flag: break;
    }
  }
}

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
