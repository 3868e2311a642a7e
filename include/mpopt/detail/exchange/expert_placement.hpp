// mpopt — where the experts of a mixture-of-experts model live (DeepSpeed's expert and
// expert-data-parallel groups): each expert group is data-parallel over its own communicator, the
// ranks holding replicas of the same experts. Across the optimizer's communicator the ranks hold E
// different sets of experts (E-way expert parallelism), each set on the D ranks of one expert
// communicator. finalize() checks that, collectively, and keeps every set's tensor names for
// checkpoints, which hold every expert (checkpoint.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../../communicator.hpp"
#include "../comm/agree.hpp"
#include "../config.hpp"
#include "exchange_context.hpp"
#include "../comm/metered.hpp"
#include "../options/validate.hpp"

namespace mpopt::detail {

/// Every rank's bytes, gathered over `comm` (collective): the lengths first, then the bytes.
MPOPT_DECL std::vector<std::vector<std::uint8_t>> gather_bytes(cold_collectives& comm, std::span<const std::uint8_t> mine);

/// An expert group's communicator `replicas` fits the optimizer's `world`: its size divides the
/// world's, and a device communicator shares the world's stream, so that its collectives keep the
/// order of the step's passes.
template <class C>
void check_expert_communicator(const C& world, const C& replicas) {
  const int w = world.size(), d = replicas.size();
  if (d < 1 || w % d != 0)
    fail("add_expert_group: its communicator has ", d, " ranks, which does not divide the optimizer's ", w);
  if constexpr (stream_communicator<C>)
    if (replicas.stream() != world.stream())
      fail("add_expert_group: its communicator runs on another stream than the optimizer's; create it on ",
           "the same stream, so that its collectives keep the order of the step's passes");
}

/// One expert group across the ranks of the optimizer's communicator.
struct expert_placement {
  std::size_t group = 0;                        ///< the optimizer's group number
  std::vector<std::vector<std::uint8_t>> sets;  ///< per expert-parallel index e (of E): its names, each ended by 0
  std::vector<std::vector<std::size_t>> starts;  ///< per set: where each name starts
  std::vector<std::size_t> ep_of;               ///< per rank: the index e of the experts it holds
  std::vector<std::size_t> replica_of;          ///< per rank: its rank in its expert communicator
  std::size_t mine = 0;                         ///< my index e

  std::size_t size() const { return sets.size(); }
  /// The name of tensor j of set e.
  std::string_view name(std::size_t e, std::size_t j) const {
    return reinterpret_cast<const char*>(sets[e].data() + starts[e][j]);
  }
  /// The rank that holds set e as its expert communicator's rank 0.
  std::size_t first_replica(std::size_t e) const {
    for (std::size_t r = 0; r < ep_of.size(); ++r)
      if (ep_of[r] == e && replica_of[r] == 0) return r;
    return 0;
  }
  /// Heap bytes it holds.
  MPOPT_DECL std::size_t bytes() const;
};

/// Expert group g's placement from what every rank registered (`everyone`: each rank's names,
/// `mine_too`: those of the ranks of my expert communicator, `joined`: mine; each name ended by a
/// zero byte) and each rank's rank in its expert communicator (`replica_of`; `rank`: mine in the
/// optimizer's, `replicas`: the size of my expert communicator). Throws if the ranks
/// of one expert communicator hold different names, a set of experts is not held by exactly the
/// ranks of one expert communicator, or two sets share a name.
MPOPT_DECL expert_placement placed_experts(std::size_t g, const std::vector<std::uint8_t>& joined,
                                          const std::vector<std::vector<std::uint8_t>>& everyone,
                                          const std::vector<std::vector<std::uint8_t>>& mine_too,
                                          std::span<const std::uint64_t> replica_of, int replicas, int rank);

/// Expert group g's placement, from its tensor names (`joined`, each ended by a zero byte), checked
/// on every rank (collective over `world` and the group's communicator `replicas`).
MPOPT_DECL expert_placement place_expert_group(cold_collectives& world, cold_collectives& replicas, std::size_t g,
                                               const std::vector<std::uint8_t>& joined);

/// The placement of every expert group (groups[g]->expert_parallel(), over *group_comms[g]), checked
/// on every rank: the ranks of one expert communicator hold the same tensor names, and different
/// sets no name in common (expert tensors are named by their global expert id, so that a
/// checkpoint holds each expert once). Collective over comm and every expert communicator; throws
/// on every rank if the placement is wrong.
template <class C, class Groups>
std::vector<expert_placement> place_experts(metered<C>& comm, const Groups& groups,
                                            std::span<metered<C>* const> group_comms) {
  std::vector<expert_placement> out;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g]->expert_parallel()) continue;
    metered<C>& replicas = *group_comms[g];
    std::vector<std::uint8_t> joined;  // the names, each ended by a zero byte
    for (std::size_t i = 0; i < groups[g]->size(); ++i) {
      const std::string& n = groups[g]->name(i);
      joined.insert(joined.end(), n.begin(), n.end());
      joined.push_back(0);
    }
    collectives_of<metered<C>> world(comm), experts(replicas);
    out.push_back(place_expert_group(world, experts, g, joined));
  }
  return out;
}

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "expert_placement.ipp"
#endif
