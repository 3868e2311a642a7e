// mpopt — 1-bit Adam's driver (onebit_adam.hpp; what the compressing rules share:
// compressing_driver.hpp). Warm-up steps are the rule's one fused pass. In the compression stage a
// first pass adds each rank's new momentum beta1 m + (1 - beta1) g (g its local gradient) into the
// worker error, the compressed all-reduce averages it, and a second pass stores the average as
// the momentum and applies it with the frozen variance.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compressing_driver.hpp"
#include "onebit_passes.hpp"
#include "square_sum.hpp"
#include "work_list.hpp"

namespace mpopt::detail {

template <class Rule, class Precision, class Partition, class Backend, class Communicator>
class onebit_adam_driver : public compressing_driver<Rule, Precision, Partition, Backend, Communicator> {
  using base = compressing_driver<Rule, Precision, Partition, Backend, Communicator>;
  using staged = staged_driver<Rule, Precision, Backend, Communicator>;

 public:
  template <class Context>
  void allocate(Context& c) {
    base::allocate(c);
    chunk_sum_.assign(c.tensors.work->size(), 0.0);
  }

  /// Warm-up (steps 1..freeze_step): the rule's update. Compression: the local momentum goes into
  /// the worker error and is compressed (the commit point: the error changed); the exchange and
  /// the update follow in finish().
  template <class Context>
  void begin(Context& c) {
    const std::uint64_t t = c.groups.front()->step();
    if (t <= c.groups.front()->options().freeze_step) return staged::begin(c);
    if (this->compression_step_ == 0) this->compression_step_ = t;
    if (this->world_ == 1) return apply(c, nullptr);  // nothing to average: the momentum stays exact
    c.backend.tensor_pass(c.gradients, [&](const auto& placed, const chunk* chunks) {
      return onebit_feed_pass<Precision>{{{{placed, chunks, {.sum64 = chunk_sum_.data()}}, c.scalars}, nullptr},
                                         this->exchange_.worker_error().data()};
    });
    c.wait();
    this->exchange_.compress_worker(c.backend, sum_in_order(chunk_sum_.data(), 0, chunk_sum_.size()));
    exchanging_ = true;
  }

  template <class Context>
  void finish(Context& c) {
    if (!exchanging_) return;
    this->exchange_.finish(c.comm, c.backend);
    const sign_code averaged = this->exchange_.result();
    apply(c, &averaged);
    exchanging_ = false;
  }

  template <class Comm, class Read>
  void restore(const typename base::saved& h, Comm& comm, Read&& read) {
    exchanging_ = false;
    base::restore(h, comm, read);
  }

  std::size_t list_memory(memory_report& r) const { return base::list_memory(r) + chunk_sum_.capacity() * sizeof(double); }

 private:
  /// The averaged momentum (null with one rank: from the gradient) into m, and the update.
  template <class Context>
  void apply(Context& c, const sign_code* averaged) {
    c.backend.tensor_pass(c.gradients, [&](const auto& placed, const chunk* chunks) {
      return onebit_adam_pass<Precision>{{{placed, chunks, {}}, c.scalars}, averaged ? *averaged : sign_code{}};
    });
  }

  typename Backend::template shared_vector<double> chunk_sum_;  ///< per work chunk: sums of squares fed
  bool exchanging_ = false;  ///< begin() compressed; finish() has the exchange and the update left
};

}  // namespace mpopt::detail
