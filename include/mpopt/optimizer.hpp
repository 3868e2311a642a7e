// mpopt — the optimizer: one class template composing precision, loss scaler, partition, update
// rule, backend and communicator policies. It owns the step pipeline (DESIGN.md §2); the policies
// own their options, state and element math.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "adam.hpp"
#include "communicator.hpp"
#include "compressed_allreduce.hpp"
#include "detail/agreement.hpp"
#include "detail/checkpoint.hpp"
#include "detail/flat_layout.hpp"
#include "detail/memory_listing.hpp"
#include "detail/metered.hpp"
#include "detail/onebit_state.hpp"
#include "detail/same_settings.hpp"
#include "detail/square_sum.hpp"
#include "detail/state_file.hpp"
#include "detail/step_data.hpp"
#include "detail/tensor_registry.hpp"
#include "detail/validate.hpp"
#include "detail/work_list.hpp"
#include "host.hpp"
#include "lamb.hpp"
#include "loss_scale.hpp"
#include "memory_report.hpp"
#include "numeric.hpp"
#include "options.hpp"
#include "onebit_lamb.hpp"
#include "partition.hpp"
#include "precision.hpp"
#include "rule.hpp"
#include "status.hpp"
#include "tensor.hpp"

namespace mpopt {

namespace detail {
/// The backend can run on the communicator's stream, or the communicator has none.
template <class Backend, class C>
concept runs_on_stream_of = !stream_communicator<C> || requires(const C& c) { Backend(c.stream()); };

/// The backend of an optimizer over `comm`: on the communicator's stream when it has one, so that
/// passes and collectives run in the order the step issues them, with no wait between them.
template <class Backend, class C>
Backend backend_for(const C& comm) {
  if constexpr (stream_communicator<C>) return Backend(comm.stream());
  else return Backend();
}
}  // namespace detail

template <precision_policy Precision, loss_scaler_policy LossScaler, class Partition, class UpdateRule,
          class Backend = host, communicator Communicator = single_process>
class optimizer
    : public detail::tensor_registry<optimizer<Precision, LossScaler, Partition, UpdateRule, Backend, Communicator>,
                                     Precision, UpdateRule, Backend>,
      public detail::checkpointing<optimizer<Precision, LossScaler, Partition, UpdateRule, Backend, Communicator>,
                                   Precision, LossScaler, Partition, UpdateRule, Backend>,
      public detail::memory_listing<optimizer<Precision, LossScaler, Partition, UpdateRule, Backend, Communicator>,
                                    Precision, UpdateRule, Communicator>,
      protected detail::agreement<optimizer<Precision, LossScaler, Partition, UpdateRule, Backend, Communicator>,
                                  Precision, LossScaler, Partition, UpdateRule, Backend, Communicator> {
  // Registration, checkpoints, the memory report and agreement across ranks live in headers of their own.
  using registry = detail::tensor_registry<optimizer, Precision, UpdateRule, Backend>;
  using checkpointing = detail::checkpointing<optimizer, Precision, LossScaler, Partition, UpdateRule, Backend>;
  using memory_listing = detail::memory_listing<optimizer, Precision, UpdateRule, Communicator>;
  using agreement = detail::agreement<optimizer, Precision, LossScaler, Partition, UpdateRule, Backend, Communicator>;
  friend checkpointing;
  friend memory_listing;
  friend agreement;
  using agreement::agree;
  using agreement::check_same_settings;
  using agreement::preflight;
  using registry::groups_;
  using registry::finalized_;
  using registry::tensor_name;
  using registry::first_tensor_of;
  static_assert(scaler_serves<LossScaler, typename Precision::grad_type>,
                "this loss scaler does not serve the precision's gradients: the built-in scalers are for fp16 (use "
                "mpopt::no_scaling with mpopt::fp32 or mpopt::bf16); a scaler of yours declares serves<Grad>");
  static_assert(partition_policy<Partition, Precision, Backend, Communicator>,
                "Partition must model mpopt::partition_policy (partition.hpp): mpopt::replicated, zero1, zero2 or yours");
  static_assert(update_rule<UpdateRule>,
                "UpdateRule must model mpopt::update_rule (rule.hpp; README, \"Writing your own rule\")");
  static_assert(!std::is_same_v<UpdateRule, onebit_lamb> || std::is_same_v<Partition, replicated>,
                "mpopt::onebit_lamb keeps the whole momentum on every rank (its compressed all-reduce averages it): "
                "use mpopt::replicated");
  static_assert(detail::runs_on_stream_of<Backend, Communicator>,
                "a device communicator (mpopt::nccl) needs a backend that runs on its stream: mpopt::cuda");

 public:
  using precision = Precision;
  using partition = Partition;
  using param_type = typename Precision::param_type;
  using grad_type = typename Precision::grad_type;
  using accumulate_type = typename Precision::accumulate_type;
  using communicate_type = typename Precision::communicate_type;
  using rule = UpdateRule;
  using group_options = typename UpdateRule::options;
  using param_group = typename registry::param_group;
  using scaler_options = typename LossScaler::options;

  using options = optimizer_options;

 private:
  static constexpr bool is_onebit = std::is_same_v<UpdateRule, onebit_lamb>;
  /// Rules with a per-tensor reduction take two passes: direction, then update.
  static constexpr bool reducing = reducing_rule<UpdateRule>;
  static constexpr std::size_t state_count = UpdateRule::state.size();
  /// The partition's exchange: how gradients and parameters travel between ranks (partition.hpp).
  using exchange = typename Partition::template exchange<Precision, Backend, Communicator>;
  using exchange_context = detail::exchange_context<Precision, Backend, Communicator>;

  /// State lives where the backend computes; small arrays shared with the host's step logic are
  /// readable by both (host.hpp, cuda.hpp).
  template <class T>
  using buffer = typename Backend::template buffer<T>;
  template <class T>
  using shared = typename Backend::template shared_vector<T>;

 public:
  /// Under onebit_lamb the constructor is collective: it checks the communicator (preflight).
  explicit optimizer(options o = {}, scaler_options s = {}, Communicator comm = {})
      : backend_(detail::backend_for<Backend>(comm)),
        options_(validated(o, std::is_same_v<LossScaler, no_scaling>)),
        scaler_(s),
        comm_(std::move(comm)) {
    if constexpr (is_onebit) preflight();
  }
  /// With the communicator first: optimizer opt{mpopt::mpi{MPI_COMM_WORLD}, {.clip_grad = 1}, {...}}.
  template <class C>
    requires std::same_as<std::remove_cvref_t<C>, Communicator>
  explicit optimizer(C&& comm, options o = {}, scaler_options s = {})
      : optimizer(o, s, std::forward<C>(comm)) {}

  optimizer(const optimizer&) = delete;
  optimizer& operator=(const optimizer&) = delete;

  /// The factor the loss must be multiplied by before backward.
  double loss_scale() const { return scaler_.scale(); }
  const LossScaler& scaler() const { return scaler_; }
  const options& config() const { return options_; }
  /// The backend object: its stream and counters (cuda.hpp); empty for the host backend.
  const Backend& backend() const { return backend_; }
  Communicator& communicator() { return comm_.inner(); }
  const Communicator& communicator() const { return comm_.inner(); }

  /// Allocates the optimizer state and copies parameters into the masters. step() does this on its
  /// first call; calling it earlier fixes the parameter set and surfaces layout errors early. It is
  /// collective: every rank calls it, and all must have registered the same groups and tensors.
  void finalize() {
    if (finalized_) return;
    agree("finalize", [&] {
      if (groups_.empty()) detail::fail("no parameter groups: add a group before the first step");
      for (const auto& g : groups_)
        if (g->entries_.empty()) detail::fail(g->label_, " has no parameters");
      if constexpr (is_onebit)
        for (const auto& g : groups_)
          if (g->options_.freeze_step != groups_.front()->options_.freeze_step)
            detail::fail(g->label_, ".freeze_step (", g->options_.freeze_step, ") differs from group 0's (",
                         groups_.front()->options_.freeze_step, "): the compression stage starts for every group at once");
    });
    check_same_settings();
    std::vector<std::uint32_t> tensor_groups;
    std::vector<std::size_t> sizes;
    for (std::uint32_t gi = 0; gi < groups_.size(); ++gi)
      for (const auto& e : groups_[gi]->entries_) {
        tensor_groups.push_back(gi);
        sizes.push_back(e.size);
      }
    layout_.emplace(exchange::lay_out(tensor_groups, sizes, groups_.size(), context()));
    const detail::flat_layout& layout = *layout_;
    for (std::uint32_t gi = 0; gi < groups_.size(); ++gi)
      for (const auto& e : groups_[gi]->entries_) tensors_.push_back({e.param, e.grad, e.size, gi});
    work_ = layout.local_work();
    state_elements_ = layout.local_elements();
    if constexpr (Precision::has_master) master_ = buffer<float>(state_elements_);
    for (auto& b : state_) b = buffer<float>(state_elements_);
    chunk_sums_.assign(2 * work_.size(), 0.0f);
    chunk_nonfinite_.assign(work_.size(), 0);
    exchange_.allocate(layout, context());
    decision_ = buffer<detail::step_decision>::zeroed(1);
    decision_sums_ = buffer<double>::zeroed(2);
    owner_sum_.assign(layout.parts(), 0.0);
    coefficients_.resize(groups_.size());
    tensor_state_.assign(tensors_.size(), 1.0);
    tensor_sums_.assign(2 * tensors_.size(), 0.0);
    tensor_scale_.assign(tensors_.size(), 0.0f);
    if constexpr (reducing) {
      const detail::norm_segments segments(work_, tensors_.size());
      auto publish = [&](const std::vector<std::size_t>& offsets, buffer<std::size_t>& to) {
        to = buffer<std::size_t>(offsets.size());
        backend_.to_device(to.data(), offsets.data(), offsets.size());
      };
      publish(segments.first, norm_segments_);
      publish(segments.second, run_segments_);
      run_sums_ = buffer<double>(segments.second.empty() ? 0 : 2 * segments.runs);
    }
    if constexpr (is_onebit) onebit_.allocate(sizes, work_.size(), comm_.size(), comm_.rank());
    parameters_ = layout.parameters();
    finalized_ = true;
    backend_.initialize_state(data());
    wait();
    if constexpr (is_onebit)
      if (comm_.size() > 1) {
        // Preflight at the real size: one exchange of zeros leaves the errors at zero.
        try {
          onebit_.exchange.exchange(comm_, backend_, 0.0);
        } catch (const error& e) {
          onebit_.exchange = compressed_allreduce<Backend>(parameters_, comm_.size(), comm_.rank());
          detail::fail("1-bit LAMB preflight: a compressed all-reduce of ", parameters_, " elements failed: ", e.what());
        }
      }
    comm_.take_bytes();  // setup traffic is not a step's
  }

  /// Under zero2: tensor i's gradient for this micro-step is complete (call it during backward, as each
  /// gradient is done). Buckets are reduce-scattered as soon as they and all buckets after them are
  /// complete: last tensors first, the order of a backward pass; step() reduces what is left. Under
  /// replicated and zero1 the gradients are reduced in step(), and this only checks i.
  void grad_ready(std::size_t i) {
    finalize();
    comm_.at("grad_ready()", next_step());
    finish_step();
    tensor_at(i);
    bool first_report = true;
    abandon_window_on_error([&] {
      auto c = context();
      first_report = exchange_.grad_ready(c, i);
    });
    if (!first_report) detail::fail("grad_ready: tensor '", tensor_name(i), "' was already reported in this micro-step");
  }

  /// Under zero2: whether tensor i's gradient of this micro-step has been reduce-scattered, so that its
  /// memory may be reused until the next backward writes it. Buckets go last first, so a tensor is
  /// done once it and every later tensor sharing its buckets were reported. Replicated and zero1
  /// read every gradient in step(): always false there.
  bool grad_consumed(std::size_t i) const {
    if (!finalized_) {
      const std::size_t n = first_tensor_of(std::uint32_t(groups_.size()));
      if (i >= n) detail::fail("there are ", n, " tensors, no tensor ", i);
      return false;
    }
    tensor_at(i);
    return exchange_.grad_consumed(i);
  }

  /// One call per backward. Within an accumulation window it folds the gradients into the
  /// accumulator; at the boundary it checks, clips and applies the update. Never silent.
  step_status step() {
    finalize();
    comm_.at("step()", next_step());
    finish_step();
    step_status st;
    st.scale_before = st.scale_after = scaler_.scale();
    st.step = groups_.front()->step_;
    st.skipped_steps = skipped_;
    st.consecutive_skips = consecutive_skips_;

    // The counter advances only when the call completes: a throw below leaves the window as it was.
    if (micro_step_ + 1 < options_.accumulation_steps) {
      abandon_window_on_error([&] { accumulate(); });
      st.micro_step = ++micro_step_;
      return reported(st);
    }

    detail::step_data<Precision> d;
    abandon_window_on_error([&] { d = boundary_gradients(); });
    const double scale = scaler_.scale();
    // 1-bit LAMB's compression stage keeps gradients local: each rank's stands for the combined one
    // (times W for a sum), and its norm is the root mean square of the ranks' norms.
    const double world = comm_.size(), local = compressing() ? world : 1.0;
    const double divisor =
        (options_.combine == accumulation::mean ? double(options_.accumulation_steps) * world : 1.0) / local;
    const double unscale = 1.0 / (scale * divisor * double(send_scale()));
    d.grad_scale = float(unscale);
    const detail::step_rule rule{unscale, local, options_.clip_grad, options_.skip_nonfinite};
    detail::step_decision decided;
    if (decides_on_backend()) {
      backend_.gradient_norm(d);
      backend_.step_sums(chunk_sums_.data(), chunk_nonfinite_.data(), work_.size(), decision_sums_.data());
      agree_on_backend();
      backend_.decide_step(rule, decision_sums_.data(), decision_.data());
      if constexpr (exchange::sharded) {
        // ZeRO's update has collectives, which may fail once the moments changed: the host learns
        // the decision first (the one copy a step makes, which the status needs anyway).
        detail::wait_for_collectives(comm_);
        backend_.to_host(&decided, decision_.data(), 1);
        if (!decided.skip) commit_and_update(d);
      } else {
        // The update runs behind the decision (a skipped step's passes change nothing), with the
        // group counters advanced for its coefficients; the host reads the decision once, after it.
        for (auto& g : groups_) ++g->step_;
        update(d);
        detail::wait_for_collectives(comm_);
        backend_.to_host(&decided, decision_.data(), 1);  // waits: the parameters are updated on return
        if (decided.skip) {
          for (auto& g : groups_) --g->step_;
        } else {
          count_applied();
        }
      }
    } else {
      decided = decide_on_host(d, rule);
      if (!decided.skip) {
        backend_.to_device(decision_.data(), &decided, 1);
        commit_and_update(d);
      }
    }

    if (decided.skip) {
      st.result = decided.nonfinite > 0 ? step_result::skipped_nonfinite : step_result::skipped_norm_overflow;
      st.grad_norm = st.grad_norm_clipped = decided.norm;
      skip(scale);
      st.scale_after = scaler_.scale();
      st.skipped_steps = skipped_;
      st.consecutive_skips = consecutive_skips_;
      return reported(st);
    }
    st.result = step_result::applied;
    st.applied = true;
    st.grad_norm = decided.norm;
    st.clip_coef = decided.clip;
    st.grad_norm_clipped = decided.norm * decided.clip;
    st.scale_after = scaler_.scale();
    st.step = groups_.front()->step_;
    st.consecutive_skips = 0;
    return reported(st);
  }


  /// Finishes a step whose last collectives failed. A step is committed once its first pass has
  /// changed the moments (counters advance, the scaler updates); if a collective after that fails
  /// (LAMB's per-tensor norms, the all-gather of updated parameters), step() throws with the
  /// parameters not all updated yet. This runs what is left, on every rank; step(), grad_ready()
  /// and save() call it first. Nothing pending: it does nothing.
  void finish_step() {
    if (pending_stage_ == stage::none) return;
    try {
      if (pending_stage_ == stage::tensor_norms) {
        if constexpr (reducing) reduce_and_update();
        pending_stage_ = stage::params_back;
      }
      if (pending_stage_ == stage::params_back) {
        auto c = context();
        exchange_.params_back(c);
        pending_stage_ = stage::none;
      }
      if (pending_stage_ == stage::onebit_exchange) {
        if constexpr (is_onebit) {
          onebit_.exchange.finish(comm_, backend_);
          const detail::sign_code averaged = onebit_.exchange.result();
          onebit_momentum_and_apply(gradients_, &averaged);
        }
        pending_stage_ = stage::none;
      }
    } catch (const error& e) {
      detail::fail("step ", groups_.front()->step_, " is committed on every rank but unfinished: ", e.what(),
                   "; the parameters are not all updated yet: step(), save() or finish_step() finishes it");
    }
  }

  /// Sets every gradient to zero (for backward passes that add into their gradients).
  void zero_grad() {
    finalize();
    backend_.zero_grad(data());
    wait();  // before the next backward writes the gradients
  }

  /// What a reducing rule keeps per tensor (UpdateRule::tensor_state), from the last applied step,
  /// in registration order: LAMB's trust ratios (1-bit LAMB's compression stage: the frozen
  /// coefficient times the factor).
  std::span<const double> tensor_state() const
    requires reducing
  {
    return tensor_state_;
  }
  /// LAMB's name for tensor_state() (DeepSpeed's get_lamb_coeffs()).
  std::span<const double> lamb_coeffs() const
    requires reducing
  {
    return tensor_state_;
  }

  /// The elements of tensor i whose state this rank holds: all of them unless sharded.
  struct owned_elements {
    std::size_t first, count;
  };
  owned_elements owned(std::size_t i) const {
    tensor_at(i);
    const auto o = layout_->owned(i);
    return {o.first, o.count};
  }
  /// fp32 master weights of tensor i (in registration order), the owned elements; for fp32 the
  /// parameter itself.
  std::span<const float> master(std::size_t i) const {
    const auto& t = tensor_at(i);
    const auto o = layout_->owned(i);
    if constexpr (Precision::has_master) return {master_.data() + o.state, o.count};
    else return {t.param + o.first, o.count};
  }
  /// State buffer k of the rule (UpdateRule::state[k]: adam's 0 is exp_avg, 1 exp_avg_sq) of
  /// tensor i, the owned elements.
  std::span<const float> moment(std::size_t k, std::size_t i) const {
    tensor_at(i);
    if (k >= state_count)
      detail::fail("moment ", k, ": ", UpdateRule::name, " keeps ",
                   state_count ? "moments 0 to " + std::to_string(state_count - 1) : std::string("no moments"));
    const auto o = layout_->owned(i);
    return {state_[k].data() + o.state, o.count};
  }

  /// 1-bit LAMB with more than one rank: the compressed all-reduce, with this rank's error buffers.
  const compressed_allreduce<Backend>& compression() const
    requires is_onebit
  {
    return onebit_.exchange;
  }
  std::size_t tensor_count() const { return tensors_.size(); }


 private:
  /// The optimizer step the next boundary completes, counting applied and skipped ones from 1.
  std::uint64_t next_step() const { return applied_ + skipped_ + 1; }



  static options validated(options o, bool unscaled) {
    detail::require_non_negative("clip_grad", o.clip_grad);
    if (o.accumulation_steps < 1) detail::fail("accumulation_steps must be >= 1, got ", o.accumulation_steps);
    if (o.bucket_elements < 1 || o.bucket_elements > (std::size_t{1} << 30))
      detail::fail("bucket_elements must be in [1, 2^30], got ", o.bucket_elements);
    detail::require_float_scale("gradient_predivide", o.gradient_predivide);
    if (!o.skip_nonfinite && !unscaled)
      detail::fail("skip_nonfinite = false needs mpopt::no_scaling: a loss-scaled step must skip on overflow");
    return o;
  }

  const detail::tensor_slot<param_type, grad_type>& tensor_at(std::size_t i) const {
    if (i >= tensors_.size()) detail::fail("there are ", tensors_.size(), " tensors (after finalize), no tensor ", i);
    return tensors_[i];
  }

  /// Names the tensors whose gradients held inf or NaN on this rank.
  std::string nonfinite_report() const {
    std::string names;
    std::size_t count = 0;
    for (std::size_t t = 0; t < tensors_.size(); ++t) {
      bool bad = false;
      for (std::size_t c = work_.first_chunk(t); c < work_.first_chunk(t + 1); ++c) bad |= chunk_nonfinite_[c] != 0;
      if (!bad) continue;
      if (++count <= 8) names += (names.empty() ? "" : ", ") + ("'" + tensor_name(t) + "'");
    }
    if (count == 0) return "no local gradient is non-finite: the global norm overflowed, or another rank overflowed";
    return "non-finite gradients in " + names + (count > 8 ? " and " + std::to_string(count - 8) + " more" : "");
  }

  /// The step's tensors, state and partial sums, reading the gradients as they are.
  detail::step_data<Precision> data() {
    detail::step_data<Precision> d;
    d.tensors = tensors_.data();
    d.tensor_count = tensors_.size();
    d.work = &work_;
    d.master = master_.data();
    for (std::size_t k = 0; k < state_count; ++k) d.state[k] = state_[k].data();
    d.state_count = std::uint32_t(state_count);
    d.chunk_sum = chunk_sums_.data();
    d.chunk_sum2 = chunk_sums_.data() + work_.size();
    d.chunk_nonfinite = chunk_nonfinite_.data();
    d.decision = decision_.data();
    return d;
  }

  /// What the partition's exchange works with in this call.
  exchange_context context() { return {backend_, comm_, options_, data(), micro_step_, send_scale()}; }

  /// A micro-step inside the accumulation window: the exchange folds this backward's gradients in.
  void accumulate() {
    auto c = context();
    exchange_.micro_step(c);
  }

  /// Where the boundary step reads its gradients, as the exchange delivers them.
  detail::step_data<Precision> boundary_gradients() {
    auto c = context();
    return exchange_.boundary(c, compressing());
  }

  /// What gradients are multiplied by before they are summed across ranks.
  float send_scale() const {
    return comm_.size() > 1 && !compressing() ? float(1.0 / options_.gradient_predivide) : 1.0f;
  }

  /// 1-bit LAMB's compression stage: the step being taken comes after freeze_step.
  bool compressing() const {
    if constexpr (is_onebit) return groups_.front()->step_ >= groups_.front()->options_.freeze_step;
    else return false;
  }

  /// The status's communication fields: what this call handed the communicator.
  step_status& reported(step_status& st) {
    st.comm_bytes = comm_.take_bytes();
    st.comm_ratio = double(st.comm_bytes) / (4.0 * double(parameters_));
    if constexpr (is_onebit) st.compression_step = onebit_.compression_step;
    return st;
  }

  /// Runs f; if a collective in it fails, the window's gradients are lost on every rank (some were
  /// already combined), so the window starts over, and the error goes on.
  template <class F>
  void abandon_window_on_error(F&& f) {
    try {
      f();
    } catch (...) {
      if (!exchange_.keeps_window(comm_.size())) {
        micro_step_ = 0;
        exchange_.restart_window();
      }
      throw;
    }
  }

  /// The sum of per-chunk partials over chunks [c0, c1), formed per owner and added in rank order:
  /// exactly what a rank-ordered all-reduce of each shard's sum gives, so all partitions add alike.
  double rank_ordered_sum(const float* partial, std::size_t c0, std::size_t c1) {
    std::fill(owner_sum_.begin(), owner_sum_.end(), 0.0);
    for (std::size_t c = c0; c < c1; ++c) owner_sum_[work_[c].owner] += double(partial[c]);
    double total = 0;
    for (double x : owner_sum_) total += x;
    return total;
  }

  /// Waits for the passes and collectives issued so far.
  void wait() { detail::wait_for_all(backend_, comm_); }

  /// Whether the backend decides the step (step_decision.hpp): one rank, replicated, always; a device
  /// backend also across ranks and under ZeRO, so that the overflow flag and norm stay in device
  /// memory, except for sum_by_shard, whose norm the host adds up by would-be shard in rank order.
  /// 1-bit LAMB's step logic reads the device mid-step anyway (its frozen coefficients and
  /// compression factors): the host decides.
  bool decides_on_backend() const {
    if (is_onebit) return false;
    if (comm_.size() == 1 && !exchange::sharded) return true;
    return Backend::space == memory_space::device && (exchange::sharded || !options_.sum_by_shard);
  }

  /// Across ranks, the backend's step sums are agreed where they are: the non-finite chunks (one
  /// rank's overflow skips the step on all) and, under ZeRO, the squared norm of each shard.
  /// Replicated, every rank's norm is already that of the same all-reduced gradients.
  void agree_on_backend() {
    if (comm_.size() == 1) return;
    if constexpr (!detail::stream_communicator<Communicator>) backend_.synchronize();  // the sums are done
    double* sums = decision_sums_.data();
    if constexpr (exchange::sharded) comm_.all_reduce(std::span<double>(sums, 2), reduce_op::sum);
    else comm_.all_reduce(std::span<double>(sums + 1, 1), reduce_op::sum);
  }

  /// An applied step: counters advance now, as the first pass below changes the moments, and a
  /// collective that fails after it leaves the rest for finish_step().
  void commit_and_update(detail::step_data<Precision>& d) {
    for (auto& g : groups_) ++g->step_;
    count_applied();
    update(d);
    wait();  // the parameters are updated when step() returns
  }

  /// The element-wise overflow test and the squared global norm, agreed by every rank, and the
  /// decision they make. Every rank runs every reduction, whatever it found locally.
  detail::step_decision decide_on_host(const detail::step_data<Precision>& d, const detail::step_rule& rule) {
    backend_.gradient_norm(d);
    wait();
    std::uint8_t nonfinite = std::any_of(chunk_nonfinite_.begin(), chunk_nonfinite_.end(), [](auto b) { return b != 0; });
    double sumsq = rank_ordered_sum(chunk_sums_.data(), 0, work_.size());  // the same for any thread count
    comm_.all_reduce(std::span<std::uint8_t>(&nonfinite, 1), reduce_op::max);
    if (compressing()) {
      comm_.all_reduce(std::span<double>(&sumsq, 1), reduce_op::sum);
    } else {
      auto c = context();
      exchange_.sum_partials(c, std::span<double>(&sumsq, 1));
    }
    detail::step_decision decided;
    decided.sumsq = sumsq;
    decided.nonfinite = nonfinite;
    rule.decide(decided);
    return decided;
  }

  /// An applied step's counters (the groups' apart) and the scaler's good step.
  void count_applied() {
    scaler_.update(false);
    micro_step_ = 0;
    ++applied_;
    consecutive_skips_ = 0;
  }

  /// A skipped step: throws first if the scaler or the skip limit says the run cannot go on
  /// (changing nothing), then lets the scaler see the overflow.
  void skip(double scale) {
    // Across ranks the window's gradients are already combined in place: an error below ends the
    // window. On one rank it stays open, so a caller that catches can finish the step again.
    if (!exchange_.keeps_window(comm_.size())) micro_step_ = 0;
    if (scaler_.raises_on(true))
      detail::fail("loss scale already at its minimum (", scale, ") and the gradients still overflow; ",
                   nonfinite_report(), "; skipped ", skipped_, " of ", skipped_ + applied_,
                   " steps so far. Consider bf16, a lower learning rate, or at_min_scale::keep_skipping");
    if (options_.max_consecutive_skips && consecutive_skips_ + 1 >= options_.max_consecutive_skips)
      detail::fail(consecutive_skips_ + 1, " consecutive steps skipped (max_consecutive_skips = ",
                   options_.max_consecutive_skips, "); loss scale ", scale, "; ", nonfinite_report());
    scaler_.update(true);
    micro_step_ = 0;
    ++skipped_;
    ++consecutive_skips_;
  }

  /// The update's first pass, then what follows it (finish_step), issued to the backend (the caller
  /// waits). Coefficients are fixed here, so a step finished later is the step that was committed.
  void update(detail::step_data<Precision>& d) {
    for (std::size_t g = 0; g < groups_.size(); ++g)
      coefficients_[g] = UpdateRule::prepare(groups_[g]->options_, groups_[g]->step_);
    gradients_ = d;
    if constexpr (is_onebit) {
      onebit_update(d);
    } else if constexpr (reducing) {
      backend_.template rule_stage<UpdateRule, detail::direction_stage>(d, coefficients_.data());
      pending_stage_ = stage::tensor_norms;
    } else {
      backend_.template rule_stage<UpdateRule, detail::update_stage>(d, coefficients_.data());
      pending_stage_ = stage::params_back;
    }
    finish_step();
  }

  /// 1-bit LAMB. Warm-up (steps 1..freeze_step): LAMB's passes; the last one freezes the variance.
  /// Compression: the local momentum goes into the worker error and is compressed (the commit
  /// point: the error changed), the exchange runs in finish_step(), then the update.
  void onebit_update(const detail::step_data<Precision>& d) {
    const std::uint64_t t = groups_.front()->step_, freeze = groups_.front()->options_.freeze_step;
    if (t <= freeze) {
      backend_.template rule_stage<UpdateRule, detail::direction_stage>(d, coefficients_.data());
      if (t == freeze) backend_.copy(work_, state_[2].data(), state_[1].data());
      pending_stage_ = stage::tensor_norms;
      return;
    }
    if (!onebit_.scaling_ready) momentum_scaling(t);
    if (comm_.size() == 1) {  // nothing to average: the momentum stays exact
      onebit_momentum_and_apply(d, nullptr);
      pending_stage_ = stage::none;
      return;
    }
    backend_.onebit_feed(d, coefficients_.data(), onebit_.scaling.data(), onebit_.fused.data(),
                         onebit_.exchange.worker_error().data(), onebit_.chunk_sum.data());
    wait();
    const auto& sums = onebit_.chunk_sum;
    onebit_.exchange.compress_worker(backend_, detail::sum_in_order(sums.data(), 0, sums.size()));
    pending_stage_ = stage::onebit_exchange;
  }

  /// At the first compressed step: each tensor's momentum scale ||m|| / sqrt(n), and the
  /// coefficient that brings it to the mean scale (1 for a zero momentum; DeepSpeed divides by 0).
  void momentum_scaling(std::uint64_t t) {
    if constexpr (is_onebit) {
      backend_.sum_squares(work_, state_[0].data(), onebit_.chunk_sum.data());
      wait();
      auto& scale = tensor_sums_;  // free until the update's norms
      double mean = 0;
      for (std::size_t k = 0; k < tensors_.size(); ++k) {
        const double sumsq =
            detail::sum_in_order(onebit_.chunk_sum.data(), work_.first_chunk(k), work_.first_chunk(k + 1));
        scale[k] = std::sqrt(sumsq / double(tensors_[k].size));
        mean += scale[k] / double(tensors_.size());
      }
      for (std::size_t k = 0; k < tensors_.size(); ++k) onebit_.scaling[k] = scale[k] > 0 ? float(mean / scale[k]) : 1.0f;
      onebit_.scaling_ready = true;
      onebit_.compression_step = t;
    }
  }

  /// The compression stage's update once the averaged momentum is known (`averaged`; null with one
  /// rank, where it comes from d's gradients): momentum and fresh variance, then per tensor the
  /// factor on the frozen coefficient, then LAMB's second pass.
  void onebit_momentum_and_apply(const detail::step_data<Precision>& d, const detail::sign_code* averaged) {
    if constexpr (is_onebit) {
      backend_.onebit_momentum(d, coefficients_.data(), onebit_.scaling.data(), onebit_.fused.data(), averaged,
                               state_[2].data(), onebit_.chunk_max.data());
      wait();
      for (std::size_t t = 0; t < tensors_.size(); ++t) {
        const std::size_t c0 = work_.first_chunk(t), c1 = work_.first_chunk(t + 1);
        const auto& o = groups_[tensors_[t].group]->options_;
        const double largest = *std::max_element(onebit_.chunk_max.begin() + std::ptrdiff_t(c0),
                                                 onebit_.chunk_max.begin() + std::ptrdiff_t(c1));
        const float *weights = chunk_sums_.data(), *updates = weights + work_.size();
        const double factor = onebit_lamb::compression_factor(largest, std::sqrt(rank_ordered_sum(updates, c0, c1)),
                                                              std::sqrt(rank_ordered_sum(weights, c0, c1)),
                                                              onebit_.last_factor[t], o);
        onebit_.last_factor[t] = factor;
        tensor_state_[t] = onebit_.coeff_freeze[t] * factor;
        tensor_scale_[t] = float(coefficients_[tensors_[t].group].step_size * tensor_state_[t]);
      }
      backend_.template rule_stage<UpdateRule, detail::update_stage>(d, coefficients_.data(), tensor_scale_.data());
    }
  }

  /// A reducing rule: the per-tensor norms (a tensor can straddle shards, so the partial sums are
  /// all-reduced), the tensors' scales and the update pass. Unsharded, all of it stays on the
  /// backend: the host reads what the rule keeps after the step (tensor_state()).
  void reduce_and_update() {
    const std::size_t T = tensors_.size();
    if (run_segments_.size() == 0) {
      backend_.segmented_sum(chunk_sums_.data(), norm_segments_.data(), 2 * T, tensor_sums_.data());
    } else {  // per (tensor, owner) run, then the runs of each tensor in rank order
      backend_.segmented_sum(chunk_sums_.data(), norm_segments_.data(), run_sums_.size(), run_sums_.data());
      backend_.segmented_sum(run_sums_.data(), run_segments_.data(), 2 * T, tensor_sums_.data());
    }
    auto c = context();
    exchange_.sum_partials(c, std::span<double>(tensor_sums_));
    backend_.template tensor_scales<UpdateRule>(gradients_, coefficients_.data(), tensor_sums_.data(),
                                                tensor_state_.data(), tensor_scale_.data());
    backend_.template rule_stage<UpdateRule, detail::update_stage>(gradients_, coefficients_.data(), tensor_scale_.data());
    if constexpr (is_onebit) {
      wait();
      for (std::size_t t = 0; t < T; ++t)
        onebit_.coeff_freeze[t] = onebit_lamb::freeze_coefficient(onebit_.coeff_freeze[t], tensor_state_[t],
                                                                  groups_[tensors_[t].group]->options_);
    }
  }

  [[no_unique_address]] Backend backend_;  // first in, last out: its stream outlives the state
  options options_;
  LossScaler scaler_;
  detail::metered<Communicator> comm_;

  // Fixed at finalize().
  std::vector<detail::tensor_slot<param_type, grad_type>> tensors_;
  std::optional<detail::flat_layout> layout_;
  detail::work_list work_;                                // my elements, addressing the local state
  std::size_t state_elements_ = 0;
  buffer<float> master_;
  std::array<buffer<float>, state_count> state_;  // the rule's, in the order of UpdateRule::state
  shared<float> chunk_sums_;  // per chunk: the pass's sum, then (at work_.size()) its sum2
  shared<std::uint8_t> chunk_nonfinite_;
  buffer<detail::step_decision> decision_;  // this step's, where the passes run
  buffer<double> decision_sums_;            // its inputs: squared norm, non-finite chunks
  std::vector<double> owner_sum_;    // per rank: partial sums added in rank order
  shared<double> tensor_sums_;  // reducing rules: per tensor, squared norm 0, then norm 1
  buffer<std::size_t> norm_segments_, run_segments_;  // reducing rules: detail::norm_segments, on the backend
  buffer<double> run_sums_;
  shared<typename UpdateRule::scalars> coefficients_;  // per group, fixed at commit
  shared<double> tensor_state_;  // reducing rules: what the rule keeps per tensor
  shared<float> tensor_scale_;   // reducing rules: the update's per-tensor factor
  /// Where the committed step reads its gradients (boundary_gradients), for the stages that
  /// finish_step() runs: an update stage may read them too (LARS).
  detail::step_data<Precision> gradients_;
  [[no_unique_address]] std::conditional_t<is_onebit, detail::onebit_state<Backend>, detail::no_onebit_state> onebit_;
  /// What a committed step has left to do (finish_step).
  enum class stage : std::uint8_t { none, tensor_norms, params_back, onebit_exchange };
  stage pending_stage_ = stage::none;

  exchange exchange_;

  int micro_step_ = 0;
  std::uint64_t applied_ = 0, skipped_ = 0, consecutive_skips_ = 0;
  std::size_t parameters_ = 0;  // elements of all tensors
};

}  // namespace mpopt
