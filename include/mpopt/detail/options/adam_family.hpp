// mpopt — the fields every Adam-family rule's options have (Adam, LAMB, 1-bit Adam, 0/1 Adam,
// 1-bit LAMB), with their checks: the first rows of each one's table (fields.hpp).
#pragma once

#include <tuple>

#include "../../fields.hpp"

namespace mpopt::detail {

/// lr, beta1, beta2, eps and weight_decay of options type O; its own rows follow:
/// `static constexpr auto fields = std::tuple_cat(detail::adam_family_fields<options>(), mpopt::fields(...))`.
template <class O>
constexpr auto adam_family_fields() {
  return mpopt::fields(field{"lr", &O::lr, checks::rate}, field{"beta1", &O::beta1, checks::beta},
                       field{"beta2", &O::beta2, checks::beta}, field{"eps", &O::eps, checks::divisor},
                       field{"weight_decay", &O::weight_decay, checks::rate});
}

}  // namespace mpopt::detail
