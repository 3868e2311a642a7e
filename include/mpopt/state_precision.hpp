// mpopt — state precision: how the optimizer stores the rule's state buffers (its moments) and the
// fp32 master, chosen with the precision policy: with_state<Precision, State, Master>. A rule's
// stages read and write fp32 whatever the storage; the element view converts (detail/passes/
// stored_state.hpp), so no rule, user-written ones included, knows how its state is kept.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <string>
#include <string_view>
#include <type_traits>

#include "numeric.hpp"
#include "precision.hpp"
#include "rounding.hpp"

namespace mpopt {

/// The rule's state in fp32: 4 bytes an element and buffer (the default).
struct fp32_state {
  using element = float;
  static constexpr std::string_view name = "fp32";
};

/// The rule's state in bfloat16: 2 bytes an element and buffer, rounded to nearest, or
/// stochastically (keyed as the parameters' stochastic rounding is, on a stream of each buffer's own).
/// Megatron-Core's precision-aware optimizer, Transformer Engine and DeepSeek-V3 keep bf16 moments.
template <class Rounding = round_to_nearest>
struct bf16_state {
  static_assert(std::is_same_v<Rounding, round_to_nearest> || std::is_same_v<Rounding, stochastic_rounding>,
                "bf16_state rounds with mpopt::round_to_nearest or mpopt::stochastic_rounding");
  using element = bfloat16;
  using rounding = Rounding;
  static constexpr std::string_view name =
      std::is_same_v<Rounding, round_to_nearest> ? std::string_view("bf16") : std::string_view("bf16_stochastic");
};

/// The master in fp32, where the precision keeps one (the default).
struct fp32_master {
  static constexpr std::string_view name = "fp32";
};

/// bf16 parameters only: the parameter (the master rounded to nearest, a tie away from zero) and a
/// 16-bit remainder are the fp32 master exactly, at 2 bytes an element instead of 4
/// (detail/math/remainder16.hpp; Apex's and Transformer Engine's store_param_remainders).
struct remainder16 {
  static constexpr std::string_view name = "remainder16";
};

/// No master: the 16-bit parameter is the master, each update rounded into it stochastically (the
/// precision must round with mpopt::stochastic_rounding: bf16_stochastic or fp16_stochastic).
struct no_master {
  static constexpr std::string_view name = "none";
};

/// Precision, with the rule's state stored as State and the master as Master.
template <precision_policy Precision, class State = fp32_state, class Master = fp32_master>
struct with_state : Precision {
  static_assert(std::is_same_v<State, fp32_state> || std::is_same_v<State, bf16_state<round_to_nearest>> ||
                    std::is_same_v<State, bf16_state<stochastic_rounding>>,
                "with_state's State is mpopt::fp32_state or mpopt::bf16_state<Rounding>");
  static_assert(std::is_same_v<Master, fp32_master> || std::is_same_v<Master, remainder16> ||
                    std::is_same_v<Master, no_master>,
                "with_state's Master is mpopt::fp32_master, mpopt::remainder16 or mpopt::no_master");
  static_assert(Precision::has_master || std::is_same_v<Master, fp32_master>,
                "fp32 parameters are their own master: with_state's Master must be mpopt::fp32_master");
  static_assert(!std::is_same_v<Master, remainder16> || std::is_same_v<typename Precision::param_type, bfloat16>,
                "mpopt::remainder16 completes bf16 parameters (an fp16 parameter's bits are not the upper half of "
                "its fp32 value): use it with mpopt::bf16");
  static_assert(!std::is_same_v<Master, no_master> || std::is_same_v<rounding_of_t<Precision>, stochastic_rounding>,
                "mpopt::no_master rounds every update into the 16-bit parameter, which only stochastic rounding "
                "does without losing small updates: use mpopt::bf16_stochastic or mpopt::fp16_stochastic");
  using state_storage = State;
  using master_storage = Master;
  /// Whether a master separate from the parameter exists (whatever stores it).
  static constexpr bool has_master = Precision::has_master && !std::is_same_v<Master, no_master>;
};

namespace detail {
template <class P>
typename P::state_storage state_storage_of(int);
template <class P>
fp32_state state_storage_of(long);
template <class P>
typename P::master_storage master_storage_of(int);
template <class P>
fp32_master master_storage_of(long);

template <class Precision, class State, class Master>
std::true_type with_state_base(const with_state<Precision, State, Master>*);
std::false_type with_state_base(const void*);
/// Whether P is a with_state (or derives from one): the one way to choose a storage.
template <class P>
inline constexpr bool built_with_state = decltype(with_state_base(static_cast<const P*>(nullptr)))::value;
}  // namespace detail

/// How P stores the rule's state and the master: its with_state choices, else fp32.
template <class P>
using state_storage_t = decltype(detail::state_storage_of<P>(0));
template <class P>
using master_storage_t = decltype(detail::master_storage_of<P>(0));

namespace detail {
/// P's name, and its storage where that is not fp32: "bf16 (state bf16, master remainder16)".
template <class P>
std::string stored_precision_name() {
  std::string name(P::name);
  if constexpr (!std::is_same_v<state_storage_t<P>, fp32_state> || !std::is_same_v<master_storage_t<P>, fp32_master>)
    name.append(" (state ").append(state_storage_t<P>::name).append(", master ").append(master_storage_t<P>::name).append(")");
  return name;
}
}  // namespace detail

/// Whether any of P's roundings is stochastic (its parameters' or its state's): checkpoints then keep
/// the seed.
template <class P>
inline constexpr bool rounds_stochastically =
    std::is_same_v<rounding_of_t<P>, stochastic_rounding> ||
    std::is_same_v<state_storage_t<P>, bf16_state<stochastic_rounding>>;

}  // namespace mpopt
