// mpopt — where every element lives. Each group's tensors lie end to end in one flat space (each
// start 64-byte aligned), padded so that it splits into `parts` equal shards whose starts are 64-byte
// aligned too; the groups' spaces follow each other. A group's shards are those of its data-parallel
// communicator (the optimizer's, or an expert group's own: shard_plan). A sharded rank keeps state
// for its shard of every group, back to back; a replicated rank keeps all of it, in flat order.
// Either way, work is cut at the shard boundaries, so that partial sums are formed, and combined in
// rank order, the same way under every partition policy. Shard r is rank r's unless the partition
// says otherwise (`rank_of`); collectives always see a bucket's pieces in rank order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "validate.hpp"
#include "work_list.hpp"

namespace mpopt::detail {

/// A contiguous range of one group's flat space, reduced or gathered by one collective (over the
/// group's communicator).
struct bucket {
  std::size_t begin = 0, end = 0;               ///< flat range
  std::uint32_t group = 0;                      ///< the group whose space it cuts
  std::uint32_t first_tensor = 0, last_tensor = 0;  ///< tensors [first, last) with elements in it
  work_list pieces;                             ///< those elements; state = offset in the bucket
  work_list mine;                               ///< the ones in my shard
  std::vector<std::size_t> counts;              ///< elements of each rank's shard in the bucket, in rank order
  std::size_t my_rank = 0;                      ///< my rank in the group's communicator
  std::size_t my_offset = 0;                    ///< where my piece starts in the packed bucket
  std::size_t my_state = 0;                     ///< local state index of my piece's first element
  std::vector<std::pair<std::size_t, std::size_t>> gaps;  ///< padding (offset, count) in the bucket

  std::size_t size() const { return end - begin; }
  std::size_t my_count(int rank) const { return counts[std::size_t(rank)]; }
  std::size_t my_count() const { return counts[my_rank]; }
};

/// How one group's space splits across the ranks of its data-parallel communicator.
struct shard_plan {
  std::size_t parts = 1;             ///< shards: the communicator's size (1: work not cut)
  std::size_t part = 0;              ///< the shard this rank holds (sharded layouts)
  std::vector<std::size_t> rank_of;  ///< the rank holding each shard; empty: shard s is rank s's
  /// Whether this rank's partial sums of squares of the group count in the global norm: each element
  /// is counted by one rank (replicas of an expert group: the first of them).
  bool counted = true;
};

/// Heap bytes of a list of buckets.
inline std::size_t heap_bytes(const std::vector<bucket>& buckets) {
  std::size_t bytes = buckets.capacity() * sizeof(bucket);
  for (const auto& k : buckets)
    bytes += k.pieces.bytes() + k.mine.bytes() + k.counts.capacity() * sizeof(std::size_t) +
             k.gaps.capacity() * sizeof(k.gaps[0]);
  return bytes;
}

class flat_layout {
 public:
  static constexpr std::size_t align = 16;  // floats per 64 bytes

  /// tensor_groups[t] is the group of tensor t (ascending), tensor_sizes[t] its elements; plans[g]
  /// how group g splits. `summed`: the ranks' partial sums of squares (of counted groups) add up to
  /// the global ones (sharded, or groups replicated over different communicators).
  flat_layout(const std::vector<std::uint32_t>& tensor_groups, const std::vector<std::size_t>& tensor_sizes,
              std::vector<shard_plan> plans, bool sharded, bool summed)
      : sharded_(sharded), summed_(summed) {
    std::size_t flat = 0, local = 0;
    const std::size_t groups = plans.size();
    first_tensor_.assign(groups + 1, tensor_sizes.size());
    for (std::uint32_t g = 0, t = 0; g < groups; ++g) {
      first_tensor_[g] = t;
      space s{flat, 0, 0, 0, std::move(plans[g]), {}};
      order_shards(s);
      std::size_t at = flat;
      for (; t < tensor_sizes.size() && tensor_groups[t] == g; ++t) {
        offset_.push_back(at);
        at = round_up(at + tensor_sizes[t], align);
      }
      s.size = round_up(at - flat, align * s.plan.parts);
      s.shard = s.size / s.plan.parts;
      s.local_begin = sharded ? local : flat;
      local += s.shard;
      flat += s.size;
      spaces_.push_back(std::move(s));
    }
    sizes_ = tensor_sizes;
    groups_ = tensor_groups;
    flat_elements_ = flat;
    local_elements_ = sharded ? local : flat;
  }
  /// Every group split alike: `parts` shards, this rank's `part`, shard s held by shard_ranks[s].
  flat_layout(const std::vector<std::uint32_t>& tensor_groups, const std::vector<std::size_t>& tensor_sizes,
              std::size_t groups, int parts, int part, bool sharded, std::vector<std::size_t> shard_ranks = {})
      : flat_layout(tensor_groups, tensor_sizes,
                    std::vector<shard_plan>(groups, {std::size_t(parts), std::size_t(part), std::move(shard_ranks), true}),
                    sharded, sharded) {}

  std::size_t flat_elements() const { return flat_elements_; }
  /// Whether this rank keeps state for its shard only.
  bool sharded() const { return sharded_; }
  /// Whether the ranks' partial sums of squares of counted groups add up to the global ones.
  bool summed() const { return summed_; }
  std::size_t groups() const { return spaces_.size(); }
  /// Tensors of group g are [first_tensor(g), first_tensor(g + 1)).
  std::size_t first_tensor(std::size_t g) const { return first_tensor_[g]; }
  /// How group g splits.
  const shard_plan& plan(std::size_t g) const { return spaces_[g].plan; }
  /// Whether shard r of every group is rank r's.
  bool shards_in_rank_order() const {
    for (const space& s : spaces_)
      for (std::size_t r = 0; r < s.plan.parts; ++r)
        if (s.plan.rank_of[r] != r) return false;
    return true;
  }
  /// The chunk ranges of `w` (this rank's local_work()) whose partial sums of squares this rank
  /// does not count in the global norm.
  std::vector<std::pair<std::size_t, std::size_t>> uncounted(const work_list& w) const {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for (std::size_t g = 0; g < spaces_.size(); ++g) {
      const std::size_t c0 = w.first_chunk(first_tensor_[g]), c1 = w.first_chunk(first_tensor_[g + 1]);
      if (!spaces_[g].plan.counted && c0 < c1) out.push_back({c0, c1});
    }
    return out;
  }
  /// Elements of all tensors, without padding.
  std::size_t parameters() const {
    std::size_t n = 0;
    for (std::size_t s : sizes_) n += s;
    return n;
  }
  /// Elements of each state buffer on this rank (my shards, or everything when replicated).
  std::size_t local_elements() const { return local_elements_; }
  /// Heap bytes the layout holds.
  std::size_t bytes() const {
    std::size_t bytes = spaces_.capacity() * sizeof(space) +
                        (offset_.capacity() + sizes_.capacity() + first_tensor_.capacity()) * sizeof(std::size_t) +
                        groups_.capacity() * sizeof(std::uint32_t);
    for (const space& s : spaces_) bytes += (s.plan.rank_of.capacity() + s.shard_of.capacity()) * sizeof(std::size_t);
    return bytes;
  }

  /// This rank's elements of a tensor: [first, first + count) of it, at local state index `state`.
  struct owned_range {
    std::size_t first = 0, count = 0, state = 0;
  };
  owned_range owned(std::size_t t) const {
    if (!sharded_) return {0, sizes_[t], offset_[t]};
    const auto [lo, hi] = in_shard(t, spaces_[groups_[t]].plan.part);
    return lo < hi ? owned_range{lo - offset_[t], hi - lo, local_index(lo)} : owned_range{};
  }
  /// Tensor t's elements in the shard of each rank of its group's communicator, in rank order:
  /// [first, first + count) of the tensor (state unused).
  std::vector<owned_range> pieces(std::size_t t) const {
    std::vector<owned_range> out;
    const space& s = spaces_[groups_[t]];
    for (std::size_t r = 0; r < s.plan.parts; ++r) {
      const auto [lo, hi] = in_shard(t, s.shard_of[r]);
      out.push_back(lo < hi ? owned_range{lo - offset_[t], hi - lo, 0} : owned_range{});
    }
    return out;
  }

  /// The update work of this rank: its elements of every tensor, addressing the local state.
  work_list local_work() const {
    work_list w;
    for_each_owned_range(0, flat_elements_, [&](std::uint32_t t, std::size_t a, std::size_t b, std::size_t owner) {
      if (!sharded_ || owner == spaces_[groups_[t]].plan.part)
        w.add(t, a - offset_[t], b - offset_[t], local_index(a), std::uint32_t(owner));
    });
    return w;
  }

  /// Every element of every tensor, addressing a full-size buffer in flat order.
  work_list flat_work() const {
    work_list w;
    for_each_owned_range(0, flat_elements_, [&](std::uint32_t t, std::size_t a, std::size_t b, std::size_t owner) {
      w.add(t, a - offset_[t], b - offset_[t], a, std::uint32_t(owner));
    });
    return w;
  }

  /// Cuts every group's space into buckets of at most `max_elements`, breaking between tensors where
  /// possible; a tensor larger than a bucket gets buckets of its own.
  std::vector<bucket> buckets(std::size_t max_elements) const {
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

 private:
  struct space {
    std::size_t begin;        ///< flat start of the group
    std::size_t size;         ///< padded elements
    std::size_t shard;        ///< elements per rank
    std::size_t local_begin;  ///< where the group starts in the local state
    shard_plan plan;
    std::vector<std::size_t> shard_of;  ///< the shard each rank holds
  };

  /// Completes s.plan.rank_of (identity when empty) and its inverse, refusing a plan that does not
  /// give each shard a rank of its own.
  static void order_shards(space& s) {
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

  static std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

  /// Shard sh of space s within the flat range [begin, end) (empty when lo >= hi).
  static std::pair<std::size_t, std::size_t> shard_in_range(const space& s, std::size_t sh, std::size_t begin,
                                                            std::size_t end) {
    return {std::max(begin, s.begin + sh * s.shard), std::min(end, s.begin + (sh + 1) * s.shard)};
  }

  /// The flat range of tensor t's elements in shard r (empty when lo >= hi).
  std::pair<std::size_t, std::size_t> in_shard(std::size_t t, std::size_t r) const {
    return shard_in_range(spaces_[groups_[t]], r, offset_[t], offset_[t] + sizes_[t]);
  }

  std::size_t group_of_flat(std::size_t x) const {
    std::size_t g = 0;
    while (x >= spaces_[g].begin + spaces_[g].size) ++g;
    return g;
  }
  /// Where tensor t's extent (its elements and the padding after them) ends in group g's space.
  std::size_t extent_end(std::size_t g, std::size_t t) const {
    return t + 1 < first_tensor_[g + 1] ? offset_[t + 1] : spaces_[g].begin + spaces_[g].size;
  }

  /// Local state index of flat position x (my shard, or anything when replicated).
  std::size_t local_index(std::size_t x) const {
    if (!sharded_) return x;
    const space& s = spaces_[group_of_flat(x)];
    return s.local_begin + (x - s.begin - s.plan.part * s.shard);
  }

  /// Calls f(tensor, a, b, owner) for every maximal flat range [a, b) of tensor elements within
  /// [lo, hi) that lies in one shard, in flat order, looking at tensors [t0, t1).
  template <class F>
  void for_each_owned_range(std::size_t lo, std::size_t hi, F&& f, std::size_t t0 = 0,
                            std::size_t t1 = std::size_t(-1)) const {
    for (std::uint32_t t = std::uint32_t(t0); t < std::min(t1, offset_.size()); ++t) {
      const space& s = spaces_[groups_[t]];
      const std::size_t first = std::max(lo, offset_[t]), last = std::min(hi, offset_[t] + sizes_[t]);
      for (std::size_t a = first; a < last;) {
        const std::size_t owner = (a - s.begin) / s.shard;
        const std::size_t b = std::min(last, s.begin + (owner + 1) * s.shard);
        f(t, a, b, owner);
        a = b;
      }
    }
  }

  bucket make_bucket(std::size_t g, std::size_t begin, std::size_t end) const {
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
      const std::size_t sh = (x - s.begin) / s.shard;
      return block[sh] + (x - shard_in_range(s, sh, begin, end).first);
    };
    // Padding, cut at shard boundaries; pieces that stay adjacent once packed are one gap.
    auto add_gap = [&](std::size_t lo, std::size_t hi) {
      for (std::size_t x = lo; x < hi;) {
        const std::size_t y = std::min(hi, s.begin + ((x - s.begin) / s.shard + 1) * s.shard);
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

  bool sharded_, summed_;
  std::vector<space> spaces_;
  std::vector<std::size_t> offset_, sizes_;
  std::vector<std::uint32_t> groups_;
  std::vector<std::size_t> first_tensor_;  ///< per group, plus one past the last
  std::size_t flat_elements_ = 0, local_elements_ = 0;
};

}  // namespace mpopt::detail
