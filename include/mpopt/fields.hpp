// mpopt — options as data. An options struct declares its fields once, as a table of name, member
// and check; the optimizer derives from it the checks, the checkpoint record, the comparison across
// ranks and the configuration readers, in code compiled once rather than once per options type.
//
//   struct options {
//     double lr = 1e-4, beta1 = 0.9;
//     bool nesterov = false;
//     static constexpr auto fields = mpopt::fields(
//         mpopt::field{"lr", &options::lr, mpopt::checks::rate},
//         mpopt::field{"beta1", &options::beta1, mpopt::checks::beta},
//         mpopt::field{"nesterov", &options::nesterov});
//     void validate(std::string_view group) const;  // optional: what involves several fields
//   };
//
// A field is a number (double or float: always finite, as JSON has no infinities), a flag (bool),
// an integer, a choice (an enum whose names `choice_names(E)` gives, found by argument-dependent
// lookup), or a struct that declares fields of its own (kept as a nested record).
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <array>
#include <cfloat>
#include <limits>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace mpopt {

/// What a number or integer field must satisfy, besides being finite; a failure names the field.
struct check {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;
  bool as_float = false;      ///< finite as a float too: the backends compute with it as one
  std::string_view why = {};  ///< said after a failure, as ": why"

  constexpr check within_float() const {
    check c = *this;
    c.as_float = true;
    return c;
  }
  constexpr check because(std::string_view reason) const {
    check c = *this;
    c.why = reason;
    return c;
  }
};

/// The checks of the built-in options; a rule of yours may use these or make its own.
namespace checks {
constexpr check at_least(double lo) { return {.lo = lo}; }
constexpr check above(double lo) { return {.lo = lo, .lo_open = true}; }
constexpr check closed(double lo, double hi) { return {.lo = lo, .hi = hi}; }                      ///< [lo, hi]
constexpr check half_open(double lo, double hi) { return {.lo = lo, .hi = hi, .hi_open = true}; }  ///< [lo, hi)
/// [0, 1): an exponential-average coefficient.
inline constexpr check beta = half_open(0, 1);
/// >= 0 and finite as a float: a learning rate or a weight decay.
inline constexpr check rate = at_least(0).within_float();
/// A float divisor (eps): a normal float, neither rounded to 0 nor flushed to 0 where denormals are.
inline constexpr check divisor = at_least(FLT_MIN).within_float().because("the smallest normal float, as it divides");
/// A factor whose reciprocal the backends use too: both normal floats, in [2^-126, 2^126].
inline constexpr check float_scale = closed(FLT_MIN, 1 / FLT_MIN).because("it and its reciprocal are normal floats");
}  // namespace checks

/// One row of an options table: the field's name (its key in checkpoints and messages), its member,
/// and what its value must satisfy.
template <class Owner, class T>
struct field {
  using member_pointer = T Owner::*;  // named: nvcc's host pass words a bare one with parentheses g++ warns of
  std::string_view name;
  member_pointer member;
  check rule = {};
};
template <class Owner, class T>
field(std::string_view, T Owner::*, check = {}) -> field<Owner, T>;

/// An options struct's table: `static constexpr auto fields = mpopt::fields(...)`.
template <class Owner, class... T>
constexpr std::tuple<field<Owner, T>...> fields(field<Owner, T>... f) {
  return {f...};
}

namespace detail {
template <class Owner, class Table>
inline constexpr bool is_field_table = false;
template <class Owner, class... T>
inline constexpr bool is_field_table<Owner, std::tuple<field<Owner, T>...>> = true;
}  // namespace detail

/// An options struct that declares its fields.
template <class O>
concept described = std::is_class_v<O> && requires {
  requires detail::is_field_table<O, std::remove_cvref_t<decltype(O::fields)>>;
};

/// An enum a field may hold: `choice_names(E)` (found by argument-dependent lookup) names each
/// value, indexed by its underlying value.
template <class E>
concept choice = std::is_enum_v<E> && requires(E e) {
  { choice_names(e).size() } -> std::convertible_to<std::size_t>;
  { choice_names(e)[0] } -> std::convertible_to<std::string_view>;
};

}  // namespace mpopt
