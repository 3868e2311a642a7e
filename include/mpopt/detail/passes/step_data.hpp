// mpopt — the tensor table and the buffers one step touches: what the optimizer hands its backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../state_precision.hpp"
#include "../math/step_decision.hpp"
#include "work_list.hpp"

namespace mpopt::detail {

/// The most state buffers a rule keeps per element (mpopt::max_rule_state).
inline constexpr std::size_t max_state_buffers = 4;

/// The element type of P's state buffers: float, bfloat16, or the bytes of quantized codes.
template <class P>
using state_element_t = typename state_storage_t<P>::element;

/// Whether P's master is kept as a remainder beside the bf16 parameter.
template <class P>
inline constexpr bool master_in_remainder = P::has_master && std::is_same_v<master_storage_t<P>, remainder16>;

/// The element type of P's master buffer, where it has one (P::has_master): float, or the remainder's.
template <class P>
using master_element_t = std::conditional_t<master_in_remainder<P>, std::int16_t, float>;

/// Whether P's state is quantized in blocks.
template <class P>
inline constexpr bool state_in_blocks = quantized_in_blocks<state_storage_t<P>>;

/// The bits state storage S keeps an element, and its block (0: not quantized in blocks).
template <class S>
constexpr std::size_t stored_bits() {
  if constexpr (quantized_in_blocks<S>) return S::bits;
  else return 8 * sizeof(typename S::element);
}
template <class S>
constexpr std::size_t stored_block() {
  if constexpr (quantized_in_blocks<S>) return S::block;
  else return 0;
}

/// Where P's layout starts tensors and shards: multiples of 16 elements (64 bytes of fp32), and of
/// a block where the state is quantized, so that no block crosses a tensor or a shard.
template <class P>
constexpr std::size_t state_alignment() {
  if constexpr (state_in_blocks<P>) {
    static_assert(state_storage_t<P>::block % 16 == 0);
    return state_storage_t<P>::block;
  } else {
    return 16;
  }
}

/// Whether P's state and master are both stored in fp32: what the compressing rules require.
template <class P>
inline constexpr bool stored_in_fp32 =
    std::is_same_v<state_storage_t<P>, fp32_state> && std::is_same_v<master_storage_t<P>, fp32_master>;

/// Where quantized state (state_precision.hpp) keeps each buffer's block scales, and which buffers
/// are non-negative (their map the unsigned one): members of step_data and of a chunk's slice, empty
/// for other storages.
template <class P, bool = quantized_in_blocks<state_storage_t<P>>>
struct block_scale_slots {};
template <class P>
struct block_scale_slots<P, true> {
  float* block_scales[max_state_buffers] = {};
  std::uint32_t nonnegative = 0;  ///< bit k: buffer k
};

template <class Param, class Grad>
struct tensor_slot {
  Param* param;
  Grad* grad;
  std::size_t size;
  std::uint32_t group;
  std::uint64_t first;  ///< the index of element 0 among all registered elements (stochastic rounding's)
  /// The state buffers its group's rule keeps, and where its state sits in each: its local index
  /// less state_shift[k] (buffer_layout: groups keep different numbers of buffers under rules<R...>).
  std::uint32_t state_buffers = max_state_buffers;
  std::size_t state_shift[max_state_buffers] = {};
};

/// Pointers and scalars for one pass. Kernels read the true gradient as
/// (accum + grad) * scale, grad * scale without accumulation, or accum * scale once the gradients
/// have been reduced across ranks into accum (grads_reduced). The scale is grad_scale in the
/// overflow-and-norm pass and the decision's grad_scale in the update passes.
template <class Precision>
struct step_data : block_scale_slots<Precision> {
  using param_type = typename Precision::param_type;
  using grad_type = typename Precision::grad_type;
  using accumulate_type = typename Precision::accumulate_type;
  static constexpr bool has_master = Precision::has_master;

  const tensor_slot<param_type, grad_type>* tensors = nullptr;
  std::size_t tensor_count = 0;
  const work_list* work = nullptr;
  /// The fp32 masters or their remainders (master_element_t); null where the parameter is its own
  /// master (fp32 parameters, no_master).
  master_element_t<Precision>* master = nullptr;
  state_element_t<Precision>* state[max_state_buffers] = {};  ///< the rule's state buffers, state_count of them
  std::uint32_t state_count = 0;
  /// A matrix rule's buffer (rule.hpp: e.matrix()): fp32, indexed as the state; null for other rules.
  float* matrix = nullptr;
  accumulate_type* accum = nullptr;  ///< gradient accumulator, null when not accumulating
  float* chunk_sum = nullptr;     ///< per-chunk partial sums of squares
  float* chunk_sum2 = nullptr;    ///< a second per-chunk partial (LAMB: update norms)
  std::uint8_t* chunk_nonfinite = nullptr;
  /// Set when nothing had to be known before the update: its first pass then also sums the squares
  /// of the true gradient per chunk, in double, for the step's status (no separate gradient pass).
  double* chunk_grad_sum = nullptr;
  float grad_scale = 1.0f;                  ///< the unscale, for the overflow-and-norm pass
  const step_decision* decision = nullptr;  ///< where the backend runs: read by the update passes
  bool grads_reduced = false;
  std::uint32_t rounding_key = 0;  ///< the update's stochastic rounding noise (rounding_key())
};

}  // namespace mpopt::detail
