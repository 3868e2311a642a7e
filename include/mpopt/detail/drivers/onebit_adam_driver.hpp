// mpopt — 1-bit Adam's driver (onebit_adam.hpp; what the compressing rules share:
// compressing_driver.hpp). Warm-up steps are the rule's one fused pass. In the compression stage a
// first pass adds each rank's new momentum beta1 m + (1 - beta1) g (g its local gradient) into the
// worker error, the compressed all-reduce averages it, and a second pass stores the average as
// the momentum and applies it with the frozen variance.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compressing_driver.hpp"
#include "../passes/onebit_passes.hpp"
#include "../passes/work_list.hpp"

namespace mpopt::detail {

template <class Rule, class Precision, class Partition, class Backend, class Communicator>
class onebit_adam_driver : public compressing_driver<Rule, Precision, Partition, Backend, Communicator> {
  using base = compressing_driver<Rule, Precision, Partition, Backend, Communicator>;
  using staged = staged_driver<Rule, Precision, Backend, Communicator>;

 public:
  /// Warm-up (steps 1..freeze_step): the rule's update. Compression: the local momentum goes into
  /// the worker error and is compressed (the commit point: the error changed); the exchange and
  /// the update follow in finish().
  template <class Context>
  void begin(Context& c) {
    const std::uint64_t t = c.groups.front()->step();
    if (t <= c.groups.front()->options().freeze_step) return staged::begin(c);
    this->prepare_keep(c, c.gradients.state[1]);
    if (this->compression_step_ == 0) this->compression_step_ = t;
    if (this->world_ == 1) return apply(c, nullptr);  // nothing to average: the momentum stays exact
    c.backend.tensor_pass(c.gradients, [&](const auto& placed, const chunk* chunks) {
      return onebit_feed_pass<Precision>{{{{{placed, chunks, {.sum64 = this->fed_sums()}}, c.scalars}, this->place()}, nullptr},
                                         this->exchange_.worker_error().data()};
    });
    this->compress_fed(c);
  }

  template <class Context>
  void finish(Context& c) {
    if (!this->exchanging()) return;
    const sign_code averaged = this->exchanged(c);
    apply(c, &averaged);
  }

 private:
  /// The averaged momentum (null with one rank: from the gradient) into m, and the update.
  template <class Context>
  void apply(Context& c, const sign_code* averaged) {
    c.backend.tensor_pass(c.gradients, [&](const auto& placed, const chunk* chunks) {
      return onebit_adam_pass<Precision>{{{{placed, chunks, {}}, c.scalars}, this->place()},
                                         averaged ? *averaged : sign_code{}};
    });
  }
};

}  // namespace mpopt::detail
