// mpopt — expert placement's definitions (expert_placement.hpp): inline header-only, else compiled
// once by <mpopt/src.hpp>.
#pragma once

#include "expert_placement.hpp"

#include <map>

namespace mpopt::detail {

MPOPT_DECL std::size_t expert_placement::bytes() const {
  std::size_t b = sets.capacity() * sizeof(sets[0]) + starts.capacity() * sizeof(starts[0]) +
                  (ep_of.capacity() + replica_of.capacity()) * sizeof(std::size_t);
  for (const auto& s : sets) b += s.capacity();
  for (const auto& s : starts) b += s.capacity() * sizeof(std::size_t);
  return b;
}

MPOPT_DECL expert_placement placed_experts(std::size_t g, const std::vector<std::uint8_t>& joined,
                                          const std::vector<std::vector<std::uint8_t>>& everyone,
                                          const std::vector<std::vector<std::uint8_t>>& mine_too,
                                          std::span<const std::uint64_t> replica_of, int replicas, int rank) {
  const std::string label = "expert group " + std::to_string(g);
  expert_placement p;
  p.group = g;
  p.replica_of.assign(replica_of.begin(), replica_of.end());
  for (std::size_t r = 0; r < mine_too.size(); ++r)
    if (mine_too[r] != joined)
      fail(label, ": ranks ", replica_of[std::size_t(rank)], " and ", r, " of its expert communicator hold different tensors; an "
           "expert group's communicator joins the ranks holding the same experts (DeepSpeed's expert-data-parallel group)");
  std::vector<std::size_t> holders, first;  // per set: how many ranks hold it, the first of them
  for (const auto& list : everyone) {
    std::size_t e = 0;
    while (e < p.sets.size() && p.sets[e] != list) ++e;
    if (e == p.sets.size()) {
      p.sets.push_back(list);
      holders.push_back(0);
      first.push_back(p.ep_of.size());
    }
    ++holders[e];
    p.ep_of.push_back(e);
  }
  for (std::size_t e = 0; e < p.sets.size(); ++e)
    if (holders[e] != std::size_t(replicas))
      fail(label, ": ", holders[e], " of the ", everyone.size(), " ranks register the expert names of rank ", first[e],
           ", but its expert communicator has ", replicas, " ranks: each set of "
           "experts is held by exactly the ranks of one expert communicator, and ranks holding different "
           "experts must name them apart (by global expert id)");
  std::map<std::string_view, std::size_t> set_of;  // name -> the set holding it
  for (std::size_t e = 0; e < p.sets.size(); ++e) {
    p.starts.emplace_back();
    for (std::size_t at = 0; at < p.sets[e].size();) {
      p.starts[e].push_back(at);
      const std::string_view name = p.name(e, p.starts[e].size() - 1);
      const auto [it, fresh] = set_of.emplace(name, e);
      if (!fresh)
        fail(label, ": tensor name '", name, "' is used on rank ", first[it->second], " and on rank ", first[e],
             " for different experts; name expert tensors by their global expert id");
      at += name.size() + 1;
    }
  }
  p.mine = p.ep_of[std::size_t(rank)];
  return p;
}

MPOPT_DECL std::vector<std::vector<std::uint8_t>> gather_bytes(cold_collectives& comm, std::span<const std::uint8_t> mine) {
  const auto w = std::size_t(comm.size()), me = std::size_t(comm.rank());
  std::vector<std::uint64_t> lengths(w, 0);
  lengths[me] = mine.size();
  comm.all_reduce_max(std::span<std::uint64_t>(lengths));
  std::vector<std::size_t> counts(lengths.begin(), lengths.end());
  std::vector<std::uint8_t> all;
  for (std::size_t r = 0; r < w; ++r) {
    if (r == me) all.insert(all.end(), mine.begin(), mine.end());
    else all.resize(all.size() + counts[r]);
  }
  comm.all_gather(std::span<std::uint8_t>(all), std::span<const std::size_t>(counts));
  std::vector<std::vector<std::uint8_t>> out;
  for (std::size_t r = 0, at = 0; r < w; at += counts[r++])
    out.emplace_back(all.begin() + std::ptrdiff_t(at), all.begin() + std::ptrdiff_t(at + counts[r]));
  return out;
}

MPOPT_DECL expert_placement place_expert_group(cold_collectives& world, cold_collectives& replicas, std::size_t g,
                                               const std::vector<std::uint8_t>& joined) {
  const auto everyone = gather_bytes(world, joined);
  const auto mine_too = gather_bytes(replicas, joined);
  std::vector<std::uint64_t> replica(std::size_t(world.size()), 0);
  replica[std::size_t(world.rank())] = std::uint64_t(replicas.rank());
  world.all_reduce_max(std::span<std::uint64_t>(replica));
  expert_placement placed;
  agree(world, "finalize", [&] {
    placed = placed_experts(g, joined, everyone, mine_too, replica, replicas.size(), world.rank());
  });
  return placed;
}

}  // namespace mpopt::detail
