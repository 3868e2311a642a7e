// mpopt — how the fp32 master is rounded into 16-bit parameters after each update: a choice of the
// precision policy (mixed_precision's Rounding).
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <cstdint>
#include <string_view>

#include "detail/config.hpp"

namespace mpopt {

/// To the nearest value, ties to even: the parameter is the master's closest 16-bit value.
struct round_to_nearest {
  static constexpr std::string_view name = "nearest";
  template <class L, class T>
  MPOPT_HOST_DEVICE static typename L::vec round(typename L::vec x, std::uint32_t, std::uint64_t) {
    return x;
  }
};

/// Up or down at random, with the probability that makes the expected parameter the master
/// (detail/lanes/stochastic_rounding.hpp): updates smaller than half a 16-bit step still move the
/// parameter on average. The noise is keyed on optimizer_options::rounding_seed, the applied step's
/// number and the element's index among all registered elements, so no thread count, SIMD level,
/// backend or world size changes a bit, and a checkpoint resumes it.
struct stochastic_rounding {
  static constexpr std::string_view name = "stochastic";
  /// x (lanes L, each already the value to store) as element `index` of the step keyed `key`.
  template <class L, class T>
  MPOPT_HOST_DEVICE static typename L::vec round(typename L::vec x, std::uint32_t key, std::uint64_t index) {
    return L::template round_stochastic<T>(x, key, index);
  }
};

}  // namespace mpopt
