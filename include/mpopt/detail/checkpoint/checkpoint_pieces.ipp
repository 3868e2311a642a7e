// mpopt — checkpoint_pieces' definitions (checkpoint_pieces.hpp): inline header-only, else compiled
// once by <mpopt/src.hpp>.
#pragma once

#include "checkpoint_pieces.hpp"

#include "../options/validate.hpp"

namespace mpopt::detail {

MPOPT_DECL untyped part_of(const untyped& u, std::size_t i, bool mine) {
  return mine && u.data ? u.at(i) : untyped{nullptr, u.dtype, u.element_bytes, u.floats};
}

/// A file tensor of a state buffer: its values or codes, or its blocks' scales, with `num / den` of
/// its entries per tensor element (4-bit codes: 1/2, two a byte; scales: 1/block). Shards and their
/// state start at multiples of den elements.
struct state_entry {
  std::string key;
  untyped data;
  std::size_t num = 1, den = 1;
  std::size_t shift = 0;  ///< of the buffer's elements: the group's local index less its index there
  /// The entries of elements [0, n): n * num / den, rounded up.
  std::size_t entries(std::size_t n) const { return (n * num + den - 1) / den; }
};

/// The file tensors of state buffers stored as f: with `data` the buffers', else none (a file's,
/// whose dtypes and shapes are checked).
MPOPT_DECL std::vector<state_entry> state_entries(std::span<const checkpoint_view::state_buffer> buffers,
                                                  const state_format& f, bool data) {
  std::vector<state_entry> entries;
  for (const auto& b : buffers) {
    const untyped values = data ? b.data : untyped{nullptr, f.dtype, f.block ? 1 : f.bits / 8, f.dtype == "F32"};
    if (!f.block) {
      entries.push_back({b.key, values, 1, 1, b.shift});
      continue;
    }
    entries.push_back({b.key, values, f.bits, 8, b.shift});
    entries.push_back({b.key + "_scale", data ? b.scales : untyped{nullptr, "F32", 4, true}, 1, f.block, b.shift});
  }
  return entries;
}

/// A range of a tensor's elements as the entries of e: a flat [entries] in the file.
MPOPT_DECL saved_range entries_of(saved_range r, const state_entry& e) {
  if (e.num == e.den) return r;
  const std::size_t first = r.first * e.num / e.den;
  r.count = e.entries(r.first + r.count) - first;
  r.first = first;
  r.elements = e.entries(r.elements);
  r.shape = nullptr;
  return r;
}

/// A rank's range of a tensor as the entries of e, and where they start in e's buffer.
MPOPT_DECL flat_layout::owned_range entries_of(const flat_layout::owned_range& o, const state_entry& e) {
  const std::size_t first = o.first * e.num / e.den;
  return {first, e.entries(o.first + o.count) - first, (o.state - e.shift) * e.num / e.den};
}

/// Each rank's range of a tensor (flat_layout::pieces: their state unused) as the entries of e.
MPOPT_DECL std::vector<flat_layout::owned_range> entries_of(std::vector<flat_layout::owned_range> ranges,
                                                            const state_entry& e) {
  for (auto& o : ranges) o = entries_of(flat_layout::owned_range{o.first, o.count, e.shift}, e);
  return ranges;
}

MPOPT_DECL std::vector<state_piece> held_pieces(const checkpoint_view& v, const std::vector<std::size_t>& kept_at,
                                                std::size_t file_tensors, const saved_storage& file) {
  // Storage the file holds otherwise is converted (state_conversion.hpp): its pieces, whole and
  // without data, are checked and not read.
  const bool same_state = file.state == v.state_storage, same_master = file.master == v.master_storage;
  const untyped file_master{nullptr, file.master.dtype, file.master.element_bytes, file.master.dtype == "F32"};
  std::vector<state_piece> pieces;
  std::size_t t = 0;
  for (const auto& g : v.groups) {
    const std::vector<state_entry> state = state_entries(v.group_state(g), file.state, same_state);
    for (const auto& e : g.tensors) {
      const saved_range whole{t, e.size, 0, e.size, false, v.tensors_on_device, e.shape};
      const auto o = v.layout ? v.layout->owned(t) : flat_layout::owned_range{};
      const saved_range held =
          v.layout ? saved_range{t, e.size, o.first, o.count, v.layout->sharded(), v.state_on_device, e.shape} : whole;
      pieces.push_back({"param/" + *e.name, whole, e.param, {}});
      const std::string master_key = std::string(file.master.key) + "/" + *e.name;
      if (same_master && v.has_master) pieces.push_back({master_key, held, part_of(v.master, o.state), {}});
      if (!same_master && file.master.element_bytes) pieces.push_back({master_key, whole, file_master, {}});
      for (const auto& b : state)
        pieces.push_back({b.key + "/" + *e.name, entries_of(same_state ? held : whole, b),
                          same_state ? part_of(b.data, entries_of(o, b).state) : b.data, {}});
      ++t;
    }
  }
  const saved_range per_tensor{t, file_tensors, 0, t, false, false, nullptr, &kept_at};
  for (const auto& [key, values] : v.kept) pieces.push_back({key, per_tensor, values, {}});
  return pieces;
}

MPOPT_DECL std::vector<state_piece> file_pieces(const checkpoint_view& v, int replica) {
  using range = flat_layout::owned_range;
  const flat_layout& layout = *v.layout;
  const std::size_t w = v.world;
  auto from = [&](std::size_t rank, std::size_t n) {
    std::vector<range> senders(w);
    if (rank >= w) fail("checkpoint: no rank ", rank, " among ", w);  // an invariant, stated for g++'s -Warray-bounds
    senders[rank] = {0, n, 0};
    return senders;
  };
  // Group g's tensor t, of set e: where each rank's part of its state is.
  auto state_senders = [&](const expert_placement* p, std::size_t e, std::size_t t, std::size_t n) {
    if (replica) return from(std::size_t(replica), n);
    if (!layout.sharded()) return from(p ? p->first_replica(e) : 0, n);
    const std::vector<range> pieces = layout.pieces(t);
    if (!p) return pieces;
    std::vector<range> senders(w);
    for (std::size_t r = 0; r < w; ++r) senders[r] = p->ep_of[r] == e ? pieces[p->replica_of[r]] : range{};
    return senders;
  };
  std::vector<state_piece> out;
  std::size_t first = 0;  // the group's first tensor
  for (const auto& g : v.groups) {
    const std::vector<state_entry> state = state_entries(v.group_state(g), v.state_storage, true);
    const expert_placement* p = g.experts;
    for (std::size_t e = 0; e < (p ? p->size() : 1); ++e)
      for (std::size_t j = 0; j < g.tensors.size(); ++j) {
        const auto& entry = g.tensors[j];
        const std::size_t t = first + j;
        const bool mine = !p || e == p->mine;
        const std::string name = p ? std::string(p->name(e, j)) : *entry.name;
        const auto own = layout.owned(t);
        const saved_range whole{t, entry.size, 0, entry.size, false, v.tensors_on_device, entry.shape};
        const saved_range held{t, entry.size, own.first, own.count, layout.sharded(), v.state_on_device, entry.shape};
        const std::size_t param_sender = replica ? std::size_t(replica) : p ? p->first_replica(e) : 0;
        out.push_back({replica_key(replica, "param/" + name), whole, part_of(entry.param, 0, mine),
                       from(param_sender, entry.size)});
        if (v.has_master)
          out.push_back({replica_key(replica, std::string(v.master_storage.key) + "/" + name), held, part_of(v.master, own.state, mine),
                         state_senders(p, e, t, entry.size)});
        for (const auto& b : state)
          out.push_back({replica_key(replica, b.key + "/" + name), entries_of(held, b),
                         part_of(b.data, entries_of(own, b).state, mine), entries_of(state_senders(p, e, t, entry.size), b)});
      }
    first += g.tensors.size();
  }
  if (replica) return out;
  const std::size_t file_tensors = v.file_tensors();
  for (const auto& [key, values] : v.kept) {
    std::size_t t = 0, at = 0;
    for (const auto& g : v.groups) {
      const expert_placement* p = g.experts;
      const std::size_t n = g.tensors.size();
      for (std::size_t e = 0; e < (p ? p->size() : 1); ++e, at += n) {
        const saved_range run{t, file_tensors, at, n, false, false, nullptr, nullptr, true};
        out.push_back({key, run, part_of(values, t, !p || e == p->mine), from(p ? p->first_replica(e) : 0, n)});
      }
      t += n;
    }
  }
  return out;
}

MPOPT_DECL nlohmann::json saved_groups(const checkpoint_view& v, std::span<const nlohmann::json> options,
                                       std::span<const std::uint64_t> steps) {
  nlohmann::json groups = nlohmann::json::array();
  for (std::size_t g = 0; g < v.groups.size(); ++g) {
    const auto& group = v.groups[g];
    const expert_placement* p = group.experts;
    nlohmann::json tensors = nlohmann::json::array();
    for (std::size_t e = 0; e < (p ? p->size() : 1); ++e)
      for (std::size_t j = 0; j < group.tensors.size(); ++j)
        add_saved_tensor(tensors, p ? std::string(p->name(e, j)) : *group.tensors[j].name, group.tensors[j].size);
    groups.push_back(saved_group(options[g], steps[g], std::move(tensors)));
  }
  return groups;
}

MPOPT_DECL found_tensors find_saved_tensors(const checkpoint_view& v, const nlohmann::json& saved,
                                            const nlohmann::json& described, const std::string& where) {
  if (saved.size() != v.groups.size())
    fail(where, "saved with ", saved.size(), " groups, this optimizer has ", v.groups.size());
  found_tensors found;
  for (std::size_t g = 0; g < saved.size(); ++g) {
    const nlohmann::json& tensors = saved[g].at("tensors");
    if (v.groups[g].expert_parallel) {
      std::vector<std::pair<std::string, std::size_t>> experts;
      for (const auto& e : v.groups[g].tensors) experts.emplace_back(*e.name, e.size);
      find_experts(experts, tensors, found.file_tensors, found.kept_at,
                   where + "expert group " + std::to_string(g) + ": ");
    } else if (tensors != described[g]["tensors"]) {
      fail(where, "group ", g, " holds different tensors: saved ", tensors.dump(), ", this optimizer has ",
           described[g]["tensors"].dump());
    } else {
      for (std::size_t i = 0; i < tensors.size(); ++i) found.kept_at.push_back(found.file_tensors + i);
    }
    found.file_tensors += tensors.size();
    found.group_tensors.push_back(tensors.size());
  }
  return found;
}

}  // namespace mpopt::detail
