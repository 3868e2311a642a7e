// mpopt — the exchanges of mpopt::zero1 and mpopt::zero2: each rank owns one shard of every
// group's flat space, cut among the ranks of the group's data-parallel communicator (every rank, or
// an expert group's replicas); gradients are reduce-scattered bucket by bucket into the shard and
// the updated parameters all-gathered back. zero1 reduces once per window, zero2 every micro-step, as backward
// reports tensors done.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../../memory_report.hpp"
#include "../../precision.hpp"
#include "exchange_context.hpp"
#include "flat_layout.hpp"
#include "in_flight.hpp"
#include "../comm/metered.hpp"
#include "../backend/tensor_side.hpp"

namespace mpopt::detail {

/// What zero1 and zero2 share: the buckets, the shard's gradient, the two collectives and the
/// slots they run in (in_flight.hpp: one, or buckets_in_flight under overlap_comm).
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
  static constexpr bool shard_in_grads = ShardInGrads;

  /// Each rank's per-tensor partial sums (sums: [one per tensor | one per tensor]) cover its shard:
  /// they add up over the ranks of the tensor's group's communicator.
  void sum_partials(context& c, std::span<double> sums) {
    c.wait();  // the passes wrote the sums
    if (runs_.size() == 1) return c.comm_of(runs_[0].group).all_reduce(sums, reduce_op::sum);
    const std::size_t tensors = sums.size() / 2;
    for (const auto& run : runs_)
      for (std::size_t half : {std::size_t{0}, tensors})
        c.comm_of(run.group).all_reduce(sums.subspan(half + run.first, run.last - run.first), reduce_op::sum);
  }

  /// Across ranks the reduced gradients replaced each rank's own: a failed step loses the window.
  bool keeps_window(int) const { return false; }

  /// After an update each rank holds the new parameters of its shard: all-gather them, bucket by
  /// bucket, first bucket first (the order of the next forward). Under overlap_comm the last
  /// buckets' gathers are left in flight for wait_params.
  void params_back(context& c) {
    for (std::uint32_t b = 0; b < buckets_.size(); ++b) {
      const bucket& k = buckets_[b];
      const std::size_t s = flights_.free_slot(finisher(c));
      auto* packed = staging<param_type>(s);
      c.collective_side().pack_params(c.tensors, k.mine, packed);
      c.before_send();
      flights_.hold(s,
                    c.comm_of(k.group).start_all_gather(std::span<param_type>(packed, k.size()),
                                                        std::span<const std::size_t>(k.counts), c.options.overlap_comm),
                    {b, job::params}, finisher(c));
    }
  }
  /// The parameters of tensor i (every tensor: i = -1) are all gathered when this returns. If a
  /// gather fails the others are dropped, and params_back must run again.
  void wait_params(context& c, std::size_t i = std::size_t(-1)) {
    flights_.drain(finisher(c), [&](const job&) {
      return flights_.any([&](const job& j) { return j.what == job::params && holds(j.bucket, i); });
    });
  }

 protected:
  template <class T>
  using buffer = typename Backend::template buffer<T>;
  /// What the collectives read and write: the state's memory, or the tensors' (offload over nccl).
  template <class T>
  using collective_buffer = collective_buffer_t<Backend, Communicator, T>;
  static constexpr bool same_types = std::is_same_v<accumulate_type, communicate_type>;
  /// A reduced piece can land in the shard itself: of its type, in memory the collective writes.
  static constexpr bool lands_in_shard =
      same_types && !ShardInGrads && !collectives_on_tensor_side<Backend, Communicator>;

  /// Groups that follow each other over one communicator: their tensors [first, last).
  struct tensor_run {
    std::size_t group, first, last;
  };

  /// What a slot's collective leaves to do once it completes.
  struct job {
    std::uint32_t bucket = 0;
    enum kind : std::uint8_t { into_shard, assign, add, params } what = into_shard;
  };

  /// `added`: reduced pieces are added into the shard (zero2 over several micro-steps).
  void allocate_buckets(const flat_layout& layout, const context& c, bool added) {
    added_ = added;
    if (!ShardInGrads) shard_ = buffer<accumulate_type>::zeroed(layout.local_elements());
    buckets_ = layout.buckets(c.options.bucket_elements);
    ready_.assign(buckets_, c.tensors.tensor_count);
    for (std::size_t g = 0; g < layout.groups(); ++g)
      if (runs_.empty() || &c.comm_of(g) != &c.comm_of(runs_.back().group))
        runs_.push_back({g, layout.first_tensor(g), layout.first_tensor(g + 1)});
      else
        runs_.back().last = layout.first_tensor(g + 1);
    std::size_t widest = 0, mine = 0;
    for (const auto& k : buckets_) {
      widest = std::max(widest, k.size());
      mine = std::max(mine, k.my_count());
    }
    flights_.resize(c.options.overlap_comm ? std::size_t(c.options.buckets_in_flight) : 1);
    staging_width_ = widest * std::max(sizeof(communicate_type), sizeof(param_type));
    staging_ = collective_buffer<std::byte>::zeroed(flights_.slots() * staging_width_);
    // A reduced piece lands in the shard directly only where it can and is not added in.
    received_width_ = !lands_in_shard || added ? mine : 0;
    received_ = collective_buffer<communicate_type>::zeroed(flights_.slots() * received_width_);
  }

  /// Tensor i is done: under overlap_comm (and always for zero2, `now`), starts the reduction of
  /// every bucket that is complete with all buckets after it. False if i was reported already.
  bool report_ready(context& c, std::size_t i, bool now, const accumulate_type* flat) {
    if (!ready_.report(i)) return false;
    while (now && ready_.next_complete()) reduce_bucket(c, ready_.take(), flat);
    flights_.progress(finisher(c));
    return true;
  }

  /// Reduces the buckets not reduced yet in this micro-step, waits for every one in flight and
  /// opens the next micro-step.
  void reduce_remaining(context& c, const accumulate_type* flat) {
    while (ready_.any_left()) reduce_bucket(c, ready_.take(), flat);
    flights_.drain(finisher(c));
    ready_.restart();
  }

  /// The window starts over: nothing reported, nothing in flight.
  void restart() {
    flights_.abandon();
    ready_.restart();
  }

  /// Whether every bucket of this tensor went out in this micro-step (its memory may be reused).
  bool reduced(std::size_t tensor) const { return ready_.taken(tensor); }

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

  void list_shard(memory_report& r) const {
    if (shard_.size())
      r.buffers.push_back({"gradient shard",
                           std::string(type_name<accumulate_type>) + " gradients of my shard, reduced over ranks (and micro-steps)",
                           shard_.size() * sizeof(accumulate_type), true});
  }
  /// Lists the buckets' staging and received pieces; returns the buckets' bookkeeping bytes.
  std::size_t list_buckets(memory_report& r) const {
    const std::string sent(type_name<communicate_type>), slots(flights_.slots() > 1 ? "s" : "");
    const std::string each = flights_.slots() > 1 ? ", one per bucket in flight (overlap_comm)" : "";
    if (staging_.size())
      r.buffers.push_back({"bucket" + slots, "packed bucket" + slots + " for reduce-scatter (" + sent + ") and all-gather" + each,
                           staging_.size(), true});
    if (received_.size())
      r.buffers.push_back({"received piece" + slots, "my piece of a reduced bucket (" + sent + ") before it joins the " +
                                                 (ShardInGrads ? "gradient tensors" : "gradient shard") + each,
                           received_.size() * sizeof(communicate_type), true});
    return heap_bytes(buckets_) + ready_.bytes() + flights_.bytes() + runs_.capacity() * sizeof(tensor_run);
  }

  std::vector<bucket> buckets_;  // in flat order
  std::vector<tensor_run> runs_;  // the groups by communicator, for the per-tensor sums
  buffer<accumulate_type> shard_;  // my shard's reduced gradients, unless ShardInGrads

 private:
  using request = typename metered<Communicator>::request;

  /// Packs bucket b's gradients (plus the flat accumulator, if given) in the communication type and
  /// starts their reduce-scatter; my piece is folded into the shard (assigned in the window's first
  /// micro-step, added after) or, under ShardInGrads, written back into the gradient tensors.
  void reduce_bucket(context& c, std::size_t b, const accumulate_type* flat) {
    const bucket& k = buckets_[b];
    const std::size_t s = flights_.free_slot(finisher(c));
    auto* packed = staging<communicate_type>(s);
    auto&& side = c.collective_side();
    side.pack_gradients(c.tensors, k.pieces, packed, flat ? flat + k.begin : nullptr, c.send_scale);
    for (const auto& [at, n] : k.gaps) side.zero(packed + at, n);
    c.before_send();  // the packed bucket is complete
    const bool first = !added_ || c.micro_step == 0;
    job j{std::uint32_t(b), first ? job::assign : job::add};
    communicate_type* out = received_.data() + s * received_width_;
    if constexpr (lands_in_shard) {  // straight into the shard: no conversion, nothing to add to
      if (first) {
        j.what = job::into_shard;
        out = shard_.data() + k.my_state;
      }
    }
    flights_.hold(s,
                  c.comm_of(k.group).start_reduce_scatter(std::span<const communicate_type>(packed, k.size()),
                                                          std::span<communicate_type>(out, k.my_count()),
                                                          std::span<const std::size_t>(k.counts), reduce_op::sum,
                                                          c.options.overlap_comm),
                  j, finisher(c));
  }

  /// Takes a completed collective's result out of slot s.
  auto finisher(context& c) {
    return [this, &c](const job& j, std::size_t s) {
      const bucket& k = buckets_[j.bucket];
      const communicate_type* piece = received_.data() + s * received_width_;
      switch (j.what) {
        case job::into_shard: break;
        case job::params: c.collective_side().unpack_params(c.tensors, k.pieces, staging<param_type>(s)); break;
        case job::assign:
        case job::add:
          if constexpr (ShardInGrads) c.collective_side().unpack_gradients(c.tensors, k.mine, piece, k.my_offset);
          else c.collective_side().fold(shard_.data() + k.my_state, piece, k.my_count(), j.what == job::add);
      }
    };
  }
  /// Whether bucket b holds elements of tensor i (every bucket does of tensor -1).
  bool holds(std::size_t b, std::size_t i) const {
    return i == std::size_t(-1) || (buckets_[b].first_tensor <= i && i < buckets_[b].last_tensor);
  }

  template <class T>
  T* staging(std::size_t slot) {
    return reinterpret_cast<T*>(staging_.data() + slot * staging_width_);
  }

  ready_buckets ready_;                           // which buckets backward completed
  collective_buffer<std::byte> staging_;          // per slot: a packed bucket (gradients, or parameters)
  collective_buffer<communicate_type> received_;  // per slot: my piece of a bucket, before the shard
  std::size_t staging_width_ = 0, received_width_ = 0;  // bytes, elements per slot
  bool added_ = false;  // micro-steps' reduced pieces add up in the shard (zero2)
  in_flight<request, job> flights_;   // the collectives running, oldest first; last: it goes first
};

/// zero1: micro-steps accumulate locally over all elements, in flat order; the window's last
/// backward reduce-scatters every bucket once (under overlap_comm as grad_ready completes them).
template <class Precision, class Backend, class Communicator>
class zero1_exchange
    : public sharded_exchange<Precision, Backend, Communicator,
                              std::is_same_v<typename Precision::accumulate_type, typename Precision::grad_type>> {
  using base = sharded_exchange<Precision, Backend, Communicator,
                                std::is_same_v<typename Precision::accumulate_type, typename Precision::grad_type>>;
  using typename base::accumulate_type;
  template <class T>
  using collective_buffer = typename base::template collective_buffer<T>;

 public:
  using typename base::context;

  void allocate(const flat_layout& layout, const context& c) {
    if (c.options.accumulation_steps > 1) {
      flat_work_ = layout.flat_work();
      flat_accum_ = collective_buffer<accumulate_type>::zeroed(layout.flat_elements());
    }
    this->allocate_buckets(layout, c, false);
  }

  bool grad_ready(context& c, std::size_t i) {
    return this->report_ready(c, i, c.options.overlap_comm && c.at_boundary(), folded(c));
  }
  /// Gradients are read at the boundary, under overlap_comm as their buckets go out; unless my
  /// reduced shard is then written back into them.
  bool grad_consumed(std::size_t i) const { return !base::shard_in_grads && this->reduced(i); }

  void micro_step(context& c) {
    c.collective_side().accumulate(flat(c), c.micro_step == 0);  // packed from, with the gradients
    this->restart();
  }

  step_data<Precision> boundary(context& c, bool) {
    this->reduce_remaining(c, folded(c));
    return this->shard_gradients(c);
  }

  void restart_window() { this->restart(); }

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
  /// The earlier micro-steps' sum, which the boundary adds to its own gradients (none in the first).
  const accumulate_type* folded(const context& c) const { return c.micro_step > 0 ? flat_accum_.data() : nullptr; }

  work_list flat_work_;                            // every element, in flat order
  collective_buffer<accumulate_type> flat_accum_;  // the window's sum, full size
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
  }

  /// Tensor i is done: reduce every bucket that is complete, with all buckets after it. False if
  /// tensor i was already reported in this micro-step.
  bool grad_ready(context& c, std::size_t i) { return this->report_ready(c, i, true, nullptr); }
  /// Buckets go last first, so a tensor is done once it and every later tensor sharing its
  /// buckets were reported (under overlap_comm its bucket was packed, and the copy is in flight).
  bool grad_consumed(std::size_t i) const { return this->reduced(i); }

  void micro_step(context& c) { this->reduce_remaining(c, nullptr); }

  step_data<Precision> boundary(context& c, bool) {
    this->reduce_remaining(c, nullptr);
    return this->shard_gradients(c);
  }

  void restart_window() { this->restart(); }

  std::size_t list_memory(memory_report& r) const {
    this->list_shard(r);
    return this->list_buckets(r);
  }
};

}  // namespace mpopt::detail
