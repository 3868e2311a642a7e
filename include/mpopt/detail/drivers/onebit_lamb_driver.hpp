// mpopt — 1-bit LAMB's driver (onebit_lamb.hpp; the vocabulary: rule_driver.hpp, what the
// compressing rules share: compressing_driver.hpp). Warm-up steps are LAMB's staged passes, and each
// keeps a running average of every tensor's coefficient; the last one freezes the variance. From
// then on each rank advances its momentum locally, feeds it into the compressed all-reduce, and the
// averaged momentum, preconditioned by the frozen variance, is applied with the frozen coefficient
// times a factor that tracks how far a fresh variance drifted from the frozen one.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compressing_driver.hpp"
#include "../checkpoint/json_fields.hpp"
#include "../passes/onebit_passes.hpp"
#include "../passes/square_sum.hpp"
#include "../passes/work_list.hpp"

namespace mpopt::detail {

template <class Rule, class Precision, class Partition, class Backend, class Communicator>
class onebit_lamb_driver : public compressing_driver<Rule, Precision, Partition, Backend, Communicator> {
  using base = compressing_driver<Rule, Precision, Partition, Backend, Communicator>;
  using staged = staged_driver<Rule, Precision, Backend, Communicator>;
  template <class T>
  using shared = typename Backend::template shared_vector<T>;

 public:
  template <class Context>
  void allocate(Context& c) {
    base::allocate(c);
    const std::size_t tensors = c.tensors.tensor_count, chunks = c.tensors.work->size();
    coeff_freeze_.assign(tensors, 0.0);
    last_factor_.assign(tensors, 1.0);
    scaling_.assign(tensors, 1.0f);
    chunk_max_.assign(chunks, 0.0f);
    ordered_ = rank_ordered_sum(*c.tensors.work);
  }

  /// Warm-up (steps 1..freeze_step): LAMB's first pass; the last one freezes the variance.
  /// Compression: the local momentum goes into the worker error and is compressed (the commit
  /// point: the error changed); the exchange and the update follow in finish().
  template <class Context>
  void begin(Context& c) {
    const auto& d = c.gradients;
    const std::uint64_t t = c.groups.front()->step(), freeze = c.groups.front()->options().freeze_step;
    if (t <= freeze) {
      staged::begin(c);
      if (t == freeze) c.backend.copy(*d.work, d.state[2], d.state[1]);
      warming_up_ = true;
      return;
    }
    this->prepare_keep(c, d.state[1]);
    if (!scaling_ready_) momentum_scaling(c, t);
    if (this->world_ == 1) return momentum_and_apply(c, nullptr);  // nothing to average: the momentum stays exact
    c.backend.tensor_pass(d, [&](const auto& placed, const chunk* chunks) {
      return onebit_feed_pass<Precision>{
          {{{{placed, chunks, {.sum64 = this->fed_sums()}}, c.scalars}, this->place()}, scaling_.data()},
          this->exchange_.worker_error().data()};
    });
    this->compress_fed(c);
  }

  template <class Context>
  void finish(Context& c) {
    if (warming_up_) {
      staged::finish(c);
      c.wait();
      for (std::size_t t = 0; t < coeff_freeze_.size(); ++t)
        coeff_freeze_[t] = Rule::freeze_coefficient(coeff_freeze_[t], this->tensor_state_[t],
                                                    c.groups[c.gradients.tensors[t].group]->options());
      warming_up_ = false;
    } else if (this->exchanging()) {
      const sign_code averaged = this->exchanged(c);
      momentum_and_apply(c, &averaged);
    }
  }

  // Checkpoints: besides the compression record, the per-tensor values and whether the momentum
  // scaling is fixed.

  template <class Self, class F>
  static void for_each_kept(Self& self, F&& f) {
    staged::for_each_kept(self, f);
    f(std::string("lamb_coeff_freeze"), self.coeff_freeze_.data());
    f(std::string("last_factor"), self.last_factor_.data());
    f(std::string("scaling_coeff"), self.scaling_.data());
  }

  nlohmann::json describe(int world) const {
    nlohmann::json d = base::describe(world);
    d["compression"]["scaling_ready"] = scaling_ready_;
    return d;
  }

  struct saved : base::saved {
    bool scaling_ready = false;
  };

  saved check_saved(const nlohmann::json& meta, const state_reader& r, const std::string& where, const load_options& lo,
                    std::uint64_t applied, int world, std::span<const std::size_t> sizes) const {
    saved h{base::check_saved(meta, r, where, lo, applied, world, sizes)};
    h.scaling_ready = json_flag(json_field(meta, "compression"), "scaling_ready", "compression.scaling_ready");
    return h;
  }

  template <class Comm, class Read>
  void restore(const saved& h, Comm& comm, Read&& read) {
    scaling_ready_ = h.scaling_ready;
    warming_up_ = false;
    base::restore(h, comm, read);
  }

  std::size_t list_memory(memory_report& r) const {
    return base::list_memory(r) + (coeff_freeze_.capacity() + last_factor_.capacity()) * sizeof(double) +
           (scaling_.capacity() + chunk_max_.capacity()) * sizeof(float) + ordered_.bytes();
  }

 private:
  /// At the first compressed step: each tensor's momentum scale ||m|| / sqrt(n), and the
  /// coefficient that brings it to the mean scale (1 for a zero momentum; DeepSpeed divides by 0).
  template <class Context>
  void momentum_scaling(Context& c, std::uint64_t t) {
    const auto& d = c.gradients;
    c.backend.sum_squares(*d.work, d.state[0], this->fed_sums());  // free until the feed pass
    c.wait();
    auto& scale = this->tensor_sums_;  // free until the update's norms
    double mean = 0;
    for (std::size_t k = 0; k < d.tensor_count; ++k) {
      const double sumsq = sum_in_order(this->fed_sums(), d.work->first_chunk(k), d.work->first_chunk(k + 1));
      scale[k] = std::sqrt(sumsq / double(d.tensors[k].size));
      mean += scale[k] / double(d.tensor_count);
    }
    for (std::size_t k = 0; k < d.tensor_count; ++k) scaling_[k] = scale[k] > 0 ? float(mean / scale[k]) : 1.0f;
    scaling_ready_ = true;
    this->compression_step_ = t;
  }

  /// The update once the averaged momentum is known (`averaged`; null with one rank, where it comes
  /// from the gradients): momentum and fresh variance, then per tensor the factor on the frozen
  /// coefficient, then LAMB's second pass.
  template <class Context>
  void momentum_and_apply(Context& c, const sign_code* averaged) {
    const auto& d = c.gradients;
    c.backend.tensor_pass(d, [&](const auto& placed, const chunk* chunks) {
      const pass_outputs out{.sum = d.chunk_sum, .sum2 = d.chunk_sum2, .largest = chunk_max_.data()};
      return onebit_momentum_pass<Precision>{
          {{{{placed, chunks, out}, c.scalars}, this->place()}, scaling_.data(), d.state[2]},
          averaged ? *averaged : sign_code{}};
    });
    c.wait();
    const work_list& w = *d.work;
    for (std::size_t t = 0; t < d.tensor_count; ++t) {
      const std::size_t c0 = w.first_chunk(t), c1 = w.first_chunk(t + 1);
      const std::uint32_t g = d.tensors[t].group;
      const double largest = *std::max_element(chunk_max_.begin() + std::ptrdiff_t(c0), chunk_max_.begin() + std::ptrdiff_t(c1));
      // The pass summed the squares of u into chunk_sum and of u0 (without decay) into chunk_sum2.
      const double u_norm = std::sqrt(ordered_(w, d.chunk_sum, c0, c1)), u0_norm = std::sqrt(ordered_(w, d.chunk_sum2, c0, c1));
      const double factor = Rule::compression_factor(largest, u0_norm, u_norm, last_factor_[t], c.groups[g]->options());
      last_factor_[t] = factor;
      this->tensor_state_[t] = coeff_freeze_[t] * factor;
      this->tensor_scale_[t] = float(c.scalars[g].step_size * this->tensor_state_[t]);
    }
    c.backend.template rule_stage<Rule, update_stage>(d, c.scalars, this->tensor_scale_.data());
  }

  std::vector<double> coeff_freeze_;  ///< per tensor: running average of the warm-up LAMB coefficient
  std::vector<double> last_factor_;   ///< per tensor: the compression-stage factor of the last step
  shared<float> scaling_;             ///< per tensor: momentum scaling coefficient, fixed at the first compressed step
  shared<float> chunk_max_;           ///< per work chunk: the largest variance ratio
  rank_ordered_sum ordered_;
  bool scaling_ready_ = false;
  bool warming_up_ = false;  ///< the committed step is a warm-up step, whose finish() is LAMB's
};

}  // namespace mpopt::detail
