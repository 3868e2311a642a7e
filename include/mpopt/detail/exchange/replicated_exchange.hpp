// mpopt — the exchange of mpopt::replicated: every rank owns every element, and micro-steps fold
// into one fp32 accumulator that is summed at the boundary over each group's data-parallel ranks
// (every rank, or an expert group's replicas).
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

template <class Precision, class Backend, class Communicator>
class replicated_exchange {
 public:
  using context = exchange_context<Precision, Backend, Communicator>;
  using accumulate_type = typename Precision::accumulate_type;
  using communicate_type = typename Precision::communicate_type;
  static constexpr bool sharded = false;
  static_assert(!collectives_on_tensor_side<Backend, Communicator>,
                "the accumulator the step reads is the one summed over ranks, so it lives where the communicator "
                "works: offload over a device communicator (nccl) needs mpopt::zero1 or mpopt::zero2");

  /// The accumulator holds the sum over micro-steps and ranks (zeroed: padding is sent too),
  /// all-reduced bucket by bucket (in the communication type, through a staging slot, if it differs).
  void allocate(const flat_layout& layout, const context& c) {
    const std::size_t n = layout.local_elements();
    if (c.options.accumulation_steps > 1 || c.comm.size() > 1) accum_ = buffer<accumulate_type>::zeroed(n);
    buckets_ = layout.buckets(c.options.bucket_elements);
    ready_.assign(buckets_, c.tensors.tensor_count);
    flights_.resize(c.options.overlap_comm ? std::size_t(c.options.buckets_in_flight) : 1);
    if (c.comm.size() > 1 && !same_types) {
      for (const auto& k : buckets_) width_ = std::max(width_, k.size());
      converted_ = buffer<communicate_type>::zeroed(flights_.slots() * width_);
    }
  }

  /// Tensor i is done. Under overlap_comm, in the window's last backward, every bucket complete
  /// with all buckets after it is summed over ranks at once. False if i was reported already.
  bool grad_ready(context& c, std::size_t i) {
    if (!ready_.report(i)) return false;
    if (c.options.overlap_comm && c.at_boundary() && sums_over_ranks(c))
      while (ready_.next_complete()) reduce_bucket(c, ready_.take());
    flights_.progress(finisher(c));
    return true;
  }
  bool grad_consumed(std::size_t) const { return false; }

  /// A micro-step inside the window: fold this backward's gradients into the accumulator.
  void micro_step(context& c) {
    c.backend.accumulate(accumulated(c.tensors), c.micro_step == 0);
    ready_.restart();
  }

  /// Where the boundary step reads its gradients: the user's (plus the accumulator) on one rank or
  /// when they stay local (`local`: 1-bit LAMB's compression stage); otherwise the accumulator,
  /// after this micro-step is folded in and summed over ranks.
  step_data<Precision> boundary(context& c, bool local) {
    c.local = local;
    if (!sums_over_ranks(c)) {
      ready_.restart();
      return c.micro_step > 0 ? accumulated(c.tensors) : c.tensors;
    }
    while (ready_.any_left()) reduce_bucket(c, ready_.take());
    flights_.drain(finisher(c));
    ready_.restart();
    auto d = accumulated(c.tensors);
    d.grads_reduced = true;
    return d;
  }

  /// One rank keeps its window through a failed step, so that a caller that catches can retry;
  /// across ranks the gradients were combined in place, and the window is lost.
  bool keeps_window(int world) const { return world == 1; }
  void restart_window() {
    flights_.abandon();
    ready_.restart();
  }

  /// Every rank's per-tensor sums are over all of the tensor's elements already.
  void sum_partials(context&, std::span<double>) {}

  /// The parameters are updated in place on every rank.
  void params_back(context&) {}
  void wait_params(context&, std::size_t = std::size_t(-1)) {}

  /// Lists my buffers; returns the bytes of bookkeeping.
  std::size_t list_memory(memory_report& r) const {
    const std::string accum(type_name<accumulate_type>), sent(type_name<communicate_type>);
    if (accum_.size())
      r.buffers.push_back({"gradient accumulator", accum + " sum over micro-steps and ranks",
                           accum_.size() * sizeof(accumulate_type), true});
    if (converted_.size())
      r.buffers.push_back({flights_.slots() > 1 ? "buckets" : "bucket",
                           "gradients converted to " + sent + " for the all-reduce" +
                               (flights_.slots() > 1 ? ", one per bucket in flight (overlap_comm)" : ""),
                           converted_.size() * sizeof(communicate_type), true});
    return heap_bytes(buckets_) + ready_.bytes() + flights_.bytes();
  }

 private:
  template <class T>
  using buffer = typename Backend::template buffer<T>;
  using request = typename metered<Communicator>::request;
  static constexpr bool same_types = std::is_same_v<accumulate_type, communicate_type>;

  static bool sums_over_ranks(const context& c) { return c.comm.size() > 1 && !c.local; }

  step_data<Precision> accumulated(step_data<Precision> d) {
    d.accum = accum_.data();
    return d;
  }

  /// Folds bucket b's gradients into the accumulator, scaled for sending (in the communication
  /// type, into a staging slot, if it differs), and starts their all-reduce.
  void reduce_bucket(context& c, std::size_t b) {
    const bucket& k = buckets_[b];
    accumulate_type* sum = accum_.data() + k.begin;  // replicated: flat order, a bucket's pieces in it
    const accumulate_type* earlier = c.micro_step > 0 ? sum : nullptr;
    const std::size_t s = flights_.free_slot(finisher(c));
    communicate_type* sent = nullptr;
    if constexpr (same_types) {
      sent = sum;
    } else {
      sent = converted_.data() + s * width_;
      for (const auto& [at, n] : k.gaps) c.backend.zero(sent + at, n);
    }
    c.backend.pack_gradients(c.tensors, k.pieces, sent, earlier, c.send_scale);
    c.before_send();
    auto r = c.comm_of(k.group).start_all_reduce(std::span<communicate_type>(sent, k.size()), reduce_op::sum,
                                                 c.options.overlap_comm);
    flights_.hold(s, std::move(r), std::uint32_t(b), finisher(c));
  }

  /// Takes a completed all-reduce's result out of slot s: back into the accumulator if converted.
  auto finisher(context& c) {
    return [this, &c](std::uint32_t b, std::size_t s) {
      if constexpr (!same_types) {
        const bucket& k = buckets_[b];
        c.backend.fold(accum_.data() + k.begin, converted_.data() + s * width_, k.size(), false);
      } else {
        (void)this, (void)c, (void)b, (void)s;
      }
    };
  }


  std::vector<bucket> buckets_;  // in flat order
  ready_buckets ready_;
  buffer<accumulate_type> accum_;
  buffer<communicate_type> converted_;  // per slot: a bucket in the communication type
  std::size_t width_ = 0;                // elements per slot
  // The all-reduces running, oldest first (job: the bucket); last, so that it is destroyed first.
  in_flight<request, std::uint32_t> flights_;
};

}  // namespace mpopt::detail
