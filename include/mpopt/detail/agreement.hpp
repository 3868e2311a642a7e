// mpopt — agreement across ranks: an outcome every rank shares (agree), each step's overflow test
// and global norm (decide_and_update: agree_on_backend, decide_on_host, decide_and_update_on_backend), and the
// settings every rank must hold alike before any gradient moves (check_same_settings). The
// optimizer derives from agreement<itself, its policies>.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../communicator.hpp"
#include "../error.hpp"
#include "../options.hpp"
#include "../precision.hpp"
#include "agree.hpp"
#include "config.hpp"
#include "exchange_context.hpp"
#include "rule_driver.hpp"
#include "spike_guard.hpp"
#include "step_data.hpp"
#include "step_decision.hpp"
#include "same_settings.hpp"

namespace mpopt::detail {

template <class Opt, class Precision, class LossScaler, class Partition, class UpdateRule, class Backend, class Communicator>
class agreement {
 protected:
  /// Runs f on every rank and agrees on the outcome: if it threw mpopt::error anywhere, it throws on
  /// every rank (its own message where it failed), so no rank goes on into a collective alone.
  template <class F>
  void agree(std::string_view what, F&& f) {
    detail::agree(self().comm_, what, std::forward<F>(f));
  }

  /// Across ranks, the backend's step sums are agreed where they are: the non-finite chunks (one
  /// rank's overflow skips the step on all) and, where the layout says they add up (a shard each,
  /// or expert groups), the squared norms. Otherwise every rank's norm is already that of the same
  /// all-reduced gradients.
  void agree_on_backend() {
    Opt& o = self();
    if (o.comm_.size() == 1) return;
    if constexpr (!stream_communicator<Communicator>) o.backend_.synchronize();  // the sums are done
    double* sums = o.decision_sums_.data();
    if (o.layout_->summed()) o.comm_.all_reduce(std::span<double>(sums, 2), reduce_op::sum);
    else o.comm_.all_reduce(std::span<double>(sums + 1, 1), reduce_op::sum);
  }

  /// The boundary's mean loss over its micro-steps (`loss`: the last one's) and, by one all-reduce
  /// where the spike guard tests it, over every rank: all judge the same value.
  void agree_on_loss(double loss) {
    Opt& o = self();
    double mean = o.guard_.window_mean(loss, o.options_.accumulation_steps);
    if (o.guard_.needs_loss() && o.comm_.size() > 1) {
      o.comm_.all_reduce(std::span<double>(&mean, 1), reduce_op::sum);
      mean /= double(o.comm_.size());
    }
    o.guard_.set_loss(mean);
  }

  /// This rank's share of the squared global norm, from per-chunk partial sums the host reads: the
  /// chunks it counts (each element is counted by one rank), added per owner in rank order.
  template <class T>
  double counted_sum(T* partial) {
    Opt& o = self();
    for (const auto& [c0, c1] : o.uncounted_) std::fill(partial + c0, partial + c1, T(0));
    return o.rank_ordered_sum_(o.work_, partial, 0, o.work_.size());  // the same for any thread count
  }
  /// The squared global norm from every rank's share, where the shares add up.
  void sum_norm(double& sumsq) {
    Opt& o = self();
    if (o.layout_->summed()) o.comm_.all_reduce(std::span<double>(&sumsq, 1), reduce_op::sum);
  }

  /// Decides the step, agreed by every rank, and applies it unless it is skipped: by the cheapest
  /// way the rule, driver, backend and layout allow.
  step_decision decide_and_update(step_data<Precision>& d, const step_rule& rule) {
    Opt& o = self();
    using driver = typename Opt::driver;
    if (!rule.needs_gradient_first() && !o.guard_.on() && sums_gradient_v<driver>)
      return update_then_norm(d, rule);  // no gradient pass
    if (decides_on_backend()) return decide_and_update_on_backend(d, rule);
    const step_decision decided = decide_on_host(d, rule);
    if (applies(decided)) {
      o.backend_.to_device(o.decision_.data(), &decided, 1);
      o.commit_and_update(d);
    }
    return decided;
  }

  /// Whether a decided step is applied: the decision does not skip it, nor the spike guard hold it
  /// (which scores every boundary's loss and norm, skipped or not).
  bool applies(const step_decision& decided) {
    Opt& o = self();
    return o.guard_.judge(decided) == spike::none && !decided.skip;
  }

  /// Whether the backend decides the step (step_decision.hpp): one rank owning every element, always;
  /// a device backend also across ranks and shards, keeping the overflow flag and norm in device
  /// memory, unless sum_by_shard has the host add the norm by would-be shard in rank order, or the
  /// driver reads the device mid-step anyway (host_decides: 1-bit LAMB).
  bool decides_on_backend() const {
    const Opt& o = self();
    if (Opt::driver::host_decides) return false;
    if (o.comm_.size() == 1 && !o.layout_->sharded()) return true;
    return Backend::space == memory_space::device && (o.layout_->sharded() || !o.options_.sum_by_shard);
  }

  /// The element-wise overflow test and the squared global norm, agreed by every rank, and the
  /// decision they make. Every rank runs every reduction, whatever it found locally.
  step_decision decide_on_host(const step_data<Precision>& d, const step_rule& rule) {
    Opt& o = self();
    o.backend_.gradient_norm(d, o.chunk_grad_sums_.data());
    o.wait();
    std::uint8_t nonfinite = std::any_of(o.chunk_nonfinite_.begin(), o.chunk_nonfinite_.end(), [](auto b) { return b != 0; });
    double sumsq = counted_sum(o.chunk_grad_sums_.data());
    o.comm_.all_reduce(std::span<std::uint8_t>(&nonfinite, 1), reduce_op::max);
    if (o.compressing()) o.comm_.all_reduce(std::span<double>(&sumsq, 1), reduce_op::sum);
    else sum_norm(sumsq);
    step_decision decided;
    decided.sumsq = sumsq;
    decided.nonfinite = nonfinite;
    rule.decide(decided);
    return decided;
  }

  /// A step that needs nothing before its update (no clipping, no skipping): the update runs at once
  /// under a fixed decision, and its first pass sums the gradient's squares per chunk as it reads them
  /// (step_data::chunk_grad_sum); the norm, combined across ranks as the partition says, comes after.
  /// The step is applied everywhere by then: a failing collective here throws with it applied.
  step_decision update_then_norm(step_data<Precision>& d, const step_rule& rule) {
    Opt& o = self();
    step_decision decided;
    decided.grad_scale = d.grad_scale;
    o.backend_.to_device(o.decision_.data(), &decided, 1);
    d.chunk_grad_sum = o.chunk_grad_sums_.data();
    o.commit_and_update(d);  // waits: the sums are done
    decided.sumsq = counted_sum(o.chunk_grad_sums_.data());
    sum_norm(decided.sumsq);
    rule.decide(decided);
    return decided;
  }

  /// The step decided where the gradients are (a device's memory, or one rank's whole state): the
  /// overflow flag and norm stay there, agreed across ranks, and the update runs behind them.
  step_decision decide_and_update_on_backend(step_data<Precision>& d, const step_rule& rule) {
    Opt& o = self();
    step_decision decided;
    o.backend_.gradient_norm(d, o.chunk_grad_sums_.data());
    for (const auto& [c0, c1] : o.uncounted_) o.backend_.zero(o.chunk_grad_sums_.data() + c0, c1 - c0);  // counted once
    o.backend_.step_sums(o.chunk_grad_sums_.data(), o.chunk_nonfinite_.data(), o.work_.size(), o.decision_sums_.data());
    agree_on_backend();
    o.backend_.decide_step(rule, o.decision_sums_.data(), o.decision_.data());
    if (o.layout_->sharded() || o.guard_.on()) {
      // A sharded update has collectives (the norms of a reducing rule, the parameters' way back),
      // which may fail once the moments changed, and the spike guard judges on the host: the host
      // learns the decision first (the one copy a step makes, which the status needs anyway).
      wait_for_collectives(o.comm_);
      o.backend_.to_host(&decided, o.decision_.data(), 1);
      if (applies(decided)) o.commit_and_update(d);
    } else {
      // The update runs behind the decision (a skipped step's passes change nothing), with the
      // coefficients of the groups' next step; the host reads the decision once, after it, and
      // only then do the counters advance.
      o.update(d, o.counts_.applied + 1, 1);
      wait_for_collectives(o.comm_);
      o.backend_.to_host(&decided, o.decision_.data(), 1);  // waits: the parameters are updated on return
      if (!decided.skip) {
        for (auto& g : o.groups_) ++g->step_;
        o.count_applied();
      }
    }
    return decided;
  }

  /// Every rank must hold the same policies, options (the optimizer's, the scaler's, each group's,
  /// the communicator's) and tensors; otherwise every rank throws, naming what differs on which
  /// ranks, before any gradient moves. What decides the number of settings is compared first.
  MPOPT_COLD void check_same_settings() {
    Opt& o = self();
    const std::string policies = policies_text(
        {Precision::name, LossScaler::name, Partition::name, UpdateRule::name, Backend::name, Communicator::name},
        type_name<typename Opt::accumulate_type>, type_name<typename Opt::communicate_type>);
    require_same_settings(o.comm_, settings_shape(policies, o.groups_.size()), same_settings_advice);

    std::optional<bool> deterministic;
    if constexpr (requires { o.comm_.inner().options().deterministic; })
      deterministic = o.comm_.inner().options().deterministic;
    std::vector<setting> all =
        pipeline_settings(o.options_, rounding_of_t<Precision>::name, LossScaler::name,
                          field_refs(o.scaler_.config()), field_refs(o.scaler_.save()), Communicator::name, deterministic);
    for (std::size_t gi = 0; gi < o.groups_.size(); ++gi) {
      const auto& g = o.groups_[gi];
      // An expert group's communicator; its tensors' names differ between sets of experts
      // (expert_placement.hpp checks them).
      const std::size_t replicas = g->expert_parallel() ? std::size_t(o.group_comms_[gi]->size()) : 0;
      tensors_summary tensors(g->label_, replicas);
      for (const auto& e : g->entries_) tensors.add(e.name, e.size, e.shape);
      add_group_settings(all, g->label_, field_refs(g->options_), tensors);
    }
    require_same_settings(o.comm_, std::span<const setting>(all), same_settings_advice);
  }

 private:
  Opt& self() { return static_cast<Opt&>(*this); }
  const Opt& self() const { return static_cast<const Opt&>(*this); }
};

}  // namespace mpopt::detail
