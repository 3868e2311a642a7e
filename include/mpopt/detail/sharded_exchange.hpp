// mpopt — the exchanges of mpopt::zero1 and mpopt::zero2: each rank owns one shard of every
// group's flat space; gradients are reduce-scattered bucket by bucket into the shard and the updated
// parameters all-gathered back. zero1 reduces once per window, zero2 every micro-step, as backward
// reports tensors done.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../memory_report.hpp"
#include "../precision.hpp"
#include "exchange_context.hpp"
#include "flat_layout.hpp"

namespace mpopt::detail {

/// What zero1 and zero2 share: the buckets, the shard's gradient and the two collectives.
/// ShardInGrads: my reduced shard is written back into the gradient tensors, as DeepSpeed's zero1
/// does when gradients accumulate in their own type (no shard buffer: 4P + 12P/N for fp16 Adam).
template <class Precision, class Backend, class Communicator, bool ShardInGrads>
class sharded_exchange {
 public:
  using context = exchange_context<Precision, Backend, Communicator>;
  using param_type = typename Precision::param_type;
  using accumulate_type = typename Precision::accumulate_type;
  using communicate_type = typename Precision::communicate_type;
  static constexpr bool sharded = true;

  /// Shard r of every group is rank r's.
  static flat_layout lay_out(const std::vector<std::uint32_t>& tensor_groups, const std::vector<std::size_t>& sizes,
                             std::size_t groups, const context& c) {
    return flat_layout(tensor_groups, sizes, groups, c.comm.size(), c.comm.rank(), true);
  }

  /// Each rank's partial sums cover its shard: they add up over ranks.
  void sum_partials(context& c, std::span<double> sums) {
    c.wait();  // the passes wrote the sums
    c.comm.all_reduce(sums, reduce_op::sum);
  }

  /// Across ranks the reduced gradients replaced each rank's own: a failed step loses the window.
  bool keeps_window(int) const { return false; }

  /// After an update each rank holds the new parameters of its shard: all-gather them, bucket by bucket.
  void params_back(context& c) {
    auto* packed = staging<param_type>();
    for (const auto& k : buckets_) {
      c.backend.pack_params(c.tensors, k.mine, packed);
      c.wait();
      c.comm.all_gather(std::span<param_type>(packed, k.size()), std::span<const std::size_t>(k.counts));
      c.backend.unpack_params(c.tensors, k.pieces, packed);
    }
  }

 protected:
  template <class T>
  using buffer = typename Backend::template buffer<T>;
  static constexpr bool same_types = std::is_same_v<accumulate_type, communicate_type>;

  /// `added`: reduced pieces are added into the shard (zero2 over several micro-steps).
  void allocate_buckets(const flat_layout& layout, const context& c, bool added) {
    if (!ShardInGrads) shard_ = buffer<accumulate_type>::zeroed(layout.local_elements());
    buckets_ = layout.buckets(c.options.bucket_elements);
    std::size_t widest = 0, mine = 0;
    for (const auto& k : buckets_) {
      widest = std::max(widest, k.size());
      mine = std::max(mine, k.my_count(c.comm.rank()));
    }
    staging_ = buffer<std::byte>::zeroed(widest * std::max(sizeof(communicate_type), sizeof(param_type)));
    // A reduced piece lands in the shard directly only if it is the shard's type and not added in.
    if (!same_types || ShardInGrads || added) received_ = buffer<communicate_type>::zeroed(mine);
  }

  /// Where the boundary step reads its gradients: my reduced shard.
  step_data<Precision> shard_gradients(const context& c) {
    if constexpr (ShardInGrads) {
      return c.tensors;  // my reduced shard is in the gradient tensors
    } else {
      auto d = c.tensors;
      d.accum = shard_.data();
      d.grads_reduced = true;
      return d;
    }
  }

  /// Packs bucket k's gradients (plus the flat accumulator, if given) in the communication type,
  /// reduce-scatters them and folds my piece into the shard (assigned when `first`, added
  /// otherwise) or, under ShardInGrads, writes it back into the gradient tensors.
  void reduce_bucket(context& c, const bucket& k, const accumulate_type* flat, bool first) {
    auto* packed = staging<communicate_type>();
    c.backend.pack_gradients(c.tensors, k.pieces, packed, flat ? flat + k.begin : nullptr, c.send_scale);
    for (const auto& [at, n] : k.gaps) c.backend.zero(packed + at, n);
    c.wait();  // the packed bucket is complete
    const std::size_t mine = k.my_count(c.comm.rank());
    communicate_type* out = received_.data();
    bool into_shard = false;  // straight into the shard: no conversion, nothing to add to
    if constexpr (same_types && !ShardInGrads) {
      into_shard = first;
      if (first) out = shard_.data() + k.my_state;
    }
    c.comm.reduce_scatter(std::span<const communicate_type>(packed, k.size()), std::span<communicate_type>(out, mine),
                          std::span<const std::size_t>(k.counts), reduce_op::sum);
    if (into_shard) return;
    if constexpr (ShardInGrads) c.backend.unpack_gradients(c.tensors, k.mine, out, k.my_offset);
    else c.backend.fold(shard_.data() + k.my_state, out, mine, !first);
  }

  void list_shard(memory_report& r) const {
    if (shard_.size())
      r.buffers.push_back({"gradient shard",
                           std::string(type_name<accumulate_type>) + " gradients of my shard, reduced over ranks (and micro-steps)",
                           shard_.size() * sizeof(accumulate_type), true});
  }
  /// Lists the bucket and the received piece; returns the buckets' bookkeeping bytes.
  std::size_t list_buckets(memory_report& r) const {
    const std::string sent(type_name<communicate_type>);
    if (staging_.size())
      r.buffers.push_back({"bucket", "one packed bucket for reduce-scatter (" + sent + ") and all-gather",
                           staging_.size(), true});
    if (received_.size())
      r.buffers.push_back({"received piece", "my piece of a reduced bucket (" + sent + ") before it joins the " +
                                                 (ShardInGrads ? "gradient tensors" : "gradient shard"),
                           received_.size() * sizeof(communicate_type), true});
    std::size_t bytes = buckets_.capacity() * sizeof(bucket);
    for (const auto& k : buckets_)
      bytes += k.pieces.bytes() + k.mine.bytes() + k.counts.capacity() * sizeof(std::size_t) +
               k.gaps.capacity() * sizeof(k.gaps[0]);
    return bytes;
  }

  template <class T>
  T* staging() {
    return reinterpret_cast<T*>(staging_.data());
  }

  std::vector<bucket> buckets_;         // in flat order
  buffer<accumulate_type> shard_;       // my shard's reduced gradients, unless ShardInGrads
  buffer<std::byte> staging_;           // one packed bucket (gradients, or parameters to gather)
  buffer<communicate_type> received_;   // my piece of a bucket, before it joins the shard
};

/// zero1: micro-steps accumulate locally over all elements, in flat order; the boundary
/// reduce-scatters every bucket once.
template <class Precision, class Backend, class Communicator>
class zero1_exchange
    : public sharded_exchange<Precision, Backend, Communicator,
                              std::is_same_v<typename Precision::accumulate_type, typename Precision::grad_type>> {
  using base = sharded_exchange<Precision, Backend, Communicator,
                                std::is_same_v<typename Precision::accumulate_type, typename Precision::grad_type>>;
  using typename base::accumulate_type;
  template <class T>
  using buffer = typename base::template buffer<T>;

 public:
  using typename base::context;

  void allocate(const flat_layout& layout, const context& c) {
    if (c.options.accumulation_steps > 1) {
      flat_work_ = layout.flat_work();
      flat_accum_ = buffer<accumulate_type>::zeroed(layout.flat_elements());
    }
    this->allocate_buckets(layout, c, false);
  }

  bool grad_ready(context&, std::size_t) { return true; }
  bool grad_consumed(std::size_t) const { return false; }

  void micro_step(context& c) { c.backend.accumulate(flat(c), c.micro_step == 0); }

  step_data<Precision> boundary(context& c, bool) {
    const accumulate_type* folded = c.micro_step > 0 ? flat_accum_.data() : nullptr;
    for (const auto& k : this->buckets_) this->reduce_bucket(c, k, folded, true);
    return this->shard_gradients(c);
  }

  void restart_window() {}

  std::size_t list_memory(memory_report& r) const {
    this->list_shard(r);
    if (flat_accum_.size())
      r.buffers.push_back({"gradient accumulator",
                           std::string(type_name<accumulate_type>) + " sum over micro-steps, all elements (zero1)",
                           flat_accum_.size() * sizeof(accumulate_type), true});
    return this->list_buckets(r) + flat_work_.bytes();
  }

 private:
  /// The flat accumulator, addressed in flat order.
  step_data<Precision> flat(const context& c) {
    auto d = c.tensors;
    d.work = &flat_work_;
    d.accum = flat_accum_.data();
    return d;
  }

  work_list flat_work_;                // every element, in flat order
  buffer<accumulate_type> flat_accum_;  // the window's sum, full size
};

/// zero2: every micro-step's gradients are reduce-scattered into the shard, bucket by bucket as
/// grad_ready reports tensors done, last bucket first (the order of a backward pass).
template <class Precision, class Backend, class Communicator>
class zero2_exchange : public sharded_exchange<Precision, Backend, Communicator, false> {
  using base = sharded_exchange<Precision, Backend, Communicator, false>;

 public:
  using typename base::context;

  void allocate(const flat_layout& layout, const context& c) {
    this->allocate_buckets(layout, c, c.options.accumulation_steps > 1);
    const auto& buckets = this->buckets_;
    const std::size_t tensors = c.tensors.tensor_count;
    pending_.resize(buckets.size());
    ready_.resize(tensors);
    tensor_buckets_.assign(tensors, {std::uint32_t(buckets.size()), 0});
    for (std::uint32_t b = 0; b < buckets.size(); ++b)
      for (std::uint32_t t = buckets[b].first_tensor; t < buckets[b].last_tensor; ++t)
        tensor_buckets_[t] = {std::min(tensor_buckets_[t].first, b), b + 1};
    restart_window();
  }

  /// Tensor i is done: reduce every bucket that is complete, with all buckets after it. False if
  /// tensor i was already reported in this micro-step.
  bool grad_ready(context& c, std::size_t i) {
    if (ready_[i]) return false;
    ready_[i] = 1;
    for (std::uint32_t b = tensor_buckets_[i].first; b < tensor_buckets_[i].last; ++b) --pending_[b];
    while (flushed_ < this->buckets_.size() && pending_[next_bucket()] == 0) reduce_next_bucket(c);
    return true;
  }
  /// Buckets go last first, so a tensor is done once it and every later tensor sharing its
  /// buckets were reported.
  bool grad_consumed(std::size_t i) const { return tensor_buckets_[i].first + flushed_ >= this->buckets_.size(); }

  void micro_step(context& c) { reduce_remaining(c); }

  step_data<Precision> boundary(context& c, bool) {
    reduce_remaining(c);
    return this->shard_gradients(c);
  }

  /// Opens the next micro-step: no tensor reported, no bucket reduced.
  void restart_window() {
    flushed_ = 0;
    std::fill(ready_.begin(), ready_.end(), std::uint8_t(0));
    for (std::size_t b = 0; b < this->buckets_.size(); ++b)
      pending_[b] = this->buckets_[b].last_tensor - this->buckets_[b].first_tensor;
  }

  std::size_t list_memory(memory_report& r) const {
    this->list_shard(r);
    return this->list_buckets(r) + tensor_buckets_.capacity() * sizeof(bucket_range) +
           pending_.capacity() * sizeof(std::uint32_t) + ready_.capacity();
  }

 private:
  std::size_t next_bucket() const { return this->buckets_.size() - 1 - flushed_; }
  void reduce_next_bucket(context& c) {
    this->reduce_bucket(c, this->buckets_[next_bucket()], nullptr, c.micro_step == 0);
    ++flushed_;
  }
  /// Reduces the buckets grad_ready has not and opens the next micro-step.
  void reduce_remaining(context& c) {
    while (flushed_ < this->buckets_.size()) reduce_next_bucket(c);
    restart_window();
  }

  struct bucket_range {
    std::uint32_t first, last;
  };
  std::vector<bucket_range> tensor_buckets_;  // the buckets holding each tensor
  std::vector<std::uint32_t> pending_;        // per bucket: tensors not reported ready
  std::vector<std::uint8_t> ready_;           // per tensor: reported in this micro-step
  std::size_t flushed_ = 0;                   // buckets reduced in this micro-step
};

}  // namespace mpopt::detail
