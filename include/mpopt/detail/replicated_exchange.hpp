// mpopt — the exchange of mpopt::replicated: every rank owns every element, and micro-steps fold
// into one fp32 accumulator that is summed over ranks at the boundary.
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

template <class Precision, class Backend, class Communicator>
class replicated_exchange {
 public:
  using context = exchange_context<Precision, Backend, Communicator>;
  using accumulate_type = typename Precision::accumulate_type;
  using communicate_type = typename Precision::communicate_type;
  static constexpr bool sharded = false;

  /// Every element is mine; with sum_by_shard, work is still cut at the would-be shards of the world.
  static flat_layout lay_out(const std::vector<std::uint32_t>& tensor_groups, const std::vector<std::size_t>& sizes,
                             std::size_t groups, const context& c) {
    return flat_layout(tensor_groups, sizes, groups, c.options.sum_by_shard ? c.comm.size() : 1, 0, false);
  }

  /// The accumulator holds the sum over micro-steps and ranks (zeroed: padding is sent too).
  void allocate(const flat_layout& layout, const context& c) {
    const std::size_t n = layout.local_elements();
    if (c.options.accumulation_steps > 1 || c.comm.size() > 1) accum_ = buffer<accumulate_type>::zeroed(n);
    if (c.comm.size() > 1 && !same_types)
      converted_ = buffer<communicate_type>::zeroed(std::min(c.options.bucket_elements, n));
  }

  /// Gradients are all reduced at the boundary: nothing happens as tensors finish.
  bool grad_ready(context&, std::size_t) { return true; }
  bool grad_consumed(std::size_t) const { return false; }

  /// A micro-step inside the window: fold this backward's gradients into the accumulator.
  void micro_step(context& c) { c.backend.accumulate(accumulated(c.tensors), c.micro_step == 0); }

  /// Where the boundary step reads its gradients: the user's (plus the accumulator) on one rank or
  /// when they stay local (`local`: 1-bit LAMB's compression stage); otherwise the accumulator,
  /// after this micro-step is folded in and summed over ranks.
  step_data<Precision> boundary(context& c, bool local) {
    const bool folded = c.micro_step > 0;
    if (c.comm.size() == 1 || local) return folded ? accumulated(c.tensors) : c.tensors;
    auto d = accumulated(c.tensors);
    c.backend.accumulate(d, !folded, c.send_scale);
    all_reduce(c);
    d.grads_reduced = true;
    return d;
  }

  /// One rank keeps its window through a failed step, so that a caller that catches can retry;
  /// across ranks the gradients were combined in place, and the window is lost.
  bool keeps_window(int world) const { return world == 1; }
  void restart_window() {}

  /// Every rank's sums are over all elements already.
  void sum_partials(context&, std::span<double>) {}

  /// The parameters are updated in place on every rank.
  void params_back(context&) {}

  /// Lists my buffers; returns the bytes of bookkeeping (none here).
  std::size_t list_memory(memory_report& r) const {
    const std::string accum(type_name<accumulate_type>), sent(type_name<communicate_type>);
    if (accum_.size())
      r.buffers.push_back({"gradient accumulator", accum + " sum over micro-steps and ranks",
                           accum_.size() * sizeof(accumulate_type), true});
    if (converted_.size())
      r.buffers.push_back({"bucket", "gradients converted to " + sent + " for the all-reduce",
                           converted_.size() * sizeof(communicate_type), true});
    return 0;
  }

 private:
  template <class T>
  using buffer = typename Backend::template buffer<T>;
  static constexpr bool same_types = std::is_same_v<accumulate_type, communicate_type>;

  step_data<Precision> accumulated(step_data<Precision> d) {
    d.accum = accum_.data();
    return d;
  }

  /// Sums the accumulator over ranks in the communication type: in place, or converted piece by piece.
  void all_reduce(context& c) {
    c.wait();  // the accumulate pass wrote what is sent
    if constexpr (same_types) {
      c.comm.all_reduce(accum_.span(), reduce_op::sum);
    } else {
      auto* sent = converted_.data();
      for (std::size_t at = 0; at < accum_.size(); at += converted_.size()) {
        const std::size_t n = std::min(converted_.size(), accum_.size() - at);
        c.backend.fold(sent, accum_.data() + at, n, false);
        c.wait();
        c.comm.all_reduce(std::span<communicate_type>(sent, n), reduce_op::sum);
        c.backend.fold(accum_.data() + at, sent, n, false);
      }
    }
  }

  buffer<accumulate_type> accum_;
  buffer<communicate_type> converted_;  // one piece of the accumulator in the communication type
};

}  // namespace mpopt::detail
