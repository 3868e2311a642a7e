// mpopt — flat_layout's definitions (flat_layout.hpp): inline header-only, else compiled once by
// <mpopt/src.hpp>.
#pragma once

#include "flat_layout.hpp"

#include "../options/validate.hpp"

namespace mpopt::detail {

MPOPT_DECL std::size_t heap_bytes(const std::vector<bucket>& buckets) {
  std::size_t bytes = buckets.capacity() * sizeof(bucket);
  for (const auto& k : buckets)
    bytes += k.pieces.bytes() + k.mine.bytes() + k.counts.capacity() * sizeof(std::size_t) +
             k.gaps.capacity() * sizeof(k.gaps[0]);
  return bytes;
}

MPOPT_DECL flat_layout::flat_layout(const std::vector<std::uint32_t>& tensor_groups,
                                    const std::vector<std::size_t>& tensor_sizes, std::vector<shard_plan> plans,
                                    bool sharded, bool summed, std::size_t align)
    : sharded_(sharded), summed_(summed) {
  std::size_t flat = 0, local = 0;
  const std::size_t groups = plans.size();
  first_tensor_.assign(groups + 1, tensor_sizes.size());
  for (std::uint32_t g = 0, t = 0; g < groups; ++g) {
    first_tensor_[g] = t;
    space s{flat, 0, {}, 0, std::move(plans[g]), {}};
    order_shards(s);
    std::size_t at = flat;
    for (; t < tensor_sizes.size() && tensor_groups[t] == g; ++t) {
      offset_.push_back(at);
      at = round_up(at + tensor_sizes[t], align);
    }
    const std::size_t parts = s.plan.parts, tensors = t - first_tensor_[g];
    if (s.plan.first_tensors.empty()) {
      s.size = round_up(at - flat, align * parts);
      for (std::size_t sh = 0; sh <= parts; ++sh) s.bounds.push_back(sh * (s.size / parts));
    } else {
      const auto& firsts = s.plan.first_tensors;
      if (firsts.size() != parts || !std::is_sorted(firsts.begin(), firsts.end()) || firsts.front() != 0 ||
          firsts.back() > tensors)
        fail("flat_layout: first_tensors must give each of the ", parts, " shards its first tensor, from 0, ascending");
      s.size = at - flat;
      for (std::size_t f : firsts) s.bounds.push_back(f < tensors ? offset_[first_tensor_[g] + f] - flat : s.size);
      s.bounds.push_back(s.size);
    }
    s.local_begin = sharded ? local : flat;
    local += s.bounds[s.plan.part + 1] - s.bounds[s.plan.part];
    flat += s.size;
    spaces_.push_back(std::move(s));
  }
  sizes_ = tensor_sizes;
  groups_ = tensor_groups;
  flat_elements_ = flat;
  local_elements_ = sharded ? local : flat;
}

MPOPT_DECL buffer_layout flat_layout::state_buffers(std::size_t count, const std::vector<std::size_t>& kept) const {
  if (kept.size() != spaces_.size() || std::any_of(kept.begin(), kept.end(), [&](std::size_t n) { return n > count; }))
    fail("flat_layout: buffer counts for ", kept.size(), " groups, each at most ", count, ", for ", spaces_.size());
  buffer_layout b;
  b.elements.assign(count, 0);  // a buffer no group keeps (no group chose its rule) holds nothing
  for (std::size_t g = 0; g < spaces_.size(); ++g) {  // the groups' local ranges follow each other
    const auto [begin, end] = local_range(g);
    auto& shift = b.shift.emplace_back(kept[g]);
    for (std::size_t k = 0; k < kept[g]; ++k) {
      shift[k] = begin - b.elements[k];
      b.elements[k] += end - begin;
    }
  }
  return b;
}

MPOPT_DECL bool flat_layout::shards_in_rank_order() const {
  for (const space& s : spaces_)
    for (std::size_t r = 0; r < s.plan.parts; ++r)
      if (s.plan.rank_of[r] != r) return false;
  return true;
}

MPOPT_DECL std::vector<std::pair<std::size_t, std::size_t>> flat_layout::uncounted(const work_list& w) const {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t g = 0; g < spaces_.size(); ++g) {
    const std::size_t c0 = w.first_chunk(first_tensor_[g]), c1 = w.first_chunk(first_tensor_[g + 1]);
    if (!spaces_[g].plan.counted && c0 < c1) out.push_back({c0, c1});
  }
  return out;
}

MPOPT_DECL std::size_t flat_layout::bytes() const {
  std::size_t bytes = spaces_.capacity() * sizeof(space) +
                      (offset_.capacity() + sizes_.capacity() + first_tensor_.capacity()) * sizeof(std::size_t) +
                      groups_.capacity() * sizeof(std::uint32_t);
  for (const space& s : spaces_)
    bytes += (s.plan.rank_of.capacity() + s.plan.first_tensors.capacity() + s.shard_of.capacity() +
              s.bounds.capacity()) * sizeof(std::size_t);
  return bytes;
}

MPOPT_DECL std::vector<flat_layout::owned_range> flat_layout::pieces(std::size_t t) const {
  std::vector<owned_range> out;
  const space& s = spaces_[groups_[t]];
  for (std::size_t r = 0; r < s.plan.parts; ++r) {
    const auto [lo, hi] = in_shard(t, s.shard_of[r]);
    out.push_back(lo < hi ? owned_range{lo - offset_[t], hi - lo, 0} : owned_range{});
  }
  return out;
}

MPOPT_DECL work_list flat_layout::local_work() const {
  work_list w;
  for_each_owned_range(0, flat_elements_, [&](std::uint32_t t, std::size_t a, std::size_t b, std::size_t owner) {
    if (!sharded_ || owner == spaces_[groups_[t]].plan.part)
      w.add(t, a - offset_[t], b - offset_[t], local_index(a), std::uint32_t(owner));
  });
  return w;
}

MPOPT_DECL work_list flat_layout::flat_work() const {
  work_list w;
  for_each_owned_range(0, flat_elements_, [&](std::uint32_t t, std::size_t a, std::size_t b, std::size_t owner) {
    w.add(t, a - offset_[t], b - offset_[t], a, std::uint32_t(owner));
  });
  return w;
}

MPOPT_DECL std::vector<bucket> flat_layout::buckets(std::size_t max_elements) const {
  std::vector<bucket> out;
  for (std::size_t g = 0; g < spaces_.size(); ++g) {
    const std::size_t end = spaces_[g].begin + spaces_[g].size;
    std::size_t begin = spaces_[g].begin;
    for (std::size_t t = first_tensor_[g]; t < first_tensor_[g + 1]; ++t) {
      const std::size_t extent = extent_end(g, t);
      if (extent - begin > max_elements && begin < offset_[t]) {
        out.push_back(make_bucket(g, begin, offset_[t]));
        begin = offset_[t];
      }
      for (; extent - begin > max_elements; begin += max_elements)
        out.push_back(make_bucket(g, begin, begin + max_elements));
    }
    if (begin < end) out.push_back(make_bucket(g, begin, end));
  }
  return out;
}

MPOPT_DECL void flat_layout::order_shards(space& s) {
  const std::size_t parts = s.plan.parts;
  if (parts == 0) fail("flat_layout: a group needs at least one shard");
  if (s.plan.rank_of.empty())
    for (std::size_t r = 0; r < parts; ++r) s.plan.rank_of.push_back(r);
  s.shard_of.assign(parts, parts);
  for (std::size_t sh = 0; sh < parts; ++sh)
    if (s.plan.rank_of.size() != parts || s.plan.rank_of[sh] >= parts || s.shard_of[s.plan.rank_of[sh]] != parts)
      fail("flat_layout: shard_ranks must give each of the ", parts, " shards a rank of its own");
    else
      s.shard_of[s.plan.rank_of[sh]] = sh;
}

MPOPT_DECL bucket flat_layout::make_bucket(std::size_t g, std::size_t begin, std::size_t end) const {
  const space& s = spaces_[g];
  const std::size_t parts = s.plan.parts, part = s.plan.part;
  bucket k;
  k.begin = begin;
  k.end = end;
  k.group = std::uint32_t(g);
  k.my_rank = s.plan.rank_of[part];
  // The packed bucket holds each rank's piece in rank order: block[sh] is where shard sh's starts.
  std::vector<std::size_t> block(parts);
  for (std::size_t r = 0, at = 0; r < parts; ++r) {
    const auto [lo, hi] = shard_in_range(s, s.shard_of[r], begin, end);
    k.counts.push_back(lo < hi ? hi - lo : 0);
    block[s.shard_of[r]] = at;
    if (r < k.my_rank) k.my_offset += k.counts.back();
    at += k.counts.back();
  }
  auto packed = [&](std::size_t x) {  // where flat position x goes in the packed bucket
    const std::size_t sh = shard_at(s, x);
    return block[sh] + (x - shard_in_range(s, sh, begin, end).first);
  };
  // Padding, cut at shard boundaries; pieces that stay adjacent once packed are one gap.
  auto add_gap = [&](std::size_t lo, std::size_t hi) {
    for (std::size_t x = lo; x < hi;) {
      const std::size_t y = std::min(hi, s.begin + s.bounds[shard_at(s, x) + 1]);
      if (!k.gaps.empty() && k.gaps.back().first + k.gaps.back().second == packed(x)) k.gaps.back().second += y - x;
      else k.gaps.push_back({packed(x), y - x});
      x = y;
    }
  };
  k.first_tensor = std::uint32_t(first_tensor_[g + 1]);
  for (std::size_t t = first_tensor_[g]; t < first_tensor_[g + 1]; ++t) {
    const bool touches = offset_[t] < end && begin < offset_[t] + sizes_[t];
    if (touches) {
      k.first_tensor = std::min(k.first_tensor, std::uint32_t(t));
      k.last_tensor = std::uint32_t(t + 1);
    }
    add_gap(std::max(begin, offset_[t] + sizes_[t]), std::min(end, extent_end(g, t)));
  }
  if (k.last_tensor == 0) k.first_tensor = 0;
  for_each_owned_range(
      begin, end,
      [&](std::uint32_t t, std::size_t a, std::size_t b, std::size_t owner) {
        k.pieces.add(t, a - offset_[t], b - offset_[t], packed(a), std::uint32_t(owner));
        if (owner == part) k.mine.add(t, a - offset_[t], b - offset_[t], packed(a), std::uint32_t(owner));
      },
      first_tensor_[g], first_tensor_[g + 1]);
  const auto [mine, mine_end] = shard_in_range(s, part, begin, end);
  if (mine < mine_end) k.my_state = local_index(mine);
  return k;
}

}  // namespace mpopt::detail
