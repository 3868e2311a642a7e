// mpopt — the step pipeline: what the optimizer does with its parts (step_state.hpp), one call at a
// time. finalize() lays the state out once; each backward's step() then either folds its gradients
// into the window or, at the window's end, runs the stages below in order: gather, decide, commit,
// run the rule, parameters back, status (docs/design.md §2). The policies do the work: the
// partition's exchange moves gradients and parameters, the backend runs the passes, the rule's
// driver runs the rule's stages, the scaler and spike guard judge.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../communicator.hpp"
#include "../../error.hpp"
#include "../../loss_scale.hpp"
#include "../../lr_schedule.hpp"
#include "../../options.hpp"
#include "../../precision.hpp"
#include "../../status.hpp"
#include "../comm/agree.hpp"
#include "../config.hpp"
#include "../exchange/exchange_context.hpp"
#include "../exchange/expert_placement.hpp"
#include "../exchange/partition_layout.hpp"
#include "../drivers/rule_driver.hpp"
#include "../comm/same_settings.hpp"
#include "spike_guard.hpp"
#include "../drivers/staged_driver.hpp"
#include "step_state.hpp"
#include "../lanes/stochastic_rounding.hpp"
#include "tensor_registry.hpp"
#include "../options/validate.hpp"

namespace mpopt::detail {

template <class Precision, class LossScaler, class Partition, class UpdateRule, class Backend, class Communicator>
class step_pipeline {
 public:
  using precision = Precision;
  using loss_scaler = LossScaler;
  using partition = Partition;
  using rule = UpdateRule;
  using backend_type = Backend;
  using communicator_type = Communicator;
  using registry = tensor_registry<Precision, UpdateRule, Backend>;
  using groups_type = std::vector<std::unique_ptr<typename registry::param_group>>;
  /// The rule's driver: how a committed step runs the rule's stages (rule_driver.hpp).
  using driver_type = driver_of_t<UpdateRule, Precision, Partition, Backend, Communicator>;
  /// The partition's exchange: how gradients and parameters travel between ranks (partition.hpp).
  using exchange_type = typename Partition::template exchange<Precision, Backend, Communicator>;
  using context_type = exchange_context<Precision, Backend, Communicator>;
  using rule_context_type = rule_context<exchange_type, typename UpdateRule::scalars, groups_type>;
  static constexpr std::size_t every_tensor = std::size_t(-1);

  step_pipeline(registry& r, const optimizer_options& o, const typename LossScaler::options& s, Communicator comm)
      : backend(backend_for<Backend>(comm)),
        options(validated(o, std::is_same_v<LossScaler, no_scaling>, nonblocking_communicator<Communicator>)),
        scaler(s),
        comms(std::move(comm)),
        progress(options.spike_guard),
        registry_(r) {
    driver_type::preflight(comms.comm);
  }

  // The parts, in the order they are made: the backend first in, last out (its stream outlives the
  // state); the communicators before the exchange, whose collectives use them.
  [[no_unique_address]] Backend backend;
  optimizer_options options;
  LossScaler scaler;
  communicators<Communicator> comms;
  step_state<Precision, UpdateRule, Backend> state;
  driver_type driver;
  exchange_type exchange;
  step_progress progress;
  /// What sets the groups' rates before each step (optimizer::set_schedule); none: theirs.
  std::optional<lr_schedule> schedule;

  groups_type& groups() { return registry_.groups_; }
  const groups_type& groups() const { return registry_.groups_; }
  bool finalized() const { return registry_.finalized_; }
  const std::string& tensor_name(std::size_t i) const { return registry_.tensor_name(i); }
  std::size_t registered_tensors() const { return registry_.first_tensor_of(std::uint32_t(groups().size())); }

  /// Whether options O have the betas a schedule may set (OneCycle's momentum).
  template <class O>
  static constexpr bool has_betas = requires(O o) {
    o.beta1 = 0.0;
    o.beta2 = 0.0;
  };
  /// Whether some group may have them: the rule's options, or a member's of a rule set (OneCycle
  /// sets the betas of the groups that have them and leaves the others: DeepSpeed's writes betas,
  /// which only rules with betas read).
  static constexpr bool rule_has_betas = [] {
    if constexpr (rule_set<UpdateRule>)
      return []<class... R>(std::tuple<R...>*) { return (has_betas<typename R::options> || ...); }(
          static_cast<typename UpdateRule::member_rules*>(nullptr));
    else return has_betas<typename UpdateRule::options>;
  }();

  /// Throws mpopt::error if `s` is invalid, or cycles betas the rule does not have.
  static void check_schedule(const lr_schedule& s) {
    mpopt::validate(s);
    const auto* cycle = std::get_if<one_cycle>(&s);
    if (!rule_has_betas && cycle && cycle->cycle_momentum)
      fail("OneCycle.cycle_momentum: ", UpdateRule::name, " has no beta1 and beta2 to cycle; set it to false");
  }

  /// optimizer::set_schedule: checked whole before it replaces the last; after the first step,
  /// also that every rank sets the same (finalize() checks it before).
  MPOPT_COLD void set_schedule(std::optional<lr_schedule> s) {
    if (s) check_schedule(*s);
    if (finalized())
      require_same_settings(comms.comm, schedule_compared(s, "the "), "Every rank must set the same schedule");
    schedule = std::move(s);
  }

  /// Throws unless the rule of tensor i's group keeps a state buffer k (optimizer::moment).
  MPOPT_COLD void check_moment(std::size_t k, std::size_t i) const {
    const auto& o = groups()[state.tensor(i).group]->options_;
    const std::size_t n = state_names<UpdateRule>(o).size();
    if (k < n) return;
    std::string rule(rule_name<UpdateRule>(o));
    if (rule_set<UpdateRule>) rule += " (the rule of tensor '" + tensor_name(i) + "')";
    fail("moment ", k, ": ", rule, " keeps ", n ? "moments 0 to " + std::to_string(n - 1) : std::string("no moments"));
  }

  /// The memory report's lines for the model's tensors (memory_listing.hpp).
  void list_tensors(mpopt::memory_report& r) const { registry_.list_tensors(r); }

  /// optimizer::add_expert_group: a group whose gradients are summed over `replicas`, metered under
  /// the optimizer's communicator.
  typename registry::param_group& add_expert_group(const typename UpdateRule::options& o, Communicator replicas) {
    check_expert_communicator(comms.comm.inner(), replicas);
    auto& g = registry_.new_group(o);
    comms.experts.push_back(std::make_unique<metered<Communicator>>(std::move(replicas), &comms.comm));
    g.comm_ = std::uint32_t(comms.experts.size());
    return g;
  }

  /// Allocates the state and copies the parameters into the masters, once (optimizer::finalize).
  void finalize() {
    if (!finalized()) allocate();
  }

  /// Tensor i's gradient is complete (optimizer::grad_ready): the exchange may reduce its buckets.
  void grad_ready(std::size_t i) {
    begin_call("grad_ready()");
    state.tensor(i);
    bool first_report = true;
    abandon_window_on_error([&] {
      backend.gradient_ready(state.data(), i);
      auto c = context();
      first_report = exchange.grad_ready(c, i);
    });
    if (!first_report) fail("grad_ready: tensor '", tensor_name(i), "' was already reported in this micro-step");
  }

  /// One backward's step() (optimizer::step): within the window, its gradients are folded in; at
  /// its end, the stages run in order. `loss`: this micro-batch's, for the spike guard.
  step_status step(double loss) {
    begin_call("step()");
    backend.gradients_in(state.data());
    step_status st;
    st.scale_before = scaler.scale();
    st.step = groups().front()->step_;
    if (progress.micro_step == 0) progress.guard.new_window();
    if (progress.micro_step + 1 < options.accumulation_steps) return fold(st, loss);

    step_data<Precision> d = gather(loss);
    const step_rule rule = rule_for(d);
    const step_decision decided = decide(d, rule);  // commits and runs the rule where it applies
    return status(st, decided);
  }

  /// Runs what the committed step has left (optimizer::finish_step).
  void finish_step() {
    params_back(every_tensor);
    progress.unwaited.clear();
  }
  /// optimizer::wait_params.
  void wait_params(std::size_t i) {
    if (i != every_tensor) state.tensor(i);
    params_back(i);
    if (i == every_tensor) progress.unwaited.clear();
    else progress.unwaited.erase(i);
  }

  /// Under leave_param_gather_in_flight, a call that begins the next step comes after a forward
  /// that waited for every parameter (wait_params): otherwise that forward read the last step's.
  void require_params_waited(const char* call) const {
    if (progress.unwaited.empty()) return;
    const std::size_t t = progress.unwaited.first();
    fail(call, ": tensor '", tensor_name(t), "' (", t, ") was not waited for since the last step left its "
         "all-gather in flight (leave_param_gather_in_flight), so the forward read its old values: call "
         "wait_params(", t, ") before the forward reads it, or wait_params() for every tensor");
  }

  /// The optimizer step the next boundary completes, counting from 1 (collective failures name it).
  std::uint64_t next_step() const { return progress.counts.next(); }
  /// The step's tensors, state and partial sums, reading the gradients as they are.
  step_data<Precision> data() { return state.data(); }
  /// Waits for the passes and collectives issued so far.
  void wait() { context().wait(); }
  /// Runs f on every rank and agrees on the outcome: if it threw mpopt::error anywhere, it throws
  /// on every rank, so no rank goes on into a collective alone.
  template <class F>
  void agree(std::string_view what, F&& f) {
    detail::agree(comms.comm, what, std::forward<F>(f));
  }

 private:
  // ── Setup ──────────────────────────────────────────────────────────────────────────────────────

  /// finalize()'s work: every rank agrees on the groups and settings, then the layout, the state
  /// and the exchange's buffers are made and the masters copied from the parameters.
  MPOPT_COLD void allocate() {
    agree("finalize", [&] {
      if (groups().empty()) fail("no parameter groups: add a group before the first step");
      for (const auto& g : groups())
        if (g->entries_.empty()) fail(g->label_, " has no parameters");
      driver_type::check_groups(groups());
    });
    comms.of_group.clear();
    for (const auto& g : groups()) comms.of_group.push_back(comms.of_index(g->comm_));
    check_same_settings();
    comms.placement = place_experts(comms.comm, groups(), std::span<metered<Communicator>* const>(comms.of_group));
    auto table = registry_.tensor_table();
    std::vector<std::uint32_t> tensor_groups;
    std::vector<std::size_t> sizes;
    for (const auto& t : table) {
      tensor_groups.push_back(t.group);
      sizes.push_back(t.size);
    }
    state.allocate(lay_out<typename Partition::layout>(Partition::name, tensor_groups, sizes, costs_of_updates(),
                                                       groups().size(), context(), state_alignment<Precision>()),
                   std::move(table), kept_buffers());
    exchange.allocate(*state.layout, context());
    if (options.leave_param_gather_in_flight) progress.unwaited.reserve(state.tensors.size());
    auto c = driver_context();
    driver.allocate(c);
    registry_.finalized_ = true;
    backend.params_in(data());
    const auto initial = initial_state();
    backend.initialize_state(data(), initial.empty() ? nullptr : initial.data());
    wait();
    driver.started(c);
    comms.comm.take_bytes();  // setup traffic is not a step's
  }

  /// How many of the state buffers each group's rule keeps.
  std::vector<std::size_t> kept_buffers() const {
    std::vector<std::size_t> kept;
    for (const auto& g : groups()) kept.push_back(state_names<UpdateRule>(g->options_).size());
    return kept;
  }

  /// What updating each tensor costs, in registration order, and which groups keep their tensors
  /// whole (update_of): what a layout balances across ranks where it cuts shards at tensors.
  update_costs costs_of_updates() const {
    update_costs costs;
    for (const auto& g : groups()) {
      const group_update u = update_of<UpdateRule>(g->options_);
      costs.whole_groups.push_back(u.whole_tensors);
      for (std::size_t i = 0; i < g->size(); ++i) costs.tensors.push_back(u.cost(g->shape(i), g->entries_[i].size));
    }
    return costs;
  }

  /// What each state buffer starts at, per group (the rule's initial_state; empty: zero).
  typename Backend::template shared_vector<float> initial_state() const {
    typename Backend::template shared_vector<float> initial;
    if constexpr (rule_initial_state<UpdateRule>) {
      constexpr std::size_t n = UpdateRule::state.size();
      initial.resize(groups().size() * n);
      for (std::size_t g = 0; g < groups().size(); ++g)
        for (std::size_t k = 0; k < n; ++k) initial[g * n + k] = UpdateRule::initial_state(groups()[g]->options_, k);
    }
    return initial;
  }

  /// Every rank must hold the same policies, options (the optimizer's, the scaler's, each group's,
  /// the communicator's) and tensors; otherwise every rank throws, naming what differs on which
  /// ranks, before any gradient moves. What decides the number of settings is compared first.
  MPOPT_COLD void check_same_settings() {
    const std::string precision = stored_precision_name<Precision>();
    const std::string policies = policies_text(
        {precision, LossScaler::name, Partition::name, UpdateRule::name, Backend::name, Communicator::name},
        type_name<typename Precision::accumulate_type>, type_name<typename Precision::communicate_type>);
    require_same_settings(comms.comm, settings_shape(policies, groups().size()), same_settings_advice);
    if constexpr (chooses_fields<typename UpdateRule::options>) {  // what each group chose decides its fields
      std::vector<setting> chosen;
      for (const auto& g : groups())
        chosen.push_back({g->label_ + "'s rule", std::string(rule_name<UpdateRule>(g->options_))});
      require_same_settings(comms.comm, std::span<const setting>(chosen), same_settings_advice);
    }

    std::optional<bool> deterministic;
    if constexpr (requires { comms.comm.inner().options().deterministic; })
      deterministic = comms.comm.inner().options().deterministic;
    std::vector<setting> all =
        pipeline_settings(options, rounding_of_t<Precision>::name, LossScaler::name, field_refs(scaler.config()),
                          field_refs(scaler.save()), Communicator::name, deterministic);
    for (std::size_t gi = 0; gi < groups().size(); ++gi) {
      const auto& g = groups()[gi];
      // An expert group's communicator; its tensors' names differ between sets of experts
      // (expert_placement.hpp checks them).
      const std::size_t replicas = g->expert_parallel() ? std::size_t(comms.of_group[gi]->size()) : 0;
      tensors_summary tensors(g->label_, replicas);
      for (const auto& e : g->entries_) tensors.add(e.name, e.size, e.shape);
      add_group_settings(all, g->label_, field_refs(g->options_), tensors);
    }
    const std::vector<setting> schedule_parts = schedule_compared(schedule, "the ");
    all.insert(all.end(), schedule_parts.begin(), schedule_parts.end());
    require_same_settings(comms.comm, std::span<const setting>(all), same_settings_advice);
  }

  /// What every call that begins a step's work does first: the state exists, a failing collective
  /// will name this call and step, the last forward waited for its parameters, and the last step
  /// is finished.
  void begin_call(const char* call) {
    finalize();
    comms.comm.at(call, next_step());
    require_params_waited(call);
    finish_step();
  }

  /// A backward inside the window: the exchange folds its gradients in. The counter advances only
  /// when the call completes: a throw leaves the window as it was.
  step_status fold(step_status& st, double loss) {
    abandon_window_on_error([&] {
      auto c = context();
      exchange.micro_step(c);
    });
    progress.guard.fold(loss);
    st.micro_step = ++progress.micro_step;
    return reported(st);
  }

  // ── 1. Gather: the window's gradients, where the update reads them ────────────────────────────

  /// The exchange delivers the window's gradients (summed across ranks, or this rank's shard of
  /// them), and every rank agrees on the window's mean loss.
  step_data<Precision> gather(double loss) {
    step_data<Precision> d;
    abandon_window_on_error([&] {
      auto c = context();
      d = exchange.boundary(c, compressing());
      agree_on_loss(loss);
    });
    return d;
  }

  /// The boundary's mean loss over its micro-steps (`loss`: the last one's) and, by one all-reduce
  /// where the spike guard tests it, over every rank: all judge the same value.
  void agree_on_loss(double loss) {
    spike_guard& guard = progress.guard;
    double mean = guard.window_mean(loss, options.accumulation_steps);
    if (guard.needs_loss() && comms.comm.size() > 1) {
      comms.comm.all_reduce(std::span<double>(&mean, 1), reduce_op::sum);
      mean /= double(comms.comm.size());
    }
    guard.set_loss(mean);
  }

  /// What undoes the loss scale and the window's combination (sum or mean), and the clipping and
  /// skipping asked for. Gradients a driver keeps local (1-bit LAMB's compression stage) each stand
  /// for the combined one (times W for a sum), and their norm is the root mean square of the
  /// ranks' norms.
  step_rule rule_for(step_data<Precision>& d) const {
    const double world = comms.comm.size(), local = compressing() ? world : 1.0;
    const double divisor =
        (options.combine == accumulation::mean ? double(options.accumulation_steps) * world : 1.0) / local;
    const double unscale = 1.0 / (scaler.scale() * divisor * double(send_scale()));
    d.grad_scale = float(unscale);
    return {unscale, local, options.clip_grad, options.skip_nonfinite};
  }

  // ── 2. Decide: the overflow test and the global norm, alike on every rank ─────────────────────

  /// Decides the step and commits it unless it is skipped, by the cheapest way the rule, driver,
  /// backend and layout allow.
  step_decision decide(step_data<Precision>& d, const step_rule& rule) {
    if (!rule.needs_gradient_first() && !progress.guard.on() && sums_gradient_v<driver_type>)
      return commit_then_norm(d, rule);  // no gradient pass
    if (decides_on_backend()) return decide_on_backend(d, rule);
    const step_decision decided = decide_on_host(d, rule);
    if (applies(decided)) {
      backend.to_device(state.decision.data(), &decided, 1);
      commit(d);
    }
    return decided;
  }

  /// Whether a decided step is applied: the decision does not skip it, nor the spike guard hold it
  /// (which scores every boundary's loss and norm, skipped or not).
  bool applies(const step_decision& decided) { return progress.guard.judge(decided) == spike::none && !decided.skip; }

  /// Whether the backend decides the step (step_decision.hpp): one rank owning every element,
  /// always; a device backend also across ranks and shards, keeping the overflow flag and norm in
  /// device memory, unless sum_by_shard has the host add the norm by would-be shard in rank order,
  /// or the driver reads the device mid-step anyway (host_decides: 1-bit LAMB).
  bool decides_on_backend() const {
    if (driver_type::host_decides) return false;
    if (comms.comm.size() == 1 && !state.layout->sharded()) return true;
    return Backend::space == memory_space::device && (state.layout->sharded() || !options.sum_by_shard);
  }

  /// The element-wise overflow test and the squared global norm, agreed by every rank, and the
  /// decision they make. Every rank runs every reduction, whatever it found locally.
  step_decision decide_on_host(const step_data<Precision>& d, const step_rule& rule) {
    backend.gradient_norm(d, state.chunk_grad_sums.data());
    wait();
    std::uint8_t nonfinite = std::any_of(state.chunk_nonfinite.begin(), state.chunk_nonfinite.end(),
                                         [](auto b) { return b != 0; });
    double sumsq = counted_sum(state.chunk_grad_sums.data());
    comms.comm.all_reduce(std::span<std::uint8_t>(&nonfinite, 1), reduce_op::max);
    if (compressing()) comms.comm.all_reduce(std::span<double>(&sumsq, 1), reduce_op::sum);
    else sum_norm(sumsq);
    step_decision decided;
    decided.sumsq = sumsq;
    decided.nonfinite = nonfinite;
    rule.decide(decided);
    return decided;
  }

  /// A step that needs nothing before its update (no clipping, no skipping): it commits at once
  /// under a fixed decision, and the update's first pass sums the gradient's squares per chunk as
  /// it reads them (step_data::chunk_grad_sum); the norm, combined across ranks as the partition
  /// says, comes after. A failing collective here throws with the step applied everywhere.
  step_decision commit_then_norm(step_data<Precision>& d, const step_rule& rule) {
    step_decision decided;
    decided.grad_scale = d.grad_scale;
    backend.to_device(state.decision.data(), &decided, 1);
    d.chunk_grad_sum = state.chunk_grad_sums.data();
    commit(d);  // waits: the sums are done
    decided.sumsq = counted_sum(state.chunk_grad_sums.data());
    sum_norm(decided.sumsq);
    rule.decide(decided);
    return decided;
  }

  /// The step decided where the gradients are (a device's memory, or one rank's whole state): the
  /// overflow flag and norm stay there, agreed across ranks, and the update runs behind them.
  step_decision decide_on_backend(step_data<Precision>& d, const step_rule& rule) {
    step_decision decided;
    const bool alone = comms.comm.size() == 1;  // nothing to agree on: the norm's kernel decides too
    if (state.uncounted.empty()) {
      backend.gradient_norm_sums(d, state.chunk_grad_sums.data(), state.decision_sums.data(), alone ? &rule : nullptr,
                                 state.decision.data());
    } else {
      backend.gradient_norm(d, state.chunk_grad_sums.data());
      for (const auto& [c0, c1] : state.uncounted) backend.zero(state.chunk_grad_sums.data() + c0, c1 - c0);  // counted once
      backend.step_sums(state.chunk_grad_sums.data(), state.chunk_nonfinite.data(), state.work.size(),
                        state.decision_sums.data());
    }
    if (!alone) {
      agree_on_backend();
      backend.decide_step(rule, state.decision_sums.data(), state.decision.data());
    }
    if (state.layout->sharded() || progress.guard.on()) {
      // A sharded update has collectives (the norms of a reducing rule, the parameters' way back),
      // which may fail once the moments changed, and the spike guard judges on the host: the host
      // learns the decision first (the one copy a step makes, which the status needs anyway).
      wait_for_collectives(comms.comm);
      backend.to_host(&decided, state.decision.data(), 1);
      if (applies(decided)) commit(d);
    } else {
      // The rule runs behind the decision (a skipped step's passes change nothing), with the
      // coefficients of the groups' next step; the host reads the decision once, after it, and
      // only then is the step committed and do the counters advance.
      run_rule(d, progress.counts.applied + 1, 1);
      wait_for_collectives(comms.comm);
      backend.to_host(&decided, state.decision.data(), 1);  // waits: the parameters are updated on return
      if (!decided.skip) count_applied();
    }
    return decided;
  }

  /// Across ranks, the backend's step sums are agreed where they are: the non-finite chunks (one
  /// rank's overflow skips the step on all) and, where the layout says they add up (a shard each,
  /// or expert groups), the squared norms. Otherwise every rank's norm is already that of the same
  /// all-reduced gradients.
  void agree_on_backend() {
    if (comms.comm.size() == 1) return;
    if constexpr (!stream_communicator<Communicator>) backend.synchronize();  // the sums are done
    double* sums = state.decision_sums.data();
    if (state.layout->summed()) comms.comm.all_reduce(std::span<double>(sums, 2), reduce_op::sum);
    else comms.comm.all_reduce(std::span<double>(sums + 1, 1), reduce_op::sum);
  }

  /// This rank's share of the squared global norm, from per-chunk partial sums the host reads: the
  /// chunks it counts (each element is counted by one rank), added per owner in rank order.
  template <class T>
  double counted_sum(T* partial) {
    for (const auto& [c0, c1] : state.uncounted) std::fill(partial + c0, partial + c1, T(0));
    return state.rank_ordered_sum(state.work, partial, 0, state.work.size());  // the same for any thread count
  }
  /// The squared global norm from every rank's share, where the shares add up.
  void sum_norm(double& sumsq) {
    if (state.layout->summed()) comms.comm.all_reduce(std::span<double>(&sumsq, 1), reduce_op::sum);
  }

  // ── 3. Commit: the counters advance, as the rule's first pass changes the moments ─────────────

  /// An applied step. A collective that fails after this leaves the rest for finish_step().
  void commit(step_data<Precision>& d) {
    count_applied();
    run_rule(d, progress.counts.applied);
    wait();  // the parameters are updated when step() returns
  }

  /// An applied step's counters: the groups', the optimizer's and the scaler's good step.
  void count_applied() {
    for (auto& g : groups()) ++g->step_;
    progress.counts.apply(scaler);
    progress.micro_step = 0;
  }

  // ── 4. Run the rule ───────────────────────────────────────────────────────────────────────────

  /// The schedule's rate (and betas, where it sets them) for a group's step after k applied ones.
  void schedule_rates(typename registry::param_group& g, std::uint64_t k) {
    group_rate(g.options_) = scheduled_rate(*schedule, k, g.base_lr_);
    if constexpr (rule_has_betas) {
      if (const auto betas = scheduled_momentum(*schedule, k)) set_betas(g.options_, *betas);
    }
  }
  template <class O>
  static void set_betas(O& o, const scheduled_betas& b) {
    if constexpr (rule_set<UpdateRule> && std::is_same_v<O, typename UpdateRule::options>) {
      o.visit([&](auto& chosen) { set_betas(chosen, b); });
    } else if constexpr (has_betas<O>) {
      o.beta1 = b.beta1;
      o.beta2 = b.beta2;
    }
  }

  /// The rule's first pass, then what follows it, issued to the backend (the caller waits).
  /// Coefficients are fixed here, so a step finished later is the step that was committed.
  /// `applied`: this step's number among applied steps, which keys stochastic rounding; `ahead`:
  /// how far the step is ahead of the groups' counters (1 where they advance once it is decided).
  void run_rule(step_data<Precision>& d, std::uint64_t applied, std::uint64_t ahead = 0) {
    for (std::size_t g = 0; g < groups().size(); ++g) {
      auto& group = *groups()[g];
      if (schedule) schedule_rates(group, group.step_ + ahead - 1);
      state.coefficients[g] = UpdateRule::prepare(group.options_, group.step_ + ahead);
    }
    d.rounding_key = rounding_key(options.rounding_seed, applied);
    state.gradients = d;
    auto c = driver_context();
    driver.begin(c);
    progress.pending = pending_stage::rule;
    if (options.leave_param_gather_in_flight && Partition::layout::sharded) {
      params_back(leave_in_flight);
      if (progress.pending == pending_stage::params_in_flight) progress.unwaited.reset(state.tensors.size());
    } else {
      params_back(every_tensor);
    }
  }

  // ── 5. Parameters back ────────────────────────────────────────────────────────────────────────

  static constexpr std::size_t leave_in_flight = std::size_t(-2);
  /// Runs what the committed step has left: the driver's stages, then the parameters' way back,
  /// whose gathers may stay in flight (overlap_comm) except those of `tensor` (or every_tensor's).
  void params_back(std::size_t tensor) {
    pending_stage& pending = progress.pending;
    if (pending == pending_stage::none || (tensor == leave_in_flight && pending == pending_stage::params_in_flight))
      return;
    try {
      if (pending == pending_stage::rule) {
        auto c = driver_context();
        driver.finish(c);
        pending = pending_stage::params_back;
      }
      auto c = context();
      if (pending == pending_stage::params_back) {
        exchange.params_back(c);
        pending = pending_stage::params_in_flight;
      }
      if (tensor == leave_in_flight) return;
      exchange.wait_params(c, tensor);
      backend.params_out(data(), tensor);
      if (tensor == every_tensor) pending = pending_stage::none;
    } catch (const error& e) {
      // A gather that failed in flight took the others' results with it: all of them again.
      if (pending == pending_stage::params_in_flight) pending = pending_stage::params_back;
      fail("step ", groups().front()->step_, " is committed on every rank but unfinished: ", e.what(),
           "; the parameters are not all updated yet: step(), save() or finish_step() finishes it");
    }
  }

  // ── 6. Status ─────────────────────────────────────────────────────────────────────────────────

  /// The boundary's status: applied, or skipped for an overflow or a spike (counted here).
  step_status status(step_status& st, const step_decision& decided) {
    st.grad_norm = decided.norm;
    st.loss_z = progress.guard.loss_score();
    st.norm_z = progress.guard.norm_score();
    const spike spiked = progress.guard.verdict();  // none where the decision skips
    if (decided.skip || spiked != spike::none) {
      st.result = decided.skip ? step_result::skipped_nonfinite
                  : spiked == spike::loss ? step_result::skipped_loss_spike
                                          : step_result::skipped_norm_spike;
      st.grad_norm_clipped = decided.norm;
      skip(spiked);
      return reported(st);
    }
    st.result = step_result::applied;
    st.applied = true;
    st.clip_coef = decided.clip;
    st.grad_norm_clipped = decided.norm * decided.clip;
    st.step = groups().front()->step_;
    return reported(st);
  }

  /// A skipped step: an overflow, or what the spike guard found (which the scaler does not see);
  /// throws, changing nothing, if the run cannot go on (step_counts::skip).
  void skip(spike spiked) {
    // Across ranks the window's gradients are already combined in place: an error below ends the
    // window. On one rank it stays open, so a caller that catches can finish the step again.
    if (!exchange.keeps_window(comms.comm.size())) progress.micro_step = 0;
    const bool overflow = spiked == spike::none;
    progress.counts.skip(scaler, options.max_consecutive_skips, [&] {
      if (!overflow) return std::string(spiked == spike::loss ? "a loss spike" : "a gradient norm spike");
      return nonfinite_report(state.work, state.chunk_nonfinite.data(), state.tensors.size(),
                              [&](std::size_t t) -> const std::string& { return tensor_name(t); });
    }, overflow);
    progress.micro_step = 0;
  }

  /// The status's counters, scale and communication fields: what this call handed the communicator.
  step_status& reported(step_status& st) {
    progress.counts.report(st, scaler);
    st.comm_bytes = comms.comm.take_bytes();
    st.comm_ratio = double(st.comm_bytes) / (4.0 * double(state.parameters));
    driver.report(st);
    return st;
  }

  // ── What the stages share ─────────────────────────────────────────────────────────────────────

  /// What the partition's exchange works with in this call.
  context_type context() {
    return {backend, comms.comm, comms.of_group, options, data(), progress.micro_step, send_scale(), compressing()};
  }
  /// What the rule's driver works with: the committed step's gradients and scalars besides.
  rule_context_type driver_context() {
    return {context(), exchange, state.gradients, state.coefficients.data(), groups()};
  }

  /// What gradients are multiplied by before they are summed across ranks.
  float send_scale() const {
    return comms.comm.size() > 1 && !compressing() ? float(1.0 / options.gradient_predivide) : 1.0f;
  }
  /// Whether this step's gradients stay on their rank (the driver's choice: 1-bit LAMB's compression).
  bool compressing() const { return driver_type::local_gradients(groups()); }

  /// Runs f; if a collective in it fails, the window's gradients are lost on every rank (some were
  /// already combined), so the window starts over, and the error goes on.
  template <class F>
  void abandon_window_on_error(F&& f) {
    try {
      f();
    } catch (...) {
      if (!exchange.keeps_window(comms.comm.size())) {
        progress.micro_step = 0;
        exchange.restart_window();
      }
      throw;
    }
  }

  registry& registry_;
};

}  // namespace mpopt::detail
