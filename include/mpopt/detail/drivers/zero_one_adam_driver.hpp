// mpopt — 0/1 Adam's driver (zero_one_adam.hpp, which also holds the schedule; what the
// compressing rules share: compressing_driver.hpp). Phase 1: a variance step is the rule's fused
// pass on averaged gradients; any other step feeds the local gradient into the compressed
// all-reduce, and the average moves the momentum. After the last phase-1 step the error buffers
// are zeroed (they held gradient errors; from now on they hold the accumulator's). Phase 2: a local
// step on the rank's own gradient; a sync step also sends the accumulator through the compressed
// all-reduce and rebuilds parameters and momentum from the average.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "compressing_driver.hpp"
#include "../passes/onebit_passes.hpp"
#include "../passes/square_sum.hpp"
#include "../passes/work_list.hpp"

namespace mpopt::detail {

template <class Rule, class Precision, class Partition, class Backend, class Communicator>
class zero_one_adam_driver : public compressing_driver<Rule, Precision, Partition, Backend, Communicator> {
  using base = compressing_driver<Rule, Precision, Partition, Backend, Communicator>;
  using staged = staged_driver<Rule, Precision, Backend, Communicator>;
  template <class T>
  using shared = typename Backend::template shared_vector<T>;

 public:
  /// One schedule for every group: the steps that average gradients are the whole model's.
  template <class Groups>
  static void check_groups(const Groups& groups) {
    base::refuse_experts(groups);
    const auto& first = groups.front()->options();
    for (std::size_t g = 1; g < groups.size(); ++g) {
      const auto& o = groups[g]->options();
      if (o.var_freeze_step != first.var_freeze_step || o.var_update_scaler != first.var_update_scaler ||
          o.local_step_scaler != first.local_step_scaler || o.local_step_clipper != first.local_step_clipper)
        fail("group ", g, "'s schedule (var_freeze_step, var_update_scaler, local_step_scaler, local_step_clipper) "
             "differs from group 0's: the ranks average gradients or synchronise on the same steps for every group");
    }
  }

  template <class Groups>
  static bool local_gradients(const Groups& groups) {
    return Rule::local_gradients(groups.front()->options(), groups.front()->step() + 1);
  }
  /// Phase 2 steps each rank on its own gradients, and a sync lands each on its own rounding of the
  /// same point: from then on every rank's copy is its own.
  template <class Groups>
  static bool replicas_differ(const Groups& groups) {
    return groups.front()->step() > groups.front()->options().var_freeze_step;
  }

  template <class Context>
  void allocate(Context& c) {
    base::allocate(c);
    lr_sum_.assign(c.tensors.tensor_count, 0.0);
    lr_sum_float_.assign(c.tensors.tensor_count, 0.0f);
  }

  /// The step's first pass (the commit point: after it the momentum, accumulator or errors changed);
  /// an exchange and the pass that reads it follow in finish().
  template <class Context>
  void begin(Context& c) {
    const auto& o = c.groups.front()->options();
    const std::uint64_t t = c.groups.front()->step();
    const bool several = this->world_ > 1;
    const auto& d = c.gradients;
    if (t <= o.var_freeze_step && Rule::variance_step(o, t)) {
      this->variance_changed();
      return staged::begin(c);
    }
    this->prepare_keep(c, d.state[1]);
    if (t <= o.var_freeze_step) {
      if (this->compression_step_ == 0) this->compression_step_ = t;
      if (!several) return averaged_gradient(c, nullptr);  // one rank: the gradient is the average
      c.backend.tensor_pass(d, [&](const auto& placed, const chunk* chunks) {
        return gradient_feed_pass<Precision>{{{{placed, chunks, {.sum64 = this->fed_sums()}}, c.scalars}, this->place()},
                                             this->exchange_.worker_error().data()};
      });
      syncing_ = false;
      return this->compress_fed(c);
    }
    if (this->compression_step_ == 0) this->compression_step_ = t;
    for (std::size_t k = 0; k < d.tensor_count; ++k) lr_sum_[k] += c.scalars[d.tensors[k].group].step_size;
    const bool sync = Rule::sync_step(o, t);
    if (sync)  // the momentum is the accumulator over these; the sum restarts
      for (std::size_t k = 0; k < d.tensor_count; ++k) lr_sum_float_[k] = float(std::exchange(lr_sum_[k], 0.0));
    c.backend.tensor_pass(d, [&](const auto& placed, const chunk* chunks) {
      return local_step_pass<Precision>{{{{placed, chunks, {.sum64 = this->fed_sums()}}, c.scalars}, this->place()},
                                        sync,
                                        sync && several ? this->exchange_.worker_error().data() : nullptr};
    });
    if (!sync) return;
    if (!several) return synchronize(c, nullptr);
    syncing_ = true;
    this->compress_fed(c);
  }

  /// After the last phase-1 step the error buffers restart at zero, as DeepSpeed's do: they held
  /// the gradients' errors, phase 2 compresses the accumulator.
  template <class Context>
  void finish(Context& c) {
    if (this->exchanging()) {
      const sign_code averaged = this->exchanged(c);
      if (syncing_) synchronize(c, &averaged);
      else averaged_gradient(c, &averaged);
    }
    if (this->world_ > 1 && c.groups.front()->step() == c.groups.front()->options().var_freeze_step)
      this->exchange_.zero_errors(c.backend);
  }

  // Checkpoints: besides the compression record, each tensor's learning rates summed since the
  // last sync.

  template <class Self, class F>
  static void for_each_kept(Self& self, F&& f) {
    staged::for_each_kept(self, f);
    f(std::string("lr_sum"), self.lr_sum_.data());
  }

  std::size_t list_memory(memory_report& r) const {
    return base::list_memory(r) + lr_sum_.capacity() * sizeof(double) +
           lr_sum_float_.capacity() * sizeof(float);
  }

 private:
  template <class Context>
  void averaged_gradient(Context& c, const sign_code* averaged) {
    c.backend.tensor_pass(c.gradients, [&](const auto& placed, const chunk* chunks) {
      return averaged_gradient_pass<Precision>{{{{placed, chunks, {}}, c.scalars}, this->place()},
                                               averaged ? *averaged : sign_code{}};
    });
  }

  template <class Context>
  void synchronize(Context& c, const sign_code* averaged) {
    c.backend.tensor_pass(c.gradients, [&](const auto& placed, const chunk* chunks) {
      return sync_pass<Precision>{{{{placed, chunks, {}}, c.scalars}, this->place()}, averaged ? *averaged : sign_code{},
                                  lr_sum_float_.data()};
    });
  }

  std::vector<double> lr_sum_;   ///< per tensor: learning rates summed since the last sync
  shared<float> lr_sum_float_;   ///< per tensor: the sums a sync step divides by
  bool syncing_ = false;        ///< the exchange in flight averages phase 2's drift, not phase 1's gradient
};

}  // namespace mpopt::detail
