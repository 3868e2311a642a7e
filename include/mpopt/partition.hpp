// mpopt — partitioning policies: which part of the optimizer state each rank owns (a layout), and how
// gradients and parameters travel between ranks (an exchange, the object the optimizer holds and
// calls through a fixed vocabulary: partition_exchange below). The optimizer never asks which policy
// it holds.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "detail/exchange/exchange_context.hpp"
#include "detail/exchange/flat_layout.hpp"
#include "detail/exchange/partition_layout.hpp"
#include "detail/exchange/replicated_exchange.hpp"
#include "detail/exchange/sharded_exchange.hpp"
#include "memory_report.hpp"

namespace mpopt {

/// Layouts: which elements' state each rank holds, over each group's communicator of `world` ranks.
/// Every rank holds every element's.
struct every_element {
  static constexpr bool sharded = false;
};
/// Each rank holds one shard of every group: shard s is rank owner(s, world)'s. A layout of yours
/// derives from it and changes owner(), a permutation of the ranks.
struct one_shard_each {
  static constexpr bool sharded = true;
  static std::size_t owner(std::size_t shard, std::size_t /*world*/) { return shard; }
};

/// Each rank holds whole tensors of every group: shard s starts at a tensor and is rank s's. The
/// tensors are split in their order, balancing what updating them costs (a matrix rule's
/// matrix_cost, else their elements).
struct whole_tensors_each : one_shard_each {
  static constexpr bool whole_tensors = true;
};

template <class L>
concept partition_layout = requires {
  { L::sharded } -> std::convertible_to<bool>;
} && (!L::sharded || requires(std::size_t s) {
  { L::owner(s, s) } -> std::convertible_to<std::size_t>;
});

/// Every rank holds the full master and rule state and updates every element (plain data parallel).
/// Gradients are summed over ranks in fp32 at the accumulation boundary.
struct replicated {
  static constexpr std::string_view name = "replicated";
  using layout = every_element;
  static constexpr bool sharded = layout::sharded;  ///< each rank updates only its own shard
  static constexpr bool reduce_every_micro_step = false;
  template <class Precision, class Backend, class Communicator>
  using exchange = detail::replicated_exchange<Precision, Backend, Communicator>;
};

/// ZeRO stage 1: each rank holds master and rule state for its shard only. Micro-steps accumulate
/// locally in fp32; at the boundary the gradients are reduce-scattered bucket by bucket, each rank
/// updates its shard and the updated parameters are all-gathered.
struct zero1 {
  static constexpr std::string_view name = "zero1";
  using layout = one_shard_each;
  static constexpr bool sharded = layout::sharded;
  static constexpr bool reduce_every_micro_step = false;
  template <class Precision, class Backend, class Communicator>
  using exchange = detail::zero1_exchange<Precision, Backend, Communicator>;
};

/// ZeRO stage 2: as zero1, but every micro-step's gradients are reduce-scattered into the shard, bucket
/// by bucket as optimizer::grad_ready reports tensors done, so no full-size gradient copy persists.
/// Under overlap_comm (every partition) those collectives run while backward goes on.
struct zero2 {
  static constexpr std::string_view name = "zero2";
  using layout = one_shard_each;
  static constexpr bool sharded = layout::sharded;
  static constexpr bool reduce_every_micro_step = true;
  template <class Precision, class Backend, class Communicator>
  using exchange = detail::zero2_exchange<Precision, Backend, Communicator>;
};

/// Layer-wise: each tensor's master and state on one rank, whole, which updates it; ranks balanced
/// by the update's cost (a matrix rule's matrix stage: Muon's orthogonalization of each matrix, on
/// the rank that holds its momentum). Gradients travel as zero2's, reduce-scattered bucket by
/// bucket as optimizer::grad_ready reports tensors done, each rank receiving its tensors' sums;
/// the updated parameters are all-gathered.
struct layerwise : zero2 {
  static constexpr std::string_view name = "layerwise";
  using layout = whole_tensors_each;
};

/// What the optimizer asks of a partition's exchange E, in the order of a step:
///   E::sharded                  whether it works on one shard per rank (its layout's must agree)
///   e.allocate(layout, c)       its buffers, at finalize()
///   e.grad_ready(c, t)          backward finished tensor t; false if it was reported already
///   e.grad_consumed(t)          whether tensor t's gradient memory may be reused
///   e.micro_step(c)             a backward inside the accumulation window
///   e.boundary(c, local)        the window's last backward: where the update reads its gradients
///                               (`local`: they stay on this rank, for a compressing rule)
///   e.sum_partials(c, sums)     how per-tensor partial sums of squares combine across ranks
///   e.params_back(c)            the updated parameters reach every rank (may leave some in flight)
///   e.wait_params(c, i)         ... and tensor i's have arrived (i = -1: every tensor's)
///   e.keeps_window(world), e.restart_window()  what a failed collective leaves of the window
///   e.list_memory(report)       its buffers; returns its bookkeeping bytes
template <class E>
concept partition_exchange =
    requires(E& e, const E& ce, typename E::context& c, const detail::flat_layout& layout, memory_report& r) {
      { E::sharded } -> std::convertible_to<bool>;
      e.allocate(layout, c);
      { e.grad_ready(c, std::size_t{}) } -> std::same_as<bool>;
      { ce.grad_consumed(std::size_t{}) } -> std::same_as<bool>;
      e.micro_step(c);
      { e.boundary(c, bool{}) } -> std::same_as<detail::step_data<typename E::context::precision>>;
      e.sum_partials(c, std::span<double>{});
      e.params_back(c);
      e.wait_params(c, std::size_t{});
      { ce.keeps_window(int{}) } -> std::same_as<bool>;
      e.restart_window();
      { ce.list_memory(r) } -> std::same_as<std::size_t>;
    };

/// A partitioning policy: a name (saved in checkpoints), a layout, and an exchange for every
/// precision, backend and communicator that works on that layout.
template <class P, class Precision, class Backend, class Communicator>
concept partition_policy = requires {
  { P::name } -> std::convertible_to<std::string_view>;
  typename P::layout;
  typename P::template exchange<Precision, Backend, Communicator>;
} && partition_layout<typename P::layout> && partition_exchange<typename P::template exchange<Precision, Backend, Communicator>> &&
    P::layout::sharded == P::template exchange<Precision, Backend, Communicator>::sharded;

}  // namespace mpopt
