// mpopt — precision policies: what the user's parameters and gradients are stored in, and whether the
// optimizer keeps an fp32 master copy. Optimizer state (master, moments, gradient accumulator) is fp32.
#pragma once

#include <string_view>

#include "numeric.hpp"

namespace mpopt {

/// Everything in fp32: the parameter is its own master.
struct fp32 {
  using param_type = float;
  using grad_type = float;
  static constexpr bool has_master = false;
  static constexpr std::string_view name = "fp32";
};

/// fp16 parameters and gradients, fp32 master weights (FP16_Optimizer).
struct fp16 {
  using param_type = half;
  using grad_type = half;
  static constexpr bool has_master = true;
  static constexpr std::string_view name = "fp16";
};

/// bf16 parameters and gradients, fp32 master weights (BF16_Optimizer).
struct bf16 {
  using param_type = bfloat16;
  using grad_type = bfloat16;
  static constexpr bool has_master = true;
  static constexpr std::string_view name = "bf16";
};

template <class P>
concept precision_policy = requires {
  typename P::param_type;
  typename P::grad_type;
  { P::has_master } -> std::convertible_to<bool>;
  { P::name } -> std::convertible_to<std::string_view>;
};

}  // namespace mpopt
