// mpopt — what the drivers of the compressing rules share (1-bit LAMB, 1-bit Adam, 0/1 Adam; the
// vocabulary: rule_driver.hpp): warm-up on gradients averaged at full precision until freeze_step,
// then the gradients stay on their rank and each rank's momentum (or what the rule averages) goes
// through the error-compensated 1-bit all-reduce (compressed_allreduce.hpp) over every tensor back
// to back: a pass feeds the worker error, compress_fed() commits the step, and exchanged() returns
// the average in finish(). This keeps that exchange (one scale over every tensor, or each tensor
// with scales of its own: compression_options), where it holds each tensor, the bits of the averages
// a step keeps (exp_avg_mask, and the elements of zero variance), the step compression began, and
// the exchange's checkpoint record: its error buffers, saved per rank, so that a resume at the same
// world size continues the error feedback exactly.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../backend.hpp"
#include "../../compressed_allreduce.hpp"
#include "../../error.hpp"
#include "../../memory_report.hpp"
#include "../../options.hpp"
#include "../../status.hpp"
#include "../checkpoint/json_fields.hpp"
#include "kept_averages.hpp"
#include "../comm/metered.hpp"
#include "../passes/onebit_passes.hpp"
#include "../passes/square_sum.hpp"
#include "staged_driver.hpp"
#include "../checkpoint/state_file.hpp"

namespace mpopt::detail {

template <class Rule, class Precision, class Partition, class Backend, class Communicator>
class compressing_driver : public staged_driver<Rule, Precision, Backend, Communicator> {
  using base = staged_driver<Rule, Precision, Backend, Communicator>;
  static_assert(!Partition::layout::sharded,
                "a compressing rule keeps the whole momentum on every rank (its compressed all-reduce averages it): "
                "use mpopt::replicated");
  static_assert(stored_in_fp32<Precision>,
                "a compressing rule's passes read and write its state and master in fp32: use it with "
                "mpopt::fp32_state and mpopt::fp32_master (with_state's defaults)");
  static_assert(compression_passes<Backend, Precision>,
                "a compressing rule runs passes of its own and the 1-bit passes on its backend (compression_passes, "
                "backend.hpp): derive the backend from detail::backend_passes, which has them");

 public:
  /// The compression stage reads the device mid-step (the exchange's scales): the host decides.
  static constexpr bool host_decides = true;
  /// Past warm-up the first pass feeds the compression, not the status's gradient norm.
  static constexpr bool sums_gradient = false;

  /// Before anything else, the communicator must deliver what the compressed all-reduce needs.
  static void preflight(metered<Communicator>& comm) {
    compressed_allreduce<Backend>::preflight(comm, Rule::title);
    comm.take_bytes();
  }

  /// The compression stage starts for every group at once.
  template <class Groups>
  static void check_groups(const Groups& groups) {
    refuse_experts(groups);
    const auto freeze = groups.front()->options().freeze_step;
    for (std::size_t g = 0; g < groups.size(); ++g)
      if (groups[g]->options().freeze_step != freeze)
        fail("group ", g, ".freeze_step (", groups[g]->options().freeze_step, ") differs from group 0's (", freeze,
             "): the compression stage starts for every group at once");
    check_compression(groups);
  }

  template <class Context>
  void allocate(Context& c) {
    base::allocate(c);
    const auto& d = c.tensors;
    elements_ = d.tensors[d.tensor_count - 1].first + d.tensors[d.tensor_count - 1].size;  // every tensor, back to back
    world_ = c.comm.size();
    rank_ = c.comm.rank();
    for (std::size_t k = 0; k < d.tensor_count; ++k) sizes_.push_back(d.tensors[k].size);
    fed_sums_.assign(d.work->size(), 0.0);
    lay_out(c.groups.front()->options().compression.scale);
    if (c.groups.front()->options().compression.exclude_zero_variance) kept_.allocate(keep_size(), sizes_.size());
  }

  /// A preflight at the real size: one exchange of zeros leaves the errors at zero.
  template <class Context>
  void started(Context& c) {
    if (world_ == 1) return;
    try {
      exchange_.exchange(c.comm, c.backend, segment_sums_);
    } catch (const error& e) {
      new_exchange();
      fail(Rule::title, " preflight: a compressed all-reduce of ", elements_, " elements failed: ", e.what());
    }
  }

  /// exp_avg_mask (optimizer::set_exp_avg_mask): tensor `tensor`'s averages are kept where
  /// `mask` is 1 (checked: 0 or 1, one per element, the same on every rank).
  void set_exp_avg_mask(std::size_t tensor, std::span<const float> mask) {
    kept_.set_mask(tensor, mask, sizes_, keep_size());
  }

  /// The compression stage: the step being taken comes after freeze_step.
  template <class Groups>
  static bool local_gradients(const Groups& groups) {
    return groups.front()->step() >= groups.front()->options().freeze_step;
  }

  void report(step_status& st) const { st.compression_step = compression_step_; }

  /// With more than one rank: the compressed all-reduce, with this rank's error buffers.
  const compressed_allreduce<Backend>& compression() const { return exchange_; }

  // Checkpoints: whether and when compression began, and once it has on several ranks, the ranks'
  // error-feedback buffers.

  nlohmann::json describe(int world) const {
    return {{"compression",
             {{"compression_step", compression_step_}, {"world_size", world}, {"errors_saved", saves_errors(world)},
              {"scale", compression_scale_name(scale_)}}}};
  }

  struct saved {
    std::uint64_t compression_step = 0;
    int errors_world = 0;  ///< ranks whose error buffers the file holds and this load reads (0: none)
    compression_scale scale = compression_scale::per_tensor;  ///< the layout of its errors
  };

  /// The file's compression record, checked against `world` ranks (the optimizer's) and tensors of
  /// these sizes.
  saved check_saved(const nlohmann::json& meta, const state_reader& r, const std::string& where, const load_options& lo,
                    std::uint64_t applied, int world, std::span<const std::size_t> sizes) const {
    saved h;
    const auto& c = json_field(meta, "compression");
    h.compression_step = json_count(c, "compression_step", applied, "compression.compression_step (at most applied_steps)");
    const int saved_world = int(json_integer(c, "world_size", 1, INT_MAX, "compression.world_size"));
    h.errors_world = json_flag(c, "errors_saved", "compression.errors_saved") ? saved_world : 0;
    const nlohmann::json& scale = json_field(c, "scale", "compression.scale");
    h.scale = choice_of<compression_scale>(scale.is_string() ? scale.get<std::string>() : scale.dump(), "compression.scale");
    if (h.errors_world > 1 && h.errors_world != world && world > 1 && !lo.reset_compression_errors)
      fail(where, "saved by ", h.errors_world, " ranks in ", Rule::title, "'s compression stage, whose error-feedback "
           "buffers belong to those ranks: load it on ", h.errors_world, " ranks to resume exactly, or pass "
           "load_options{.reset_compression_errors = true} to continue on ", world, " with zero errors");
    if (h.errors_world != world) h.errors_world = 0;  // not loaded
    std::size_t elements = 0;
    for (const std::size_t n : sizes) elements += n;
    const std::size_t padded = h.scale == compression_scale::per_tensor
                                   ? compressed_allreduce<Backend>::padded_for(sizes, world)
                                   : compressed_allreduce<Backend>::padded_for(elements, world);
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
    compression_step_ = h.compression_step;
    exchanging_ = false;
    if (h.scale != scale_) lay_out(h.scale);  // the file's options win
    kept_.changed();  // the loaded variance
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
    std::size_t bookkeeping = base::list_memory(r) + (fed_sums_.capacity() + segment_sums_.capacity()) * sizeof(double) +
                              places_.capacity() * sizeof(std::uint64_t) + sizes_.capacity() * sizeof(std::size_t);
    bookkeeping += kept_.list_memory(r);
    if (world_ > 1) {
      const auto use = exchange_.memory_use();
      r.buffers.push_back({"worker error", "compression error fed back into this rank's momentum (fp32, padded to 8 W)",
                           use.worker_error, true});
      r.buffers.push_back({"server error", "compression error of the chunk this rank averages (fp32)", use.server_error, true});
      r.buffers.push_back({"sign bits", "the momentum's signs: sent, received, averaged (1 bit each)", use.sign_bits, true});
      bookkeeping += use.bookkeeping;
    }
    return bookkeeping;
  }

 protected:
  /// Per work chunk: where a pass that feeds the worker error sums the squares it fed (sum64).
  double* fed_sums() { return fed_sums_.data(); }

  /// Where the passes find each tensor in the compressed vector, and the averages they keep
  /// (prepare_keep() first, in each compression-stage step).
  compressed_place place() const { return {places_.data(), kept_.bits()}; }

  /// Before a step's passes read place(): the averages kept, made again where the mask, the options
  /// or the variance (`variance`: the rule's state buffer) changed since.
  template <class Context>
  void prepare_keep(Context& c, const float* variance) {
    check_compression(c.groups);
    const auto& o = c.groups.front()->options().compression;
    if (o.scale != scale_)
      fail(Rule::title, ": compression.scale is ", compression_scale_name(o.scale), " now and was ",
           compression_scale_name(scale_), " when the state was made (finalize()), which laid the compressed vector "
           "out for it: choose it before");
    kept_.prepare(c, variance, o, places_.data(), sizes_, keep_size());
  }
  /// The variance changed (0/1 Adam's variance steps): the next prepare_keep() reads it again.
  void variance_changed() { kept_.changed(); }

  /// After such a pass: the worker's scales from those sums, in order, and its signs (the commit
  /// point: the error changed); exchanged() runs the rest of the all-reduce.
  template <class Context>
  void compress_fed(Context& c) {
    c.wait();
    const auto& w = *c.gradients.work;
    if (segmented())
      for (std::size_t k = 0; k < segment_sums_.size(); ++k)
        segment_sums_[k] = sum_in_order(fed_sums_.data(), w.first_chunk(k), w.first_chunk(k + 1));
    else
      segment_sums_[0] = sum_in_order(fed_sums_.data(), 0, fed_sums_.size());
    exchange_.compress_worker(c.backend, segment_sums_);
    exchanging_ = true;
  }
  /// Whether the committed step compressed and finish() has the exchange left.
  bool exchanging() const { return exchanging_; }
  /// The rest of the compressed all-reduce: every rank's average (element i ± its chunk's scale).
  template <class Context>
  sign_code exchanged(Context& c) {
    exchange_.finish(c.comm, c.backend);
    exchanging_ = false;
    return exchange_.result();
  }

  template <class Groups>
  static void refuse_experts(const Groups& groups) {
    for (std::size_t g = 0; g < groups.size(); ++g)
      if (groups[g]->expert_parallel())
        fail("group ", g, " is an expert group: ", Rule::title, " compresses over every rank, so it has no expert "
             "groups (neither has DeepSpeed's); use lamb or adam");
  }
  /// On several ranks, once compression has begun, the error buffers go into checkpoints.
  bool saves_errors(int world) const { return world > 1 && compression_step_ > 0; }
  /// The file's name of rank k's worker error, or (k = -1) of the server errors of all ranks.
  static std::string error_key(int k) {
    return k < 0 ? "compression/server_error" : "compression/worker_error/" + std::to_string(k);
  }

  compressed_allreduce<Backend> exchange_;  ///< more than one rank only
  std::size_t elements_ = 0;
  int world_ = 1;
  std::uint64_t compression_step_ = 0;  ///< the first step that compressed (0: still warming up)

 private:
  template <class T>
  using shared = typename Backend::template shared_vector<T>;

  /// Every group's compression options are group 0's: one compressed vector holds them all.
  template <class Groups>
  static void check_compression(const Groups& groups) {
    for (std::size_t g = 1; g < groups.size(); ++g)
      if (!(groups[g]->options().compression == groups.front()->options().compression))
        fail("group ", g, ".compression differs from group 0's: one compressed all-reduce holds every group");
  }

  /// With several ranks, tensors have scales of their own (compression_scale::per_tensor).
  bool segmented() const { return world_ > 1 && scale_ == compression_scale::per_tensor; }
  void new_exchange() {
    if (world_ == 1) return;
    if (segmented()) exchange_ = compressed_allreduce<Backend>(std::span<const std::size_t>(sizes_), world_, rank_);
    else exchange_ = compressed_allreduce<Backend>(elements_, world_, rank_);
  }
  /// The compressed vector for `scale`: the exchange (errors zero), each tensor's place, and the
  /// kept-average bits to be made again.
  MPOPT_COLD void lay_out(compression_scale scale) {
    scale_ = scale;
    new_exchange();
    places_.assign(sizes_.size(), 0);
    for (std::size_t k = 0, first = 0; k < sizes_.size(); first += sizes_[k++])
      places_[k] = segmented() ? exchange_.segment_start(k) : first;
    segment_sums_.assign(segmented() ? sizes_.size() : 1, 0.0);
    kept_.resize(keep_size());
  }
  /// Places in the compressed vector: what the kept-average bits cover.
  std::size_t keep_size() const { return world_ > 1 ? exchange_.padded_size() : elements_; }

  int rank_ = 0;
  compression_scale scale_ = compression_scale::per_tensor;  ///< as group 0's options said at finalize
  std::vector<std::size_t> sizes_;  ///< per tensor
  shared<std::uint64_t> places_;   ///< per tensor: its element 0's place in the compressed vector
  shared<double> fed_sums_;
  std::vector<double> segment_sums_;  ///< per segment (per tensor, or one): the squares fed
  kept_averages<Backend> kept_;
  bool exchanging_ = false;
};

}  // namespace mpopt::detail
