// mpopt — partitioning policies: which part of the optimizer state each rank owns, and when the
// gradients are reduced across ranks.
#pragma once

#include <string_view>

namespace mpopt {

/// Every rank holds the full master and rule state and updates every element (plain data parallel).
/// Gradients are summed over ranks in fp32 at the accumulation boundary.
struct replicated {
  static constexpr std::string_view name = "replicated";
  static constexpr bool sharded = false;           ///< each rank updates only its own shard
  static constexpr bool reduce_every_micro_step = false;
};

/// ZeRO stage 1: each rank holds master and rule state for its shard only. Micro-steps accumulate
/// locally in fp32; at the boundary the gradients are reduce-scattered bucket by bucket, each rank
/// updates its shard and the updated parameters are all-gathered.
struct zero1 {
  static constexpr std::string_view name = "zero1";
  static constexpr bool sharded = true;
  static constexpr bool reduce_every_micro_step = false;
};

/// ZeRO stage 2: as zero1, but every micro-step's gradients are reduce-scattered into the shard, bucket
/// by bucket as optimizer::grad_ready reports tensors done, so no full-size gradient copy persists.
struct zero2 {
  static constexpr std::string_view name = "zero2";
  static constexpr bool sharded = true;
  static constexpr bool reduce_every_micro_step = true;
};

}  // namespace mpopt
