// mpopt — partition_layout's definitions (partition_layout.hpp): inline header-only, else compiled
// once by <mpopt/src.hpp>.
#pragma once

#include "partition_layout.hpp"

#include "../options/validate.hpp"

namespace mpopt::detail {

MPOPT_DECL shard_plan sharded_plan(std::vector<std::size_t> rank_of, std::size_t rank, std::string_view partition) {
  const std::size_t world = rank_of.size();
  std::vector<bool> taken(world, false);
  std::size_t part = world;
  for (std::size_t s = 0; s < world; ++s) {
    const std::size_t r = rank_of[s];
    if (r >= world || taken[r])
      fail("partition ", partition, ": its layout's owner(", s, ", ", world, ") is ", r,
           ", but each of the ", world, " ranks must own exactly one shard");
    taken[r] = true;
    if (r == rank) part = s;
  }
  return {world, part, std::move(rank_of), true, {}};
}

MPOPT_DECL std::vector<std::size_t> balanced_cuts(std::span<const double> costs, std::size_t parts) {
  std::vector<double> before(costs.size() + 1, 0.0);  // before[i]: the costs of tensors [0, i)
  for (std::size_t i = 0; i < costs.size(); ++i) before[i + 1] = before[i] + costs[i];
  std::vector<std::size_t> cuts(1, 0);
  for (std::size_t r = 1, i = 0; r < parts; ++r) {
    const double target = before.back() * double(r) / double(parts);
    while (i < costs.size() && before[i + 1] <= target) ++i;
    if (i < costs.size() && before[i + 1] - target < target - before[i]) ++i;
    cuts.push_back(std::max(i, cuts.back()));
  }
  return cuts;
}

}  // namespace mpopt::detail
