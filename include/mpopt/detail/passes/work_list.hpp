// mpopt — the multi-tensor work list: tensors (or the parts of them a pass touches) cut into chunks of
// at most chunk_elements, in tensor order. Per-chunk partial sums make every reduction independent of the thread count, and
// threads take contiguous, element-balanced runs of chunks, so thousands of small tensors cost one
// parallel loop, not thousands.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "../config.hpp"

namespace mpopt::detail {

constexpr std::size_t chunk_elements = std::size_t{1} << 16;

struct chunk {
  std::uint32_t tensor;  ///< index into the optimizer's tensor table
  std::uint32_t owner;   ///< the rank whose shard holds it (sums are combined per owner, in rank order)
  std::size_t begin;     ///< first element, relative to the tensor
  std::size_t size;
  std::size_t state;     ///< index of element `begin` in the buffer the list addresses
};

/// The elements a pass takes at once in its apply_granule (compressed signs: 16; quantized state: a
/// block), or 0 where it takes a vector at a time in its apply.
template <class Pass>
constexpr MPOPT_HOST_DEVICE std::size_t granule_of() {
  if constexpr (requires { Pass::granule; }) return Pass::granule;
  else return 0;
}

class work_list {
 public:
  /// Adds elements [first, last) of a tensor, element `first` at index `state` of the addressed
  /// buffer. Tensors come in ascending order, a tensor possibly in several ranges (one per owner).
  /// Chunk boundaries sit at multiples of chunk_elements from the tensor's start, whatever the range.
  MPOPT_DECL void add(std::uint32_t tensor, std::size_t first, std::size_t last, std::size_t state,
                      std::uint32_t owner = 0);

  std::size_t size() const { return chunks_.size(); }
  /// Heap bytes the list holds.
  std::size_t bytes() const {
    return chunks_.capacity() * sizeof(chunk) + (prefix_.capacity() + first_chunk_.capacity()) * sizeof(std::size_t);
  }
  const chunk& operator[](std::size_t i) const { return chunks_[i]; }
  const chunk* data() const { return chunks_.data(); }
  std::size_t elements() const { return prefix_.empty() ? 0 : prefix_.back(); }
  /// Chunks of tensor t are [first_chunk(t), first_chunk(t + 1)).
  std::size_t first_chunk(std::size_t t) const { return t < first_chunk_.size() ? first_chunk_[t] : chunks_.size(); }

  /// The run of chunks thread t of n takes: split at the chunk boundaries nearest to equal elements.
  std::pair<std::size_t, std::size_t> range(std::size_t t, std::size_t n) const {
    return {split(t, n), split(t + 1, n)};
  }

 private:
  std::size_t split(std::size_t t, std::size_t n) const {
    if (t >= n) return chunks_.size();
    const std::size_t target = elements() / n * t + elements() % n * t / n;
    return std::size_t(std::lower_bound(prefix_.begin(), prefix_.end(), target) - prefix_.begin());
  }

  std::vector<chunk> chunks_;
  std::vector<std::size_t> prefix_;  ///< elements before chunk i (one more entry than chunks)
  std::vector<std::size_t> first_chunk_;  ///< first chunk of each tensor added so far
};

/// The segments that turn a list's per-chunk partials into per-tensor sums (segmented_sum), for
/// partials laid out as [sum | sum2] (twice size() values) and sums as [tensors | tensors]. A tensor
/// whose chunks all belong to one owner is one segment of `first`; if some tensor's chunks have
/// several owners, `first` sums each (tensor, owner) run and `second` adds each tensor's runs, in
/// rank order: what a rank-ordered reduction of per-shard sums gives.
struct norm_segments {
  std::vector<std::size_t> first, second;  ///< offsets, one more than segments; `second` empty if unused
  std::size_t runs = 0;                    ///< (tensor, owner) runs, when `second` is used

  MPOPT_DECL norm_segments(const work_list& w, std::size_t tensors);

 private:
  /// Offsets o (o[0] = 0, o.back() = total) over [x | x]: o, then total + o[1..].
  static std::vector<std::size_t> twice(const std::vector<std::size_t>& o, std::size_t total) {
    std::vector<std::size_t> r = o;
    for (std::size_t i = 1; i < o.size(); ++i) r.push_back(total + o[i]);
    return r;
  }
};

/// A list's per-chunk partials over chunks [c0, c1), added per owner and then over the owners in
/// rank order: exactly what a rank-ordered all-reduce of each shard's sum gives, so every partition
/// adds alike.
class rank_ordered_sum {
 public:
  rank_ordered_sum() = default;
  explicit rank_ordered_sum(const work_list& w) {
    std::size_t owners = 0;
    for (std::size_t c = 0; c < w.size(); ++c) owners = std::max(owners, std::size_t(w[c].owner) + 1);
    per_owner_.assign(owners, 0.0);
  }
  template <class T>
  double operator()(const work_list& w, const T* partial, std::size_t c0, std::size_t c1) {
    std::fill(per_owner_.begin(), per_owner_.end(), 0.0);
    for (std::size_t c = c0; c < c1; ++c) per_owner_[w[c].owner] += double(partial[c]);
    double total = 0;
    for (double x : per_owner_) total += x;
    return total;
  }
  std::size_t bytes() const { return per_owner_.capacity() * sizeof(double); }

 private:
  std::vector<double> per_owner_;
};

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "work_list.ipp"
#endif
