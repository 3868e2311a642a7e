// mpopt — the field descriptors' definitions (field_refs.hpp): inline header-only, else compiled
// once by <mpopt/src.hpp>.
#pragma once

#include "field_refs.hpp"

#include <charconv>
#include <cmath>
#include <cstring>

namespace mpopt::detail {

MPOPT_DECL double number_value(const field_ref& f) {
  if (f.bytes == 4) {
    float x;
    std::memcpy(&x, f.at, 4);
    return x;
  }
  double x;
  std::memcpy(&x, f.at, 8);
  return x;
}

MPOPT_DECL void set_number(const field_ref& f, double x) {
  if (f.bytes == 4) {
    const float y = float(x);
    std::memcpy(f.at, &y, 4);
  } else {
    std::memcpy(f.at, &x, 8);
  }
}

MPOPT_DECL wide_integer integer_value(const field_ref& f) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, f.at, f.bytes);  // little-endian: the low bytes
  const unsigned width = 8u * f.bytes;
  if (f.is_signed && width < 64 && (bits >> (width - 1)) & 1) bits |= ~std::uint64_t(0) << width;  // sign-extend
  if (f.is_signed && std::int64_t(bits) < 0) return {true, ~bits + 1};
  return {false, bits};
}

MPOPT_DECL std::uint64_t integer_limit(const field_ref& f, bool negative) {
  const unsigned width = 8u * f.bytes - (f.is_signed ? 1 : 0);
  const std::uint64_t most = width >= 64 ? ~std::uint64_t(0) : (std::uint64_t(1) << width) - 1;
  if (!negative) return most;
  return f.is_signed ? most + 1 : 0;
}

MPOPT_DECL bool set_integer(const field_ref& f, wide_integer v) {
  if (v.magnitude > integer_limit(f, v.negative)) return false;
  const std::uint64_t bits = v.negative ? ~v.magnitude + 1 : v.magnitude;
  std::memcpy(f.at, &bits, f.bytes);
  return true;
}

MPOPT_DECL double integer_outward(wide_integer v) {
  double d = double(v.magnitude);
  if (d < 0x1p64 && std::uint64_t(d) < v.magnitude) d = std::nextafter(d, HUGE_VAL);
  return v.negative ? -d : d;
}

MPOPT_DECL bool flag_value(const field_ref& f) { return *static_cast<const bool*>(f.at); }

MPOPT_DECL std::int64_t choice_index(const field_ref& f) {
  const wide_integer v = integer_value(f);
  return v.negative ? -1 : std::int64_t(v.magnitude);
}

MPOPT_DECL std::string_view choice_name(const field_ref& f) {
  const std::int64_t i = choice_index(f);
  return i >= 0 && std::size_t(i) < f.choices.size() ? f.choices[std::size_t(i)] : std::string_view("(invalid)");
}

MPOPT_DECL std::size_t find_choice(std::span<const std::string_view> names, std::string_view name,
                                   std::string_view field) {
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return i;
  std::string listed;
  for (const std::string_view n : names) listed += (listed.empty() ? "\"" : ", \"") + std::string(n) + "\"";
  fail(field, " must be one of ", listed, ", got \"", name, "\"");
}

MPOPT_DECL std::string shortest_text(double x) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, x).ptr;
  return std::string(text, end);
}

MPOPT_DECL std::string field_text(const field_ref& f) {
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

MPOPT_DECL void require_check(const std::string& name, double x, const check& c, std::string_view shown) {
  const std::string_view why = c.why;
  auto failed = [&](auto... bound) {
    if (shown.empty()) fail(name, " must be ", bound..., ", got ", x, why.empty() ? "" : ": ", why);
    fail(name, " must be ", bound..., ", got ", shown, why.empty() ? "" : ": ", why);
  };
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

MPOPT_DECL void check_fields(std::span<const field_ref> fields, const std::string& prefix) {
  for (const field_ref& f : fields) {
    const std::string name = prefix + std::string(f.name);
    switch (f.kind) {
      case field_kind::number: require_check(name, number_value(f), *f.rule); break;
      case field_kind::integer: require_check(name, integer_outward(integer_value(f)), *f.rule, field_text(f)); break;
      case field_kind::choice:
        if (const std::int64_t i = choice_index(f); i < 0 || std::size_t(i) >= f.choices.size())
          fail(name, " holds no valid choice (", field_text(f), ")");
        break;
      case field_kind::group: check_fields(f.members(f.at), name + "."); break;
      case field_kind::flag: break;
    }
  }
}

}  // namespace mpopt::detail
