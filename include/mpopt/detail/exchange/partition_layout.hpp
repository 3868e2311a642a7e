// mpopt — a partition's layout made concrete: the flat layout (flat_layout.hpp) of the registered
// tensors over each group's communicator, as the partition's layout policy (partition.hpp) says who
// owns what.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "../config.hpp"
#include "flat_layout.hpp"

namespace mpopt::detail {

/// A group's plan over W ranks where shard s is rank rank_of[s]'s; refuses an owner() that does not
/// give each rank one shard, naming the partition.
MPOPT_DECL shard_plan sharded_plan(std::vector<std::size_t> rank_of, std::size_t rank, std::string_view partition);

/// Where `parts` shards of whole tensors start (shard_plan::first_tensors), balancing their costs:
/// shard r at the tensor boundary nearest to r / parts of the total, so that no shard costs more
/// than its share and one tensor.
MPOPT_DECL std::vector<std::size_t> balanced_cuts(std::span<const double> costs, std::size_t parts);

/// Whether layout L keeps each tensor whole on one rank (a layer-wise layout: partition.hpp).
template <class L>
concept keeps_tensors_whole = L::sharded && requires {
  requires L::whole_tensors;
};

/// What a layout balances where it cuts shards at tensors: each tensor's update cost, and per group
/// whether its rule keeps its tensors whole (a matrix rule's), whatever the layout.
struct update_costs {
  std::vector<double> tensors;
  std::vector<bool> whole_groups;
};

/// The layout of group g's tensors (tensor_groups[t], sizes[t]) under Layout, over each group's
/// communicator (c.comm_of(g)). Shards start at tensors, balancing costs.tensors[t] across ranks,
/// in a layout that keeps tensors whole and in a group whose rule needs them whole; elsewhere they
/// are equal.
/// Replicated: every element mine; with sum_by_shard the work is still
/// cut at the would-be shards; where groups are replicated over different ranks (expert groups) the
/// global norm is a sum over every rank, in which the first replica of each element counts it.
/// Tensors and shards start at multiples of `align` elements (flat_layout).
template <class Layout, class Context>
flat_layout lay_out(std::string_view partition, const std::vector<std::uint32_t>& tensor_groups,
                    const std::vector<std::size_t>& sizes, const update_costs& costs, std::size_t groups,
                    const Context& c, std::size_t align) {
  std::vector<shard_plan> plans;
  if constexpr (Layout::sharded) {
    for (std::size_t g = 0, first = 0; g < groups; ++g) {
      const auto& comm = c.comm_of(g);
      const std::size_t world = std::size_t(comm.size());
      std::vector<std::size_t> rank_of;
      for (std::size_t s = 0; s < world; ++s) rank_of.push_back(std::size_t(Layout::owner(s, world)));
      plans.push_back(sharded_plan(std::move(rank_of), std::size_t(comm.rank()), partition));
      std::size_t end = first;
      while (end < tensor_groups.size() && tensor_groups[end] == g) ++end;
      if (keeps_tensors_whole<Layout> || costs.whole_groups[g])
        plans.back().first_tensors =
            balanced_cuts(std::span<const double>(costs.tensors).subspan(first, end - first), world);
      first = end;
    }
    return flat_layout(tensor_groups, sizes, std::move(plans), true, true, align);
  } else {
    const bool summed = c.comm.size() > 1 && c.has_expert_groups();
    for (std::size_t g = 0; g < groups; ++g) {
      const auto& comm = c.comm_of(g);
      plans.push_back({c.options.sum_by_shard ? std::size_t(comm.size()) : 1, 0, {}, !summed || comm.rank() == 0, {}});
    }
    return flat_layout(tensor_groups, sizes, std::move(plans), false, summed, align);
  }
}

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "partition_layout.ipp"
#endif
