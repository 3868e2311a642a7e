// mpopt — precision policies: what the user's parameters and gradients are stored in, whether the
// optimizer keeps an fp32 master copy, and in which type gradients are summed and sent between ranks.
// Master weights and moments are always fp32.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <concepts>
#include <string_view>
#include <type_traits>

#include "numeric.hpp"
#include "rounding.hpp"

namespace mpopt {

/// Everything in fp32: the parameter is its own master.
struct fp32 {
  using param_type = float;
  using grad_type = float;
  using accumulate_type = float;
  using communicate_type = float;
  static constexpr bool has_master = false;
  static constexpr std::string_view name = "fp32";
};

/// 16-bit parameters and gradients (mpopt::half or mpopt::bfloat16) with fp32 master weights.
/// Gradients are summed over micro-steps (and held as the reduced shard under ZeRO) in Accumulate,
/// and sent between ranks as Communicate: fp32 by default, or T to halve that memory and traffic
/// (DeepSpeed's ZeRO keeps and sends fp16 gradients; the ZeRO paper's 2P + 14P/N counts them so).
/// 16-bit sums round at every addition, and fp16 ones can overflow: a loss-scaled step then skips.
/// Rounding is how the updated master becomes the parameter: round_to_nearest or stochastic_rounding.
template <class T, class Accumulate = float, class Communicate = float, class Rounding = round_to_nearest>
struct mixed_precision {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16>,
                "mixed_precision holds mpopt::half or mpopt::bfloat16 parameters");
  static_assert(std::is_same_v<Accumulate, float> || std::is_same_v<Accumulate, T>,
                "gradients accumulate in float or in the parameter type");
  static_assert(std::is_same_v<Communicate, float> || std::is_same_v<Communicate, T>,
                "gradients travel as float or as the parameter type");
  static_assert(std::is_same_v<Rounding, round_to_nearest> || std::is_same_v<Rounding, stochastic_rounding>,
                "parameters round with mpopt::round_to_nearest or mpopt::stochastic_rounding");
  using param_type = T;
  using grad_type = T;
  using accumulate_type = Accumulate;
  using communicate_type = Communicate;
  using rounding = Rounding;
  static constexpr bool has_master = true;
  /// The name in checkpoints: the saved state does not depend on Accumulate, Communicate or Rounding.
  static constexpr std::string_view name = std::is_same_v<T, half> ? "fp16" : "bf16";
};

/// fp16 parameters and gradients, fp32 master weights (FP16_Optimizer).
using fp16 = mixed_precision<half>;
/// bf16 parameters and gradients, fp32 master weights (BF16_Optimizer: fp32 accumulation).
using bf16 = mixed_precision<bfloat16>;
/// The same, with the master stochastically rounded into the parameters.
using fp16_stochastic = mixed_precision<half, float, float, stochastic_rounding>;
using bf16_stochastic = mixed_precision<bfloat16, float, float, stochastic_rounding>;

/// How P rounds its master into its parameters: P::rounding, or to nearest.
template <class P>
concept names_rounding = requires { typename P::rounding; };
template <class P>
struct rounding_of {
  using type = round_to_nearest;
};
template <class P>
  requires names_rounding<P>
struct rounding_of<P> {
  using type = typename P::rounding;
};
template <class P>
using rounding_of_t = typename rounding_of<P>::type;

/// How buffers of each element type are named in messages and reports.
template <class T>
inline constexpr std::string_view type_name = std::is_same_v<T, float> ? "fp32" : std::is_same_v<T, half> ? "fp16" : "bf16";

template <class P>
concept precision_policy = requires {
  typename P::param_type;
  typename P::grad_type;
  typename P::accumulate_type;
  typename P::communicate_type;
  { P::has_master } -> std::convertible_to<bool>;
  { P::name } -> std::convertible_to<std::string_view>;
};

}  // namespace mpopt
