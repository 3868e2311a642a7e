// mpopt — the optimizer: one class template composing precision, loss scaler, partition, update
// rule, backend and communicator policies. A facade: registration is the tensor registry's
// (detail/step/tensor_registry.hpp), and every call goes to the step pipeline (detail/step/step_pipeline.hpp),
// which holds the optimizer's parts as plain structs (detail/step/step_state.hpp) and runs the step's
// stages in order (docs/design.md §2). The policies own their options, state and element math.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>

#include "backend.hpp"
#include "communicator.hpp"
#include "detail/step/memory_listing.hpp"
#include "detail/step/policy_members.hpp"
#include "detail/step/state_access.hpp"
#include "detail/step/step_pipeline.hpp"
#include "detail/step/tensor_registry.hpp"
#include "host.hpp"
#include "loss_scale.hpp"
#include "lr_schedule.hpp"
#include "options.hpp"
#include "partition.hpp"
#include "precision.hpp"
#include "rule.hpp"
#include "status.hpp"
#include "tensor.hpp"

namespace mpopt {

template <precision_policy Precision, loss_scaler_policy LossScaler, class Partition, class UpdateRule,
          class Backend = host, communicator Communicator = single_process>
class optimizer : public detail::tensor_registry<Precision, UpdateRule, Backend> {
  using registry = detail::tensor_registry<Precision, UpdateRule, Backend>;
  using pipeline = detail::step_pipeline<Precision, LossScaler, Partition, UpdateRule, Backend, Communicator>;
  /// The rule's driver: how a committed step runs the rule's stages (detail/drivers/rule_driver.hpp).
  using driver = typename pipeline::driver_type;
  using registry::finalized_;
  static_assert(detail::policy_members_checked<Precision, LossScaler, Partition, UpdateRule, driver, Backend, Communicator>);
  static_assert(scaler_serves<LossScaler, typename Precision::grad_type>,
                "this loss scaler does not serve the precision's gradients: the built-in scalers are for fp16 (use "
                "mpopt::no_scaling with mpopt::fp32 or mpopt::bf16); a scaler of yours declares serves<Grad>");
  static_assert(partition_policy<Partition, Precision, Backend, Communicator>,
                "Partition must model mpopt::partition_policy (partition.hpp): mpopt::replicated, zero1, zero2 or yours, "
                "with a layout whose sharding its exchange shares");
  static_assert(rule_policy<UpdateRule>,
                "UpdateRule must model mpopt::update_rule (rule.hpp; docs/extending.md, \"Writing your own rule\"), or "
                "be a set of rules (mpopt::rules, rules.hpp)");
  static_assert(backend_policy<Backend, Precision>,
                "Backend must model mpopt::backend_policy (backend.hpp): mpopt::host, cuda, offload<host> or yours, "
                "derived from detail::backend_passes (detail/passes/backend_passes.hpp), which gives it every pass");
  static_assert(detail::rule_driver<driver, typename pipeline::rule_context_type>,
                "the rule's driver must model detail::rule_driver (detail/drivers/rule_driver.hpp): derive it from "
                "detail::staged_driver, which gives every hook its default");
  static_assert(detail::host_passes_at_hand<Backend, Precision, UpdateRule>,
                "in the separately compiled mode, an optimizer whose rule or precision is not one compiled once (mpopt's "
                "rules in fp32, fp16 or bf16) compiles its host passes where it is used: include <mpopt/host_passes.hpp> "
                "(docs/install.md, \"Faster builds\")");
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
  static constexpr std::size_t every_tensor = pipeline::every_tensor;  ///< wait_params(): all of them

  /// Under a rule whose driver checks the communicator (1-bit LAMB), the constructor is collective.
  explicit optimizer(options o = {}, scaler_options s = {}, Communicator comm = {})
      : pipeline_(*this, o, s, std::move(comm)) {}
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
    return pipeline_.add_expert_group(o, std::move(replicas));
  }

  /// From the next step on, every group's rate follows `s` (lr_schedule.hpp), from the steps it
  /// has applied and the rate it was given. Throws mpopt::error, changing nothing, on a bad one.
  /// save() records it and load() restores it. After the first step it is collective: every rank
  /// sets the same schedule (before, the first step checks that).
  void set_schedule(const lr_schedule& s) { pipeline_.set_schedule(s); }
  /// The groups keep the rates of their last step from now on (collective as set_schedule).
  void clear_schedule() { pipeline_.set_schedule(std::nullopt); }
  const std::optional<lr_schedule>& schedule() const { return pipeline_.schedule; }

  /// The factor the loss must be multiplied by before backward.
  double loss_scale() const { return pipeline_.scaler.scale(); }
  const LossScaler& scaler() const { return pipeline_.scaler; }
  const options& config() const { return pipeline_.options; }
  /// The backend object: its stream and counters (cuda.hpp); empty for the host backend.
  const Backend& backend() const { return pipeline_.backend; }
  Communicator& communicator() { return pipeline_.comms.comm.inner(); }
  const Communicator& communicator() const { return pipeline_.comms.comm.inner(); }

  /// Allocates the optimizer state and copies parameters into the masters. step() does this on its
  /// first call; calling it earlier fixes the parameter set and surfaces layout errors early. It is
  /// collective: every rank calls it, and all must have registered the same groups and tensors.
  void finalize() { pipeline_.finalize(); }

  /// Tensor i's gradient for this micro-step is complete (call it during backward, as each gradient
  /// is done). Under zero2 (and overlap_comm, in the window's last backward, under every partition)
  /// buckets are reduced as soon as they and all buckets after them are complete: last tensors
  /// first, the order of a backward pass; step() reduces what is left. Otherwise this checks i.
  void grad_ready(std::size_t i) { pipeline_.grad_ready(i); }

  /// Whether tensor i's gradient of this micro-step went out to the other ranks (zero2, and zero1
  /// under overlap_comm), so that its memory may be reused until the next backward writes it.
  /// Buckets go last first: a tensor is done once it and every later tensor sharing its buckets
  /// were reported. Replicated reads every gradient in step(): always false there.
  bool grad_consumed(std::size_t i) const {
    if (!finalized_) {
      const std::size_t n = pipeline_.registered_tensors();
      if (i >= n) detail::fail("there are ", n, " tensors, no tensor ", i);
      return false;
    }
    pipeline_.state.tensor(i);
    return pipeline_.exchange.grad_consumed(i);
  }

  /// One call per backward. Within an accumulation window it folds the gradients into the
  /// accumulator; at the boundary it checks, clips and applies the update. Never silent.
  step_status step() {
    if (pipeline_.progress.guard.needs_loss())
      detail::fail("spike_guard.loss_z = ", config().spike_guard.loss_z, " needs the loss: call step(loss)");
    return pipeline_.step(0.0);
  }
  /// step(), with this micro-batch's loss on this rank for the spike guard (spike_guard_options),
  /// which scores the mean over the window's micro-steps and every rank. Without a loss test the
  /// loss is not used.
  step_status step(double loss) { return pipeline_.step(loss); }

  /// Finishes a step whose last collectives failed. A step is committed once its first pass has
  /// changed the moments; if a collective after that fails (LAMB's per-tensor norms, the
  /// all-gather of updated parameters), step() throws with the parameters not all updated yet.
  /// This runs what is left, on every rank; step(), grad_ready() and save() call it first.
  void finish_step() { pipeline_.finish_step(); }

  /// Under leave_param_gather_in_flight (zero1/zero2 with overlap_comm), step() returns with the
  /// all-gather of the updated parameters still running, so that the next forward overlaps it:
  /// this returns once every parameter (or tensor i's) holds the update. Call it before the forward
  /// reads them: the next grad_ready(), step() or save() throws if a tensor was not waited for.
  /// Otherwise the parameters are updated when step() returns, and this returns at once.
  void wait_params(std::size_t i = every_tensor) { pipeline_.wait_params(i); }

  /// Sets every gradient to zero (for backward passes that add into their gradients).
  void zero_grad() {
    finalize();
    pipeline_.backend.zero_grad(pipeline_.data());
    pipeline_.wait();  // before the next backward writes the gradients
  }

  /// Writes every parameter, master and moment by tensor name, with the scaler, counters, group
  /// options and schedule, to a safetensors file (format: docs/checkpoints.md); of expert groups,
  /// every rank's experts. `where`: a path (a string or std::filesystem::path), or memory: a
  /// std::vector<std::byte>, whose contents the file's bytes replace, or a std::ostream they are
  /// written to (an engine's own checkpoint container). Every rank calls it; rank 0 writes, tensor
  /// by tensor as those held elsewhere are gathered (one at a time), and a failure there throws on
  /// every rank; the other ranks' buffers are emptied. Needs <mpopt/checkpoint.hpp>: a program
  /// that saves nothing compiles none of it.
  template <class Where>
  void save(Where&& where) {
    detail::checkpointing<pipeline>::save(pipeline_, where);
  }
  /// Restores a save()d state, from a path, bytes (anything std::span<const std::byte> is made
  /// from) or a std::istream (read to its end). It must come from an optimizer of the same policies
  /// and the same tensors (names, sizes, groups), saved at any world size. Every rank reads and
  /// checks it; only when all ranks found it good does anything change, otherwise every rank
  /// throws. Needs <mpopt/checkpoint.hpp>.
  template <class From>
  void load(From&& from, load_options lo = {}) {
    detail::checkpointing<pipeline>::load(pipeline_, from, lo);
  }

  /// Every buffer this rank holds for the optimizer, with its size; the user's tensors are listed
  /// too, marked as theirs. State buffers appear once finalize() (or the first step) made them.
  mpopt::memory_report memory_report() const { return detail::memory_report_of(pipeline_); }

  // The state, once finalize() (or the first step) made it; tensors in registration order.
  std::size_t tensor_count() const { return pipeline_.state.tensors.size(); }
  /// The elements of tensor i whose state this rank holds: all of them unless sharded, else
  /// [first, first + count) of the tensor (zero1/zero2 split each tensor across the ranks).
  owned_elements owned(std::size_t i) const { return state_of(i, "owned").owned(i); }
  /// fp32 master weights of tensor i, of its owned(i) elements; for fp32 the parameter itself. A
  /// std::span<const float> where they are stored in fp32, else their values in a std::vector<float>.
  auto master(std::size_t i) const {
    state_of(i, "master");
    return detail::master_values(pipeline_, i);
  }
  /// State buffer k of the rule (UpdateRule::state[k]: adam's 0 is exp_avg, 1 exp_avg_sq; under a
  /// rule set, that of the rule tensor i's group chose) of tensor i, of its owned(i) elements: a
  /// std::span<const float> in fp32 state, else a std::vector<float>.
  auto moment(std::size_t k, std::size_t i) const {
    state_of(i, "moment");
    pipeline_.check_moment(k, i);
    return detail::moment_values(pipeline_, k, i);
  }

  /// What a reducing rule keeps per tensor (UpdateRule::tensor_state), from the last applied step,
  /// in registration order: LAMB's trust ratios (1-bit LAMB's compression stage: the frozen
  /// coefficient times the factor).
  std::span<const double> tensor_state() const
    requires requires(const driver& d) { d.tensor_state(); }
  {
    return pipeline_.driver.tensor_state();
  }
  /// LAMB's name for tensor_state() (DeepSpeed's get_lamb_coeffs()).
  std::span<const double> lamb_coeffs() const
    requires requires(const driver& d) { d.tensor_state(); }
  {
    return pipeline_.driver.tensor_state();
  }
  /// 1-bit LAMB with more than one rank: the compressed all-reduce, with this rank's error buffers.
  decltype(auto) compression() const
    requires requires(const driver& d) { d.compression(); }
  {
    return pipeline_.driver.compression();
  }
  /// The compressing rules: tensor i's exp_avg_mask, as DeepSpeed's. Where mask[k] is 0, element
  /// k's average (1-bit Adam's and 1-bit LAMB's momentum, 0/1 Adam's gradient and accumulator) is
  /// taken as 0: for elements whose gradient is always 0, which a 1-bit code cannot carry. Values 0
  /// or 1, the same on every rank: collective (it finalizes, and a step in flight finishes first).
  /// Checkpoints do not keep it (nor do DeepSpeed's): set it again after load().
  void set_exp_avg_mask(std::size_t i, std::span<const float> mask)
    requires requires(driver& d) { d.set_exp_avg_mask(i, mask); }
  {
    detail::set_exp_avg_mask(pipeline_, i, mask);
  }

 private:
  /// The state, for accessor `accessor` of tensor i: it exists once finalize() made it.
  const auto& state_of(std::size_t i, const char* accessor) const {
    detail::require_state(finalized_, accessor, i, pipeline_.registered_tensors());
    pipeline_.state.tensor(i);
    return pipeline_.state;
  }

  pipeline pipeline_;
};

}  // namespace mpopt
