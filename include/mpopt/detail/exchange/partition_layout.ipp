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
  return {world, part, std::move(rank_of), true};
}

}  // namespace mpopt::detail
