// mpopt — state precision: how the optimizer stores the rule's state buffers (its moments) and the
// fp32 master, chosen with the precision policy: with_state<Precision, State, Master>. A rule's
// stages read and write fp32 whatever the storage; the element view converts (detail/passes/
// stored_state.hpp), so no rule, user-written ones included, knows how its state is kept.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <cstddef>
#include <cstdint>
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

namespace detail {
/// What the quantized storages share: `bits`-bit codes in bytes, and a scale per `block` elements.
template <int Bits, std::size_t Block>
struct block_codes {
  using element = std::uint8_t;
  static constexpr int bits = Bits;
  static constexpr std::size_t block = Block;
};
}  // namespace detail

/// The rule's state quantized in blocks (detail/math/blockwise_quantization.hpp): per block of
/// `block` elements one fp32 scale, per element a code of `bits` bits (two 4-bit codes a byte). A
/// buffer the rule declares non-negative (its `nonnegative_state`) takes the unsigned map. Blocks
/// start at each tensor's start and never cross a chunk or a ZeRO shard, so every partition gives
/// the same bits.
/// - blockwise8_state: bitsandbytes' 8-bit blockwise Adam and torchao's AdamW8bit: the dynamic map
///   (signed, or unsigned for non-negative state), blocks of 256.
/// - blockwise4_state: torchao's AdamW4bit: the 4-bit signed dynamic map, and k/16 without 0 for
///   non-negative state (no element of a non-zero block decodes to 0), blocks of 128.
/// - fp8_state: torchao's AdamWFp8: fp8 E4M3 codes of x / s with s = max |x| / 448, blocks of 256.
struct blockwise8_state : detail::block_codes<8, 256> {
  static constexpr std::string_view name = "blockwise8";
};
struct blockwise4_state : detail::block_codes<4, 128> {
  static constexpr std::string_view name = "blockwise4";
};
struct fp8_state : detail::block_codes<8, 256> {
  static constexpr std::string_view name = "fp8";
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
                    std::is_same_v<State, bf16_state<stochastic_rounding>> ||
                    std::is_same_v<State, blockwise8_state> || std::is_same_v<State, blockwise4_state> ||
                    std::is_same_v<State, fp8_state>,
                "with_state's State is mpopt::fp32_state, mpopt::bf16_state<Rounding>, mpopt::blockwise8_state, "
                "mpopt::blockwise4_state or mpopt::fp8_state");
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

namespace detail {
/// Whether state storage S is quantized in blocks (S::block elements share a scale).
template <class S>
concept quantized_in_blocks = requires { S::block; };
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
