// mpopt — where every element lives. Each group's tensors lie end to end in one flat space (each
// start at a multiple of `align` elements: 16, 64 bytes of fp32, or a quantized state's block),
// padded so that it splits into `parts` equal shards whose starts are such multiples too, or split
// at tensors, each whole on one rank (shard_plan::first_tensors); the groups' spaces follow each
// other. A group's shards are those of its data-parallel communicator (the optimizer's, or an
// expert group's own: shard_plan). A sharded rank keeps state for its shard of every group, back
// to back; a replicated rank keeps all of it, in flat order.
// Either way, work is cut at the shard boundaries, so that partial sums are formed, and combined in
// rank order, the same way under every partition policy. Shard r is rank r's unless the partition
// says otherwise (`rank_of`); collectives always see a bucket's pieces in rank order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../passes/work_list.hpp"

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
  /// Where shards start at tensors instead of being equal: shard s starts at the group's tensor
  /// first_tensors[s] (counted from the group's first; ascending; the group's count: an empty
  /// shard at the end). Empty: equal shards.
  std::vector<std::size_t> first_tensors;
};

/// Heap bytes of a list of buckets.
MPOPT_DECL std::size_t heap_bytes(const std::vector<bucket>& buckets);

/// Where each group's state sits in the rule's state buffers when groups keep different numbers of
/// them (rules<R...>: a Muon group keeps one, an AdamW group two). Buffer k holds the local state of
/// the groups that keep it, back to back in local order: group g's element at local index x is at
/// x - shift[g][k] in buffer k.
struct buffer_layout {
  std::vector<std::size_t> elements;            ///< per buffer: its elements on this rank
  std::vector<std::vector<std::size_t>> shift;  ///< per group, per buffer it keeps

  /// Heap bytes it holds.
  std::size_t bytes() const {
    std::size_t n = elements.capacity() * sizeof(std::size_t) + shift.capacity() * sizeof(shift[0]);
    for (const auto& s : shift) n += s.capacity() * sizeof(std::size_t);
    return n;
  }
};

class flat_layout {
 public:
  /// Elements per 64 bytes of fp32: where tensors and shards start unless told otherwise.
  static constexpr std::size_t default_align = 16;

  /// tensor_groups[t] is the group of tensor t (ascending), tensor_sizes[t] its elements; plans[g]
  /// how group g splits. `summed`: the ranks' partial sums of squares (of counted groups) add up to
  /// the global ones (sharded, or groups replicated over different communicators). Tensors and
  /// shards start at multiples of `align` elements (a multiple of 16).
  MPOPT_DECL flat_layout(const std::vector<std::uint32_t>& tensor_groups, const std::vector<std::size_t>& tensor_sizes,
                         std::vector<shard_plan> plans, bool sharded, bool summed, std::size_t align = default_align);
  /// Every group split alike: `parts` shards, this rank's `part`, shard s held by shard_ranks[s].
  flat_layout(const std::vector<std::uint32_t>& tensor_groups, const std::vector<std::size_t>& tensor_sizes,
              std::size_t groups, int parts, int part, bool sharded, std::vector<std::size_t> shard_ranks = {})
      : flat_layout(tensor_groups, tensor_sizes,
                    std::vector<shard_plan>(groups,
                                            {std::size_t(parts), std::size_t(part), std::move(shard_ranks), true, {}}),
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
  MPOPT_DECL bool shards_in_rank_order() const;
  /// The chunk ranges of `w` (this rank's local_work()) whose partial sums of squares this rank
  /// does not count in the global norm.
  MPOPT_DECL std::vector<std::pair<std::size_t, std::size_t>> uncounted(const work_list& w) const;
  /// Elements of all tensors, without padding.
  std::size_t parameters() const {
    std::size_t n = 0;
    for (std::size_t s : sizes_) n += s;
    return n;
  }
  /// Elements of the local state on this rank (my shards, or everything when replicated): of the
  /// masters, and of each state buffer that every group keeps.
  std::size_t local_elements() const { return local_elements_; }
  /// Group g's local state: indices [first, second).
  std::pair<std::size_t, std::size_t> local_range(std::size_t g) const {
    const space& s = spaces_[g];
    return {s.local_begin, s.local_begin + (sharded_ ? s.bounds[s.plan.part + 1] - s.bounds[s.plan.part] : s.size)};
  }
  /// The layout of `count` state buffers where group g keeps the first kept[g] of them.
  MPOPT_DECL buffer_layout state_buffers(std::size_t count, const std::vector<std::size_t>& kept) const;
  /// Heap bytes the layout holds.
  MPOPT_DECL std::size_t bytes() const;

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
  MPOPT_DECL std::vector<owned_range> pieces(std::size_t t) const;

  /// The update work of this rank: its elements of every tensor, addressing the local state.
  MPOPT_DECL work_list local_work() const;

  /// Every element of every tensor, addressing a full-size buffer in flat order.
  MPOPT_DECL work_list flat_work() const;

  /// Cuts every group's space into buckets of at most `max_elements`, breaking between tensors where
  /// possible; a tensor larger than a bucket gets buckets of its own.
  MPOPT_DECL std::vector<bucket> buckets(std::size_t max_elements) const;

 private:
  struct space {
    std::size_t begin;        ///< flat start of the group
    std::size_t size;         ///< padded elements
    std::vector<std::size_t> bounds;  ///< shard s is [begin + bounds[s], begin + bounds[s + 1])
    std::size_t local_begin;  ///< where the group starts in the local state
    shard_plan plan;
    std::vector<std::size_t> shard_of;  ///< the shard each rank holds
  };

  /// Completes s.plan.rank_of (identity when empty) and its inverse, refusing a plan that does not
  /// give each shard a rank of its own.
  MPOPT_DECL static void order_shards(space& s);

  static std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

  /// Shard sh of space s within the flat range [begin, end) (empty when lo >= hi).
  static std::pair<std::size_t, std::size_t> shard_in_range(const space& s, std::size_t sh, std::size_t begin,
                                                            std::size_t end) {
    return {std::max(begin, s.begin + s.bounds[sh]), std::min(end, s.begin + s.bounds[sh + 1])};
  }
  /// The shard of space s that holds flat position x (of the space): the last that starts at or before it.
  static std::size_t shard_at(const space& s, std::size_t x) {
    return std::size_t(std::upper_bound(s.bounds.begin(), s.bounds.end() - 1, x - s.begin) - s.bounds.begin()) - 1;
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
    return s.local_begin + (x - s.begin - s.bounds[s.plan.part]);
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
        const std::size_t owner = shard_at(s, a);
        const std::size_t b = std::min(last, s.begin + s.bounds[owner + 1]);
        f(t, a, b, owner);
        a = b;
      }
    }
  }

  MPOPT_DECL bucket make_bucket(std::size_t g, std::size_t begin, std::size_t end) const;

  bool sharded_, summed_;
  std::vector<space> spaces_;
  std::vector<std::size_t> offset_, sizes_;
  std::vector<std::uint32_t> groups_;
  std::vector<std::size_t> first_tensor_;  ///< per group, plus one past the last
  std::size_t flat_elements_ = 0, local_elements_ = 0;
};

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "flat_layout.ipp"
#endif
