// mpopt — the default driver of a rule (rule_driver.hpp): the rule's stages as passes over the
// step's elements. A rule without a per-tensor reduction is one fused pass after the gradient
// pre-pass; a reducing rule (rule.hpp) is split at its reduction: `direction` feeds per-chunk sums
// of squares, the per-tensor sums are combined across ranks as the partition says, each tensor's
// scale follows from them, then `update` runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>  // the checkpoint hooks' types, defined where checkpoints are

#include "../../memory_report.hpp"
#include "../../options.hpp"
#include "../../rule.hpp"
#include "../../status.hpp"
#include "../comm/metered.hpp"
#include "../passes/passes.hpp"
#include "../passes/work_list.hpp"

namespace mpopt::detail {

class state_reader;

template <class Rule, class Precision, class Backend, class Communicator>
class staged_driver {
  static constexpr bool reducing = reducing_rule<Rule>;
  template <class T>
  using buffer = typename Backend::template buffer<T>;
  template <class T>
  using shared = typename Backend::template shared_vector<T>;

 public:
  /// The backend decides each step where it can: nothing here reads the device mid-step.
  static constexpr bool host_decides = false;
  /// begin() sums the gradient's squares where the step data asks (step_data::chunk_grad_sum).
  static constexpr bool sums_gradient = true;
  static void preflight(metered<Communicator>&) {}
  template <class Groups>
  static void check_groups(const Groups&) {}

  /// A reducing rule's per-tensor sums, scales and kept values, and on the backend the segments
  /// that turn per-chunk partials into per-tensor sums (norm_segments, work_list.hpp).
  template <class Context>
  void allocate(Context& c) {
    if constexpr (reducing) {
      const std::size_t tensors = c.tensors.tensor_count;
      tensor_state_.assign(tensors, 1.0);
      tensor_sums_.assign(2 * tensors, 0.0);
      tensor_scale_.assign(tensors, 0.0f);
      const norm_segments segments(*c.tensors.work, tensors);
      auto publish = [&](const std::vector<std::size_t>& offsets, buffer<std::size_t>& to) {
        to = buffer<std::size_t>(offsets.size());
        c.backend.to_device(to.data(), offsets.data(), offsets.size());
      };
      publish(segments.first, norm_segments_);
      publish(segments.second, run_segments_);
      run_sums_ = buffer<double>(segments.second.empty() ? 0 : 2 * segments.runs);
    }
  }
  template <class Context>
  void started(Context&) {}
  template <class Groups>
  static bool local_gradients(const Groups&) {
    return false;
  }
  template <class Groups>
  static bool replicas_differ(const Groups&) {
    return false;
  }

  /// The update's first pass: the whole update, or the direction before the reduction.
  template <class Context>
  void begin(Context& c) {
    if constexpr (!reducing) {
      c.backend.template rule_stage<Rule, update_stage>(c.gradients, c.scalars, nullptr, true);
    } else if (scales_in_begin<Context>()) {
      c.backend.template rule_stage_scales<Rule, direction_stage>(c.gradients, c.scalars, norm_segments_.data(),
                                                                  tensor_sums_.data(), tensor_state_.data(),
                                                                  tensor_scale_.data());
    } else {
      c.backend.template rule_stage<Rule, direction_stage>(c.gradients, c.scalars, nullptr, true);
    }
  }

  /// A reducing rule: the per-tensor norms (a tensor can straddle shards, so the partial sums are
  /// combined across ranks), the tensors' scales and the update pass. Unsharded, all of it stays on
  /// the backend: the host reads what the rule keeps after the step (tensor_state()).
  template <class Context>
  void finish(Context& c) {
    if constexpr (reducing) {
      if (scales_in_begin<Context>())
        return c.backend.template rule_stage<Rule, update_stage>(c.gradients, c.scalars, tensor_scale_.data());
      const std::size_t tensors = c.gradients.tensor_count;
      if (run_segments_.size() == 0) {
        c.backend.segmented_sum(c.gradients.chunk_sum, norm_segments_.data(), 2 * tensors, tensor_sums_.data());
      } else {  // per (tensor, owner) run, then the runs of each tensor in rank order
        c.backend.segmented_sum(c.gradients.chunk_sum, norm_segments_.data(), run_sums_.size(), run_sums_.data());
        c.backend.segmented_sum(run_sums_.data(), run_segments_.data(), 2 * tensors, tensor_sums_.data());
      }
      c.sum_partials(std::span<double>(tensor_sums_));
      c.backend.template tensor_scales<Rule>(c.gradients, c.scalars, tensor_sums_.data(), tensor_state_.data(),
                                             tensor_scale_.data());
      c.backend.template rule_stage<Rule, update_stage>(c.gradients, c.scalars, tensor_scale_.data());
    }
  }

  void report(step_status&) const {}

  /// Whether the direction stage's per-chunk partials make each tensor's sums alone (no runs of
  /// several owners to add in rank order, no ranks' shares): then the sums and scales follow the
  /// stage in its own kernel (backend_passes::rule_stage_scales).
  template <class Context>
  bool scales_in_begin() const {
    return !Context::partials_across_ranks && run_segments_.size() == 0;
  }

  /// What a reducing rule keeps per tensor (Rule::tensor_state) from the last applied step.
  std::span<const double> tensor_state() const
    requires reducing
  {
    return tensor_state_;
  }

  // Checkpoints (checkpoint.hpp): per-tensor values by name; nothing else.

  template <class Self, class F>
  static void for_each_kept(Self& self, F&& f) {
    if constexpr (reducing) f(std::string(Rule::tensor_state), self.tensor_state_.data());
  }
  struct saved {};
  saved check_saved(const nlohmann::json&, const state_reader&, const std::string&, const load_options&, std::uint64_t,
                    int, std::span<const std::size_t>) const {
    return {};
  }
  template <class F>
  void for_each_extra(int, F&&) const {}
  template <class Comm, class Write>
  void save_extra(Comm&, Backend&, Write&&) const {}
  template <class Comm, class Read>
  void restore(const saved&, Comm&, Read&&) {}

  /// Lists no buffer of its own; returns its bookkeeping bytes.
  std::size_t list_memory(memory_report&) const {
    return (norm_segments_.size() + run_segments_.size()) * sizeof(std::size_t) + run_sums_.size() * sizeof(double) +
           (tensor_sums_.capacity() + tensor_state_.capacity()) * sizeof(double) + tensor_scale_.capacity() * sizeof(float);
  }

 protected:
  shared<double> tensor_sums_;   ///< per tensor: squared norm 0, then norm 1
  shared<double> tensor_state_;  ///< what the rule keeps per tensor
  shared<float> tensor_scale_;   ///< the update's per-tensor factor
  buffer<std::size_t> norm_segments_, run_segments_;
  buffer<double> run_sums_;
};

}  // namespace mpopt::detail
