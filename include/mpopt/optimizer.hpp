// mpopt — the optimizer: one class template composing precision, loss scaler, partition, update
// rule, backend and communicator policies. It owns the step pipeline (docs/design.md §2); the policies
// own their options, state and element math.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "communicator.hpp"
#include "detail/agreement.hpp"
#include "detail/expert_placement.hpp"
#include "detail/flat_layout.hpp"
#include "detail/index_set.hpp"
#include "detail/memory_listing.hpp"
#include "detail/metered.hpp"
#include "detail/policy_members.hpp"
#include "detail/rule_driver.hpp"
#include "detail/spike_guard.hpp"
#include "detail/staged_driver.hpp"
#include "detail/state_access.hpp"
#include "detail/step_counts.hpp"
#include "detail/step_data.hpp"
#include "detail/stochastic_rounding.hpp"
#include "detail/tensor_registry.hpp"
#include "detail/validate.hpp"
#include "detail/work_list.hpp"
#include "host.hpp"
#include "loss_scale.hpp"
#include "options.hpp"
#include "partition.hpp"
#include "precision.hpp"
#include "rule.hpp"
#include "status.hpp"
#include "tensor.hpp"

namespace mpopt {

namespace detail {
template <class Opt, class Precision, class LossScaler, class Partition, class UpdateRule, class Backend>
class checkpointing;  // save() and load(): defined in <mpopt/checkpoint.hpp>, which <mpopt/mpopt.hpp> includes
}  // namespace detail

template <precision_policy Precision, loss_scaler_policy LossScaler, class Partition, class UpdateRule,
          class Backend = host, communicator Communicator = single_process>
class optimizer
    : public detail::tensor_registry<Precision, UpdateRule, Backend>,
      public detail::memory_listing<optimizer<Precision, LossScaler, Partition, UpdateRule, Backend, Communicator>,
                                    Precision, UpdateRule, Communicator>,
      public detail::state_access<optimizer<Precision, LossScaler, Partition, UpdateRule, Backend, Communicator>,
                                  Precision, UpdateRule,
                                  detail::driver_of_t<UpdateRule, Precision, Partition, Backend, Communicator>>,
      protected detail::agreement<optimizer<Precision, LossScaler, Partition, UpdateRule, Backend, Communicator>,
                                  Precision, LossScaler, Partition, UpdateRule, Backend, Communicator> {
  // Registration, checkpoints, the memory report, state access and agreement across ranks live in
  // headers of their own.
  using registry = detail::tensor_registry<Precision, UpdateRule, Backend>;
  using checkpointing = detail::checkpointing<optimizer, Precision, LossScaler, Partition, UpdateRule, Backend>;
  using memory_listing = detail::memory_listing<optimizer, Precision, UpdateRule, Communicator>;
  /// The rule's driver: how a committed step runs the rule's stages (detail/rule_driver.hpp).
  using driver = detail::driver_of_t<UpdateRule, Precision, Partition, Backend, Communicator>;
  using state_access = detail::state_access<optimizer, Precision, UpdateRule, driver>;
  using agreement = detail::agreement<optimizer, Precision, LossScaler, Partition, UpdateRule, Backend, Communicator>;
  friend checkpointing;
  friend memory_listing;
  friend state_access;
  friend agreement;
  using state_access::tensor_at;
  using agreement::agree;
  using agreement::agree_on_loss;
  using agreement::agree_on_backend;
  using agreement::check_same_settings;
  using agreement::decide_and_update;
  using registry::groups_;
  using registry::finalized_;
  using registry::tensor_name;
  using registry::first_tensor_of;
  static_assert(detail::policy_members_checked<Precision, LossScaler, Partition, UpdateRule, driver, Backend, Communicator>);
  static_assert(scaler_serves<LossScaler, typename Precision::grad_type>,
                "this loss scaler does not serve the precision's gradients: the built-in scalers are for fp16 (use "
                "mpopt::no_scaling with mpopt::fp32 or mpopt::bf16); a scaler of yours declares serves<Grad>");
  static_assert(partition_policy<Partition, Precision, Backend, Communicator>,
                "Partition must model mpopt::partition_policy (partition.hpp): mpopt::replicated, zero1, zero2 or yours, "
                "with a layout whose sharding its exchange shares");
  static_assert(update_rule<UpdateRule>,
                "UpdateRule must model mpopt::update_rule (rule.hpp; README, \"Writing your own rule\")");
  static_assert(detail::runs_on_stream_of<Backend, Communicator>,
                "a device communicator (mpopt::nccl) needs a backend that runs on its stream: mpopt::cuda, or "
                "mpopt::offload");

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
  static constexpr std::size_t every_tensor = std::size_t(-1);  ///< wait_params(): all of them

 private:
  static constexpr std::size_t state_count = UpdateRule::state.size();
  /// The partition's exchange: how gradients and parameters travel between ranks (partition.hpp).
  using exchange = typename Partition::template exchange<Precision, Backend, Communicator>;
  using exchange_context = detail::exchange_context<Precision, Backend, Communicator>;
  using groups = std::vector<std::unique_ptr<param_group>>;
  using rule_context = detail::rule_context<exchange, typename UpdateRule::scalars, groups>;

  /// State lives where the backend computes; small arrays shared with the host's step logic are
  /// readable by both (host.hpp, cuda.hpp).
  template <class T>
  using buffer = typename Backend::template buffer<T>;
  template <class T>
  using shared = typename Backend::template shared_vector<T>;

 public:
  /// Under a rule whose driver checks the communicator (1-bit LAMB), the constructor is collective.
  explicit optimizer(options o = {}, scaler_options s = {}, Communicator comm = {})
      : backend_(detail::backend_for<Backend>(comm)),
        options_(detail::validated(o, std::is_same_v<LossScaler, no_scaling>, nonblocking_communicator<Communicator>)),
        scaler_(s),
        comm_(std::move(comm)),
        guard_(options_.spike_guard) {
    driver::preflight(comm_);
  }
  /// With the communicator first: optimizer opt{mpopt::mpi{MPI_COMM_WORLD}, {.clip_grad = 1}, {...}}.
  template <class C>
    requires std::same_as<std::remove_cvref_t<C>, Communicator>
  explicit optimizer(C&& comm, options o = {}, scaler_options s = {})
      : optimizer(o, s, std::forward<C>(comm)) {}

  optimizer(const optimizer&) = delete;
  optimizer& operator=(const optimizer&) = delete;

  /// A group of experts (mixture of experts), data-parallel over `replicas`: the ranks holding
  /// replicas of the same experts (DeepSpeed's expert-data-parallel group; a sub-communicator of the
  /// optimizer's, D of its W ranks). Its gradients are summed over those ranks only, still averaged
  /// over all W (DeepSpeed's convention), its state is sharded among them under ZeRO, and every
  /// element counts once in the global norm. Name its tensors by their global expert id: a
  /// checkpoint holds every expert of every rank.
  param_group& add_expert_group(const group_options& o, Communicator replicas) {
    detail::check_expert_communicator(comm_.inner(), replicas);
    param_group& g = registry::new_group(o);
    expert_comms_.push_back(std::make_unique<detail::metered<Communicator>>(std::move(replicas), &comm_));
    g.comm_ = std::uint32_t(expert_comms_.size());
    return g;
  }

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
    if (!finalized_) allocate();
  }

 private:
  /// finalize()'s work, once.
  MPOPT_COLD void allocate() {
    agree("finalize", [&] {
      if (groups_.empty()) detail::fail("no parameter groups: add a group before the first step");
      for (const auto& g : groups_)
        if (g->entries_.empty()) detail::fail(g->label_, " has no parameters");
      driver::check_groups(groups_);
    });
    group_comms_.clear();
    for (const auto& g : groups_) group_comms_.push_back(g->comm_ ? expert_comms_[g->comm_ - 1].get() : &comm_);
    check_same_settings();
    experts_ = detail::place_experts(comm_, groups_, std::span<detail::metered<Communicator>* const>(group_comms_));
    tensors_ = registry::tensor_table();
    std::vector<std::uint32_t> tensor_groups;
    std::vector<std::size_t> sizes;
    for (const auto& t : tensors_) {
      tensor_groups.push_back(t.group);
      sizes.push_back(t.size);
    }
    layout_.emplace(
        detail::lay_out<typename Partition::layout>(Partition::name, tensor_groups, sizes, groups_.size(), context()));
    const detail::flat_layout& layout = *layout_;
    work_ = layout.local_work();
    uncounted_ = layout.uncounted(work_);
    state_elements_ = layout.local_elements();
    if constexpr (Precision::has_master) master_ = buffer<float>(state_elements_);
    for (auto& b : state_) b = buffer<float>(state_elements_);
    chunk_sums_.assign(2 * work_.size(), 0.0f);
    chunk_nonfinite_.assign(work_.size(), 0);
    chunk_grad_sums_.assign(work_.size(), 0.0);
    exchange_.allocate(layout, context());
    decision_ = buffer<detail::step_decision>::zeroed(1);
    decision_sums_ = buffer<double>::zeroed(2);
    rank_ordered_sum_ = detail::rank_ordered_sum(work_);
    coefficients_.resize(groups_.size());
    if (options_.leave_param_gather_in_flight) unwaited_.reserve(tensors_.size());
    gradients_ = data();
    auto c = update_context();
    driver_.allocate(c);
    parameters_ = layout.parameters();
    finalized_ = true;
    backend_.params_in(data());
    backend_.initialize_state(data());
    wait();
    driver_.started(c);
    comm_.take_bytes();  // setup traffic is not a step's
  }

 public:

  /// Tensor i's gradient for this micro-step is complete (call it during backward, as each gradient
  /// is done). Under zero2 (and overlap_comm, in the window's last backward, under every partition)
  /// buckets are reduced as soon as they and all buckets after them are complete: last tensors
  /// first, the order of a backward pass; step() reduces what is left. Otherwise this checks i.
  void grad_ready(std::size_t i) {
    finalize();
    comm_.at("grad_ready()", next_step());
    require_params_waited("grad_ready()");
    finish_step();
    tensor_at(i);
    bool first_report = true;
    abandon_window_on_error([&] {
      backend_.gradient_ready(data(), i);
      auto c = context();
      first_report = exchange_.grad_ready(c, i);
    });
    if (!first_report) detail::fail("grad_ready: tensor '", tensor_name(i), "' was already reported in this micro-step");
  }

  /// Whether tensor i's gradient of this micro-step went out to the other ranks (zero2, and zero1
  /// under overlap_comm), so that its memory may be reused until the next backward writes it.
  /// Buckets go last first: a tensor is done once it and every later tensor sharing its buckets
  /// were reported. Replicated reads every gradient in step(): always false there.
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
    if (guard_.needs_loss())
      detail::fail("spike_guard.loss_z = ", options_.spike_guard.loss_z, " needs the loss: call step(loss)");
    return step_with(0.0);
  }
  /// step(), with this micro-batch's loss on this rank for the spike guard (spike_guard_options),
  /// which scores the mean over the window's micro-steps and every rank. Without a loss test the
  /// loss is not used.
  step_status step(double loss) { return step_with(loss); }

  /// Finishes a step whose last collectives failed. A step is committed once its first pass has
  /// changed the moments; if a collective after that fails (LAMB's per-tensor norms, the
  /// all-gather of updated parameters), step() throws with the parameters not all updated yet.
  /// This runs what is left, on every rank; step(), grad_ready() and save() call it first.
  void finish_step() {
    complete_step(every_tensor);
    unwaited_.clear();
  }

  /// Under leave_param_gather_in_flight (zero1/zero2 with overlap_comm), step() returns with the
  /// all-gather of the updated parameters still running, so that the next forward overlaps it:
  /// this returns once every parameter (or tensor i's) holds the update. Call it before the forward
  /// reads them: the next grad_ready(), step() or save() throws if a tensor was not waited for.
  /// Otherwise the parameters are updated when step() returns, and this returns at once.
  void wait_params(std::size_t i = every_tensor) {
    if (i != every_tensor) tensor_at(i);
    complete_step(i);
    if (i == every_tensor) unwaited_.clear();
    else unwaited_.erase(i);
  }

  /// Writes every parameter, master and moment by tensor name, with the scaler, counters and group
  /// options, to a safetensors file (format: README, "Checkpoints"); of expert groups, every rank's
  /// experts. Every rank calls it; rank 0 writes, tensor by tensor as those held elsewhere are
  /// gathered (one at a time), and a failure there throws on every rank. Needs
  /// <mpopt/checkpoint.hpp>: a program that saves nothing compiles none of it.
  template <class Path>
  void save(const Path& path) {
    checkpointing::save(*this, path);
  }

  /// Restores a save()d state. The file must come from an optimizer of the same policies and the
  /// same tensors (names, sizes, groups), saved at any world size. Every rank reads and checks it;
  /// only when all ranks found it good does anything change, otherwise every rank throws. Needs
  /// <mpopt/checkpoint.hpp>.
  template <class Path>
  void load(const Path& path, load_options lo = {}) {
    checkpointing::load(*this, path, lo);
  }

  /// Sets every gradient to zero (for backward passes that add into their gradients).
  void zero_grad() {
    finalize();
    backend_.zero_grad(data());
    wait();  // before the next backward writes the gradients
  }

 private:
  std::uint64_t next_step() const { return counts_.next(); }

  /// step(), given this micro-batch's loss (0 when the guard does not test the loss).
  step_status step_with(double loss) {
    finalize();
    comm_.at("step()", next_step());
    require_params_waited("step()");
    finish_step();
    backend_.gradients_in(data());
    step_status st;
    st.scale_before = scaler_.scale();
    st.step = groups_.front()->step_;
    if (micro_step_ == 0) guard_.new_window();

    // The counter advances only when the call completes: a throw below leaves the window as it was.
    if (micro_step_ + 1 < options_.accumulation_steps) {
      abandon_window_on_error([&] {  // the exchange folds this backward's gradients in
        auto c = context();
        exchange_.micro_step(c);
      });
      guard_.fold(loss);
      st.micro_step = ++micro_step_;
      return reported(st);
    }

    detail::step_data<Precision> d;
    abandon_window_on_error([&] {  // where the update reads them, as the exchange delivers them
      auto c = context();
      d = exchange_.boundary(c, compressing());
      agree_on_loss(loss);
    });
    const double scale = scaler_.scale();
    // Gradients a driver keeps local (1-bit LAMB's compression stage) each stand for the combined
    // one (times W for a sum), and their norm is the root mean square of the ranks' norms.
    const double world = comm_.size(), local = compressing() ? world : 1.0;
    const double divisor =
        (options_.combine == accumulation::mean ? double(options_.accumulation_steps) * world : 1.0) / local;
    const double unscale = 1.0 / (scale * divisor * double(send_scale()));
    d.grad_scale = float(unscale);
    const detail::step_rule rule{unscale, local, options_.clip_grad, options_.skip_nonfinite};
    const detail::step_decision decided = decide_and_update(d, rule);

    st.grad_norm = decided.norm;
    st.loss_z = guard_.loss_score();
    st.norm_z = guard_.norm_score();
    const detail::spike spiked = guard_.verdict();  // none where the decision skips
    if (decided.skip || spiked != detail::spike::none) {
      st.result = decided.skip ? step_result::skipped_nonfinite
                  : spiked == detail::spike::loss ? step_result::skipped_loss_spike
                                                  : step_result::skipped_norm_spike;
      st.grad_norm_clipped = decided.norm;
      skip(spiked);
      return reported(st);
    }
    st.result = step_result::applied;
    st.applied = true;
    st.clip_coef = decided.clip;
    st.grad_norm_clipped = decided.norm * decided.clip;
    st.step = groups_.front()->step_;
    return reported(st);
  }

  static constexpr std::size_t leave_in_flight = std::size_t(-2);
  /// Runs what the committed step has left: the driver's stages, then the parameters' way back,
  /// whose gathers may stay in flight (overlap_comm) except those of `tensor` (or every_tensor's).
  void complete_step(std::size_t tensor) {
    if (pending_stage_ == stage::none || (tensor == leave_in_flight && pending_stage_ == stage::params_in_flight)) return;
    try {
      if (pending_stage_ == stage::rule) {
        auto c = update_context();
        driver_.finish(c);
        pending_stage_ = stage::params_back;
      }
      auto c = context();
      if (pending_stage_ == stage::params_back) {
        exchange_.params_back(c);
        pending_stage_ = stage::params_in_flight;
      }
      if (tensor == leave_in_flight) return;
      exchange_.wait_params(c, tensor);
      backend_.params_out(data(), tensor);
      if (tensor == every_tensor) pending_stage_ = stage::none;
    } catch (const error& e) {
      // A gather that failed in flight took the others' results with it: all of them again.
      if (pending_stage_ == stage::params_in_flight) pending_stage_ = stage::params_back;
      detail::fail("step ", groups_.front()->step_, " is committed on every rank but unfinished: ", e.what(),
                   "; the parameters are not all updated yet: step(), save() or finish_step() finishes it");
    }
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
  exchange_context context() {
    return {backend_, comm_, group_comms_, options_, data(), micro_step_, send_scale(), compressing()};
  }
  /// What the rule's driver works with: the committed step's gradients and scalars besides.
  rule_context update_context() { return {context(), exchange_, gradients_, coefficients_.data(), groups_}; }

  /// What gradients are multiplied by before they are summed across ranks.
  float send_scale() const {
    return comm_.size() > 1 && !compressing() ? float(1.0 / options_.gradient_predivide) : 1.0f;
  }

  /// Whether this step's gradients stay on their rank (the driver's choice: 1-bit LAMB's compression).
  bool compressing() const { return driver::local_gradients(groups_); }

  /// The status's counters, scale and communication fields: what this call handed the communicator.
  step_status& reported(step_status& st) {
    counts_.report(st, scaler_);
    st.comm_bytes = comm_.take_bytes();
    st.comm_ratio = double(st.comm_bytes) / (4.0 * double(parameters_));
    driver_.report(st);
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

  /// Waits for the passes and collectives issued so far.
  void wait() { context().wait(); }

  /// An applied step: counters advance now, as the first pass below changes the moments, and a
  /// collective that fails after it leaves the rest for finish_step().
  void commit_and_update(detail::step_data<Precision>& d) {
    for (auto& g : groups_) ++g->step_;
    count_applied();
    update(d, counts_.applied);
    wait();  // the parameters are updated when step() returns
  }

  /// An applied step's counters (the groups' apart) and the scaler's good step.
  void count_applied() {
    counts_.apply(scaler_);
    micro_step_ = 0;
  }

  /// A skipped step: an overflow, or what the spike guard found (which the scaler does not see);
  /// throws, changing nothing, if the run cannot go on (step_counts::skip).
  void skip(detail::spike spiked) {
    // Across ranks the window's gradients are already combined in place: an error below ends the
    // window. On one rank it stays open, so a caller that catches can finish the step again.
    if (!exchange_.keeps_window(comm_.size())) micro_step_ = 0;
    const bool overflow = spiked == detail::spike::none;
    counts_.skip(scaler_, options_.max_consecutive_skips, [&] {
      if (!overflow) return std::string(spiked == detail::spike::loss ? "a loss spike" : "a gradient norm spike");
      return detail::nonfinite_report(work_, chunk_nonfinite_.data(), tensors_.size(),
                                      [&](std::size_t t) -> const std::string& { return tensor_name(t); });
    }, overflow);
    micro_step_ = 0;
  }

  /// The update's first pass, then what follows it (finish_step), issued to the backend (the caller
  /// waits). Coefficients are fixed here, so a step finished later is the step that was committed.
  /// `applied`: this step's number among applied steps, which keys stochastic rounding; `ahead`: how
  /// far the step is ahead of the groups' counters (1 where they advance once it is decided).
  void update(detail::step_data<Precision>& d, std::uint64_t applied, std::uint64_t ahead = 0) {
    for (std::size_t g = 0; g < groups_.size(); ++g)
      coefficients_[g] = UpdateRule::prepare(groups_[g]->options_, groups_[g]->step_ + ahead);
    d.rounding_key = detail::rounding_key(options_.rounding_seed, applied);
    gradients_ = d;
    auto c = update_context();
    driver_.begin(c);
    pending_stage_ = stage::rule;
    if (options_.leave_param_gather_in_flight && Partition::layout::sharded) {
      complete_step(leave_in_flight);
      if (pending_stage_ == stage::params_in_flight) unwaited_.reset(tensors_.size());
    } else {
      complete_step(every_tensor);
    }
  }

  /// Under leave_param_gather_in_flight, a call that begins the next step comes after a forward
  /// that waited for every parameter (wait_params): otherwise that forward read the last step's.
  void require_params_waited(const char* call) const {
    if (unwaited_.empty()) return;
    const std::size_t t = unwaited_.first();
    detail::fail(call, ": tensor '", tensor_name(t), "' (", t, ") was not waited for since the last step left its "
                 "all-gather in flight (leave_param_gather_in_flight), so the forward read its old values: call "
                 "wait_params(", t, ") before the forward reads it, or wait_params() for every tensor");
  }

  [[no_unique_address]] Backend backend_;  // first in, last out: its stream outlives the state
  options options_;
  LossScaler scaler_;
  detail::metered<Communicator> comm_;
  /// Expert groups' communicators, metered under comm_; before exchange_, whose collectives use them.
  std::vector<std::unique_ptr<detail::metered<Communicator>>> expert_comms_;

  // Fixed at finalize().
  std::vector<detail::metered<Communicator>*> group_comms_;  // per group: comm_ or its expert communicator
  std::vector<detail::expert_placement> experts_;            // per expert group: which ranks hold which experts
  std::vector<detail::tensor_slot<param_type, grad_type>> tensors_;
  std::optional<detail::flat_layout> layout_;
  detail::work_list work_;                                // my elements, addressing the local state
  std::vector<std::pair<std::size_t, std::size_t>> uncounted_;  // chunks of work_ another rank counts in the norm
  std::size_t state_elements_ = 0;
  buffer<float> master_;
  std::array<buffer<float>, state_count> state_;  // the rule's, in the order of UpdateRule::state
  shared<float> chunk_sums_;  // per chunk: the pass's sum, then (at work_.size()) its sum2
  shared<std::uint8_t> chunk_nonfinite_;
  shared<double> chunk_grad_sums_;  // per chunk: the gradient's sum of squares (the norm pass's or the update's)
  buffer<detail::step_decision> decision_;  // this step's, where the passes run
  buffer<double> decision_sums_;            // its inputs: squared norm, non-finite chunks
  detail::rank_ordered_sum rank_ordered_sum_;
  shared<typename UpdateRule::scalars> coefficients_;  // per group, fixed at commit
  /// Where the committed step reads its gradients (boundary_gradients), for the stages that
  /// finish_step() runs: an update stage may read them too (LARS).
  detail::step_data<Precision> gradients_;
  driver driver_;
  /// What a committed step has left (finish_step): the driver's stages, the parameters' way back, its gathers.
  enum class stage : std::uint8_t { none, rule, params_back, params_in_flight };
  stage pending_stage_ = stage::none;

  exchange exchange_;

  int micro_step_ = 0;
  detail::step_counts counts_;
  std::size_t parameters_ = 0;  // elements of all tensors
  detail::index_set unwaited_;   // tensors whose gather the last step left in flight, not waited for since
  detail::spike_guard guard_;
};

}  // namespace mpopt
