// mpopt — 1-bit LAMB's driver (onebit_lamb.hpp; the vocabulary: rule_driver.hpp). Warm-up steps are
// LAMB's staged passes, and each keeps a running average of every tensor's coefficient; the last
// one freezes the variance. From then on gradients stay on their rank: each rank advances its
// momentum locally, feeds it into the error-compensated 1-bit all-reduce (compressed_allreduce.hpp),
// and the averaged momentum, preconditioned by the frozen variance, is applied with the frozen
// coefficient times a factor that tracks how far a fresh variance drifted from the frozen one.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../compressed_allreduce.hpp"
#include "../error.hpp"
#include "../memory_report.hpp"
#include "../options.hpp"
#include "../status.hpp"
#include "json_fields.hpp"
#include "metered.hpp"
#include "onebit_passes.hpp"
#include "square_sum.hpp"
#include "staged_driver.hpp"
#include "state_file.hpp"
#include "work_list.hpp"

namespace mpopt::detail {

template <class Rule, class Precision, class Partition, class Backend, class Communicator>
class onebit_driver : public staged_driver<Rule, Precision, Backend, Communicator> {
  using base = staged_driver<Rule, Precision, Backend, Communicator>;
  static_assert(!Partition::template exchange<Precision, Backend, Communicator>::sharded,
                "mpopt::onebit_lamb keeps the whole momentum on every rank (its compressed all-reduce averages it): "
                "use mpopt::replicated");
  template <class T>
  using shared = typename Backend::template shared_vector<T>;

 public:
  /// The compression stage reads the device mid-step (the factors, the exchange): the host decides.
  static constexpr bool host_decides = true;
  /// Past warm-up its first pass feeds the compression, not the status's gradient norm.
  static constexpr bool sums_gradient = false;

  /// Before anything else, the communicator must deliver what the compressed all-reduce needs.
  static void preflight(metered<Communicator>& comm) {
    compressed_allreduce<Backend>::preflight(comm, "1-bit LAMB");
    comm.take_bytes();
  }

  /// The compression stage starts for every group at once.
  template <class Groups>
  static void check_groups(const Groups& groups) {
    const auto freeze = groups.front()->options().freeze_step;
    for (std::size_t g = 0; g < groups.size(); ++g)
      if (groups[g]->expert_parallel())
        fail("group ", g, " is an expert group: 1-bit LAMB compresses one momentum over every rank, so it has no "
             "expert groups (neither has DeepSpeed's); use lamb or adam");
      else if (groups[g]->options().freeze_step != freeze)
        fail("group ", g, ".freeze_step (", groups[g]->options().freeze_step, ") differs from group 0's (", freeze,
             "): the compression stage starts for every group at once");
  }

  template <class Context>
  void allocate(Context& c) {
    base::allocate(c);
    const std::size_t tensors = c.tensors.tensor_count, chunks = c.tensors.work->size();
    coeff_freeze_.assign(tensors, 0.0);
    last_factor_.assign(tensors, 1.0);
    scaling_.assign(tensors, 1.0f);
    const auto& last = c.tensors.tensors[tensors - 1];
    elements_ = last.first + last.size;  // every tensor, back to back
    chunk_max_.assign(chunks, 0.0f);
    chunk_sum_.assign(chunks, 0.0);
    ordered_ = rank_ordered_sum(*c.tensors.work);
    world_ = c.comm.size();
    if (world_ > 1) exchange_ = compressed_allreduce<Backend>(elements_, world_, c.comm.rank());
  }

  /// A preflight at the real size: one exchange of zeros leaves the errors at zero.
  template <class Context>
  void started(Context& c) {
    if (world_ == 1) return;
    try {
      exchange_.exchange(c.comm, c.backend, 0.0);
    } catch (const error& e) {
      exchange_ = compressed_allreduce<Backend>(elements_, world_, c.comm.rank());
      fail("1-bit LAMB preflight: a compressed all-reduce of ", elements_, " elements failed: ", e.what());
    }
  }

  /// The compression stage: the step being taken comes after freeze_step.
  template <class Groups>
  static bool local_gradients(const Groups& groups) {
    return groups.front()->step() >= groups.front()->options().freeze_step;
  }

  /// Warm-up (steps 1..freeze_step): LAMB's first pass; the last one freezes the variance.
  /// Compression: the local momentum goes into the worker error and is compressed (the commit
  /// point: the error changed); the exchange and the update follow in finish().
  template <class Context>
  void begin(Context& c) {
    const auto& d = c.gradients;
    const std::uint64_t t = c.groups.front()->step(), freeze = c.groups.front()->options().freeze_step;
    if (t <= freeze) {
      base::begin(c);
      if (t == freeze) c.backend.copy(*d.work, d.state[2], d.state[1]);
      next_ = stage::warm_up;
      return;
    }
    if (!scaling_ready_) momentum_scaling(c, t);
    if (world_ == 1) {  // nothing to average: the momentum stays exact
      momentum_and_apply(c, nullptr);
      next_ = stage::done;
      return;
    }
    c.backend.tensor_pass(d, [&](const auto& placed, const chunk* chunks) {
      return onebit_feed_pass<Precision>{
          {{{placed, chunks, {.sum64 = chunk_sum_.data()}}, c.scalars}, scaling_.data()},
          exchange_.worker_error().data()};
    });
    c.wait();
    exchange_.compress_worker(c.backend, sum_in_order(chunk_sum_.data(), 0, chunk_sum_.size()));
    next_ = stage::exchange;
  }

  template <class Context>
  void finish(Context& c) {
    if (next_ == stage::warm_up) {
      base::finish(c);
      c.wait();
      for (std::size_t t = 0; t < coeff_freeze_.size(); ++t)
        coeff_freeze_[t] = Rule::freeze_coefficient(coeff_freeze_[t], this->tensor_state_[t],
                                                    c.groups[c.gradients.tensors[t].group]->options());
    } else if (next_ == stage::exchange) {
      exchange_.finish(c.comm, c.backend);
      const sign_code averaged = exchange_.result();
      momentum_and_apply(c, &averaged);
    }
    next_ = stage::done;
  }

  void report(step_status& st) const { st.compression_step = compression_step_; }

  /// With more than one rank: the compressed all-reduce, with this rank's error buffers.
  const compressed_allreduce<Backend>& compression() const { return exchange_; }

  // Checkpoints: the per-tensor values, whether and when compression began, and once it has on
  // several ranks, their error-feedback buffers.

  template <class Self, class F>
  static void for_each_kept(Self& self, F&& f) {
    base::for_each_kept(self, f);
    f(std::string("lamb_coeff_freeze"), self.coeff_freeze_.data());
    f(std::string("last_factor"), self.last_factor_.data());
    f(std::string("scaling_coeff"), self.scaling_.data());
  }

  nlohmann::json describe(int world) const {
    return {{"compression",
             {{"scaling_ready", scaling_ready_},
              {"compression_step", compression_step_},
              {"world_size", world},
              {"errors_saved", saves_errors(world)}}}};
  }

  struct saved {
    bool scaling_ready = false;
    std::uint64_t compression_step = 0;
    int errors_world = 0;  ///< ranks whose error buffers the file holds and this load reads (0: none)
  };

  /// The file's compression record, checked against `world` ranks and `elements` parameters.
  saved check_saved(const nlohmann::json& meta, const state_reader& r, const std::string& where, const load_options& lo,
                    std::uint64_t applied, int world, std::size_t elements) const {
    saved h;
    const auto& c = json_field(meta, "compression");
    h.scaling_ready = json_flag(c, "scaling_ready", "compression.scaling_ready");
    h.compression_step = json_count(c, "compression_step", applied, "compression.compression_step (at most applied_steps)");
    const int saved_world = int(json_integer(c, "world_size", 1, INT_MAX, "compression.world_size"));
    h.errors_world = json_flag(c, "errors_saved", "compression.errors_saved") ? saved_world : 0;
    if (h.errors_world > 1 && h.errors_world != world && world > 1 && !lo.reset_compression_errors)
      fail(where, "saved by ", h.errors_world, " ranks in 1-bit LAMB's compression stage, whose error-feedback "
           "buffers belong to those ranks: load it on ", h.errors_world, " ranks to resume exactly, or pass "
           "load_options{.reset_compression_errors = true} to continue on ", world, " with zero errors");
    if (h.errors_world != world) h.errors_world = 0;  // not loaded
    // The compressed vector: every tensor, padded to a multiple of 8 W.
    const std::size_t unit = 8 * std::size_t(world), padded = (elements + unit - 1) / unit * unit;
    for (int k = -1; h.errors_world && k < world; ++k)
      if (!r.contains(error_key(k)) || r.shape(error_key(k)) != std::vector<std::int64_t>{std::int64_t(padded)})
        fail(where, "tensor '", error_key(k), "' is missing or not [", padded, "]");
    return h;
  }

  /// Calls f(key, elements) for the error tensors save() writes after the per-parameter ones.
  template <class F>
  void for_each_extra(int world, F&& f) const {
    if (!saves_errors(world)) return;
    for (int k = 0; k < world; ++k) f(error_key(k), exchange_.padded_size());
    f(error_key(-1), exchange_.padded_size());
  }

  /// Each rank's worker error in turn, then the server errors gathered: written by rank 0.
  template <class Comm, class Write>
  void save_extra(Comm& comm, Backend& backend, Write&& write) const {
    if (!saves_errors(comm.size())) return;
    const std::size_t chunk = exchange_.chunk_size();
    std::vector<float> whole(exchange_.padded_size());
    for (int k = 0; k < comm.size(); ++k) {
      if (comm.rank() == k) backend.to_host(whole.data(), exchange_.worker_error().data(), whole.size());
      comm.broadcast(std::span<float>(whole), k);
      write(std::as_bytes(std::span<const float>(whole)));
    }
    backend.to_host(whole.data() + std::size_t(comm.rank()) * chunk, exchange_.server_error().data(), chunk);
    const std::vector<std::size_t> counts(std::size_t(comm.size()), chunk);
    comm.all_gather(std::span<float>(whole), std::span<const std::size_t>(counts));
    write(std::as_bytes(std::span<const float>(whole)));
  }

  /// After the per-tensor values were read: the compression record and this rank's errors, or zero
  /// errors where the file holds none for this world size.
  template <class Comm, class Read>
  void restore(const saved& h, Comm& comm, Read&& read) {
    scaling_ready_ = h.scaling_ready;
    compression_step_ = h.compression_step;
    next_ = stage::done;
    if (comm.size() == 1) return;
    exchange_.cancel();
    if (h.errors_world == comm.size()) {
      constexpr bool device = Backend::space == memory_space::device;
      const std::size_t rank = std::size_t(comm.rank()), chunk = exchange_.chunk_size();
      read(error_key(comm.rank()), 0, exchange_.worker_error().data(), exchange_.padded_size(), device);
      read(error_key(-1), rank * chunk, exchange_.server_error().data(), chunk, device);
    } else {
      exchange_.reset_errors();  // none saved (warm-up, one rank), or reset_compression_errors
    }
  }

  std::size_t list_memory(memory_report& r) const {
    std::size_t bookkeeping = base::list_memory(r);
    if (world_ > 1) {
      const auto use = exchange_.memory_use();
      r.buffers.push_back({"worker error", "compression error fed back into this rank's momentum (fp32, padded to 8 W)",
                           use.worker_error, true});
      r.buffers.push_back({"server error", "compression error of the chunk this rank averages (fp32)", use.server_error, true});
      r.buffers.push_back({"sign bits", "the momentum's signs: sent, received, averaged (1 bit each)", use.sign_bits, true});
      bookkeeping += use.bookkeeping;
    }
    return bookkeeping + (coeff_freeze_.capacity() + last_factor_.capacity() + chunk_sum_.capacity()) * sizeof(double) +
           (scaling_.capacity() + chunk_max_.capacity()) * sizeof(float) + ordered_.bytes();
  }

 private:
  /// What finish() has left to run for the committed step.
  enum class stage : std::uint8_t { done, warm_up, exchange };

  /// At the first compressed step: each tensor's momentum scale ||m|| / sqrt(n), and the
  /// coefficient that brings it to the mean scale (1 for a zero momentum; DeepSpeed divides by 0).
  template <class Context>
  void momentum_scaling(Context& c, std::uint64_t t) {
    const auto& d = c.gradients;
    c.backend.sum_squares(*d.work, d.state[0], chunk_sum_.data());
    c.wait();
    auto& scale = this->tensor_sums_;  // free until the update's norms
    double mean = 0;
    for (std::size_t k = 0; k < d.tensor_count; ++k) {
      const double sumsq = sum_in_order(chunk_sum_.data(), d.work->first_chunk(k), d.work->first_chunk(k + 1));
      scale[k] = std::sqrt(sumsq / double(d.tensors[k].size));
      mean += scale[k] / double(d.tensor_count);
    }
    for (std::size_t k = 0; k < d.tensor_count; ++k) scaling_[k] = scale[k] > 0 ? float(mean / scale[k]) : 1.0f;
    scaling_ready_ = true;
    compression_step_ = t;
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
          {{{placed, chunks, out}, c.scalars}, scaling_.data(), d.state[2]},
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

  /// On several ranks, once compression has begun, the error buffers go into checkpoints.
  bool saves_errors(int world) const { return world > 1 && compression_step_ > 0; }
  /// The file's name of rank k's worker error, or (k = -1) of the server errors of all ranks.
  static std::string error_key(int k) {
    return k < 0 ? "compression/server_error" : "compression/worker_error/" + std::to_string(k);
  }

  std::vector<double> coeff_freeze_;  ///< per tensor: running average of the warm-up LAMB coefficient
  std::vector<double> last_factor_;   ///< per tensor: the compression-stage factor of the last step
  shared<float> scaling_;             ///< per tensor: momentum scaling coefficient, fixed at the first compressed step
  shared<float> chunk_max_;           ///< per work chunk: the largest variance ratio
  shared<double> chunk_sum_;          ///< per work chunk: sums of squares for the compression scales
  rank_ordered_sum ordered_;
  compressed_allreduce<Backend> exchange_;  ///< more than one rank only
  std::size_t elements_ = 0;
  int world_ = 1;
  bool scaling_ready_ = false;
  std::uint64_t compression_step_ = 0;  ///< the first step that compressed (0: still warming up)
  stage next_ = stage::done;
};

}  // namespace mpopt::detail
