// mpopt — where every element lives. Each group's tensors lie end to end in one flat space (each
// start 64-byte aligned), padded so that it splits into `parts` equal shards whose starts are 64-byte
// aligned too; the groups' spaces follow each other. A sharded rank keeps state for shard `part` of
// every group, back to back; a replicated rank keeps all of it, in flat order. Either way, work is cut
// at the shard boundaries of the world size, so that partial sums are formed, and combined in rank
// order, the same way under every partition policy. Shard r is rank r's unless the partition says
// otherwise (`shard_ranks`); collectives always see a bucket's pieces in rank order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "validate.hpp"
#include "work_list.hpp"

namespace mpopt::detail {

/// A contiguous range of one group's flat space, reduced or gathered by one collective.
struct bucket {
  std::size_t begin = 0, end = 0;               ///< flat range
  std::uint32_t first_tensor = 0, last_tensor = 0;  ///< tensors [first, last) with elements in it
  work_list pieces;                             ///< those elements; state = offset in the bucket
  work_list mine;                               ///< the ones in my shard
  std::vector<std::size_t> counts;              ///< elements of each rank's shard in the bucket, in rank order
  std::size_t my_offset = 0;                    ///< where my piece starts in the packed bucket
  std::size_t my_state = 0;                     ///< local state index of my piece's first element
  std::vector<std::pair<std::size_t, std::size_t>> gaps;  ///< padding (offset, count) in the bucket

  std::size_t size() const { return end - begin; }
  std::size_t my_count(int rank) const { return counts[std::size_t(rank)]; }
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

  /// tensor_groups[t] is the group of tensor t (ascending), tensor_sizes[t] its elements. This rank
  /// holds shard `part`; shard_ranks[s] is the rank holding shard s (empty: rank s).
  flat_layout(const std::vector<std::uint32_t>& tensor_groups, const std::vector<std::size_t>& tensor_sizes,
              std::size_t groups, int parts, int part, bool sharded, std::vector<std::size_t> shard_ranks = {})
      : parts_(std::size_t(parts)), part_(std::size_t(part)), sharded_(sharded), rank_of_(std::move(shard_ranks)) {
    if (rank_of_.empty())
      for (std::size_t r = 0; r < parts_; ++r) rank_of_.push_back(r);
    shard_of_.assign(parts_, parts_);
    for (std::size_t sh = 0; sh < parts_; ++sh)
      if (rank_of_.size() != parts_ || rank_of_[sh] >= parts_ || shard_of_[rank_of_[sh]] != parts_)
        fail("flat_layout: shard_ranks must give each of the ", parts_, " shards a rank of its own");
      else
        shard_of_[rank_of_[sh]] = sh;
    std::size_t flat = 0, local = 0;
    first_tensor_.assign(groups + 1, tensor_sizes.size());
    for (std::uint32_t g = 0, t = 0; g < groups; ++g) {
      first_tensor_[g] = t;
      space s{flat, 0, 0, 0};
      std::size_t at = flat;
      for (; t < tensor_sizes.size() && tensor_groups[t] == g; ++t) {
        offset_.push_back(at);
        at = round_up(at + tensor_sizes[t], align);
      }
      s.size = round_up(at - flat, align * parts_);
      s.shard = s.size / parts_;
      s.local_begin = sharded ? local : flat;
      local += s.shard;
      flat += s.size;
      spaces_.push_back(s);
    }
    sizes_ = tensor_sizes;
    groups_ = tensor_groups;
    flat_elements_ = flat;
    local_elements_ = sharded ? local : flat;
  }

  std::size_t flat_elements() const { return flat_elements_; }
  /// Shards each group splits into (the world size, or 1 when work is not cut at shards).
  std::size_t parts() const { return parts_; }
  /// Whether this rank keeps state for its shard only.
  bool sharded() const { return sharded_; }
  /// Whether shard r is rank r's, for every r.
  bool shards_in_rank_order() const {
    for (std::size_t r = 0; r < parts_; ++r)
      if (rank_of_[r] != r) return false;
    return true;
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
    return spaces_.capacity() * sizeof(space) + (offset_.capacity() + sizes_.capacity() + first_tensor_.capacity()) *
                                                    sizeof(std::size_t) +
           groups_.capacity() * sizeof(std::uint32_t) + (rank_of_.capacity() + shard_of_.capacity()) * sizeof(std::size_t);
  }

  /// This rank's elements of a tensor: [first, first + count) of it, at local state index `state`.
  struct owned_range {
    std::size_t first = 0, count = 0, state = 0;
  };
  owned_range owned(std::size_t t) const {
    if (!sharded_) return {0, sizes_[t], offset_[t]};
    const auto [lo, hi] = in_shard(t, part_);
    return lo < hi ? owned_range{lo - offset_[t], hi - lo, local_index(lo)} : owned_range{};
  }
  /// Tensor t's elements in each rank's shard, in rank order: [first, first + count) of the tensor
  /// (state unused). In rank order, they follow each other in the tensor.
  std::vector<owned_range> pieces(std::size_t t) const {
    std::vector<owned_range> out;
    for (std::size_t r = 0; r < parts_; ++r) {
      const auto [lo, hi] = in_shard(t, shard_of_[r]);
      out.push_back(lo < hi ? owned_range{lo - offset_[t], hi - lo, 0} : owned_range{});
    }
    return out;
  }

  /// The update work of this rank: its elements of every tensor, addressing the local state.
  work_list local_work() const {
    work_list w;
    for_each_owned_range(0, flat_elements_, [&](std::uint32_t t, std::size_t a, std::size_t b, std::size_t owner) {
      if (!sharded_ || owner == part_) w.add(t, a - offset_[t], b - offset_[t], local_index(a), std::uint32_t(owner));
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
  };

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
    return s.local_begin + (x - s.begin - part_ * s.shard);
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
    bucket k;
    k.begin = begin;
    k.end = end;
    // The packed bucket holds each rank's piece in rank order: block[sh] is where shard sh's starts.
    std::vector<std::size_t> block(parts_);
    for (std::size_t r = 0, at = 0; r < parts_; ++r) {
      const auto [lo, hi] = shard_in_range(s, shard_of_[r], begin, end);
      k.counts.push_back(lo < hi ? hi - lo : 0);
      block[shard_of_[r]] = at;
      if (r < rank_of_[part_]) k.my_offset += k.counts.back();
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
          if (owner == part_) k.mine.add(t, a - offset_[t], b - offset_[t], packed(a), std::uint32_t(owner));
        },
        first_tensor_[g], first_tensor_[g + 1]);
    const auto [mine, mine_end] = shard_in_range(s, part_, begin, end);
    if (mine < mine_end) k.my_state = local_index(mine);
    return k;
  }

  std::size_t parts_, part_;
  bool sharded_;
  std::vector<std::size_t> rank_of_, shard_of_;  ///< the rank holding each shard; the shard each rank holds
  std::vector<space> spaces_;
  std::vector<std::size_t> offset_, sizes_;
  std::vector<std::uint32_t> groups_;
  std::vector<std::size_t> first_tensor_;  ///< per group, plus one past the last
  std::size_t flat_elements_ = 0, local_elements_ = 0;
};

}  // namespace mpopt::detail
