// mpopt — a rule's driver: how the update of a committed step runs the rule's stages, and what the
// rule keeps besides its per-element state. Almost every rule takes the default, staged_driver: its
// stages as passes, split at the per-tensor reduction. A rule whose step is not a fixed chain of
// passes (1-bit LAMB: warm-up, then a compressed exchange of the momentum) names its own,
//   template <class Precision, class Partition, class Backend, class Communicator> using driver = ...;
// and the optimizer calls it through the same vocabulary:
//   D::host_decides            the host makes each step's decision (the driver reads the device mid-step)
//   D::sums_gradient           (optional) begin()'s first pass sums the gradient's squares when the step
//                              data asks (step_data::chunk_grad_sum): then a step that needs nothing
//                              before its update makes no separate gradient pass
//   D::preflight(comm)         at construction: checks the communicator (collectively, if it checks)
//   D::check_groups(groups)    at finalize, on every rank: what must agree across groups; throws
//   d.allocate(c), d.started(c)  its buffers at finalize; after the state is initialized
//   D::local_gradients(groups) whether this step's gradients stay on their rank, each standing for
//                              the combined one (the partition then neither sums nor averages them)
//   D::replicas_differ(groups) whether the ranks' parameters and state have parted (0/1 Adam's
//                              local steps): checkpoints then hold every rank's copy
//   d.begin(c)                 the update's first pass: the step is committed once it ran
//   d.finish(c)                what is left (reductions, exchanges, the last pass); run again if it threw
//   d.report(status)           what the step status says of it
//   d.list_memory(report)      its buffers; returns its bookkeeping bytes
//   checkpoints: D::for_each_kept(d, f) (per-tensor values by name), d.check_saved(...),
//   d.restore(...), d.for_each_extra(world, f), d.save_extra(...); and d.describe(world), the
//   metadata it adds, where it adds any (the compressing drivers)
// The concept rule_driver below checks that vocabulary over the optimizer's own context.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>

#include <nlohmann/json_fwd.hpp>  // the checkpoint hooks' types, defined where checkpoints are

#include "../../memory_report.hpp"
#include "../../options.hpp"
#include "../../rule.hpp"
#include "../../status.hpp"
#include "../passes/step_data.hpp"

namespace mpopt::detail {

class state_reader;

/// What a driver works with during one call: the partition's context (backend, communicator,
/// options, the step's buffers), and the committed step's gradients, scalars and groups.
template <class Exchange, class Scalars, class Groups>
struct rule_context : Exchange::context {
  using precision = typename Exchange::context::precision;

  Exchange& exchange;
  /// Where the committed step reads its gradients (the partition's boundary), with the state.
  step_data<precision> gradients;
  const Scalars* scalars;  ///< per group, fixed at commit
  const Groups& groups;    ///< the parameter groups: options() and step() of each

  /// Per-tensor partial sums (of squares), combined across ranks as the partition says.
  void sum_partials(std::span<double> sums) { exchange.sum_partials(*this, sums); }
  /// Whether sum_partials combines anything: a shard's partials are its rank's share.
  static constexpr bool partials_across_ranks = Exchange::sharded;
};

template <class Rule, class Precision, class Backend, class Communicator>
class staged_driver;
/// A matrix rule's (rule.hpp, matrix_rule), defined in <mpopt/matrix_rule.hpp>, which such a rule includes.
template <class Rule, class Precision, class Backend, class Communicator>
class matrix_driver;

/// Rule names a driver of its own for these policies.
template <class Rule, class Precision, class Partition, class Backend, class Communicator>
concept names_driver = requires { typename Rule::template driver<Precision, Partition, Backend, Communicator>; };

/// The driver of Rule: its own if it names one, else the matrix driver for a matrix rule, else the
/// staged passes.
template <class Rule, class Precision, class Partition, class Backend, class Communicator>
struct driver_of {
  using type = staged_driver<Rule, Precision, Backend, Communicator>;
};
template <class Rule, class Precision, class Partition, class Backend, class Communicator>
  requires names_driver<Rule, Precision, Partition, Backend, Communicator>
struct driver_of<Rule, Precision, Partition, Backend, Communicator> {
  using type = typename Rule::template driver<Precision, Partition, Backend, Communicator>;
};
template <class Rule, class Precision, class Partition, class Backend, class Communicator>
  requires(!names_driver<Rule, Precision, Partition, Backend, Communicator> && matrix_rule<Rule>)
struct driver_of<Rule, Precision, Partition, Backend, Communicator> {
  using type = matrix_driver<Rule, Precision, Backend, Communicator>;
};
template <class Rule, class Precision, class Partition, class Backend, class Communicator>
using driver_of_t = typename driver_of<Rule, Precision, Partition, Backend, Communicator>::type;

/// Stand-ins for what the checkpoints (checkpoint.hpp) hand a driver: f(key, values) per value kept
/// per tensor, f(key, elements) per extra tensor, and read(key, first, dst, count, on_device).
struct kept_visitor {
  template <class T>
  void operator()(std::string key, const T* values) const;
};
struct extra_visitor {
  void operator()(std::string key, std::size_t elements) const;
};
struct saved_reader {
  template <class T>
  void operator()(const std::string& key, std::size_t first, T* dst, std::size_t count, bool on_device) const;
};

/// A rule's driver D, as the optimizer (step_pipeline.hpp), its checkpoints (checkpoint.hpp) and
/// its memory report (memory_listing.hpp) call it, over Context: what the optimizer hands it in a
/// call (rule_context, with its backend, communicator and groups).
template <class Context>
using context_groups_t = decltype(std::declval<Context&>().groups);
template <class Context>
using context_comm_t = decltype(std::declval<Context&>().comm);
template <class Context>
using context_backend_t = decltype(std::declval<Context&>().backend);

template <class D, class Context>
concept rule_driver =
    std::default_initializable<D> && std::default_initializable<typename D::saved> &&
    requires(D& d, const D& cd, Context& c, context_groups_t<Context> groups, context_comm_t<Context> comm,
             context_backend_t<Context> backend, step_status& status, memory_report& report, typename D::saved& saved,
             const nlohmann::json& meta, const state_reader& reader, const std::string& where,
             const load_options& lo, std::span<const std::size_t> sizes,
             const std::function<void(std::span<const std::byte>)>& write) {
      // What the step asks of it: who decides, whether gradients stay on their rank, whether the
      // ranks' replicas have parted.
      { D::host_decides } -> std::convertible_to<bool>;
      { D::local_gradients(groups) } -> std::convertible_to<bool>;
      { D::replicas_differ(groups) } -> std::convertible_to<bool>;

      // Set-up: at construction, at finalize, once the state is initialized.
      D::preflight(comm);
      D::check_groups(groups);
      d.allocate(c);
      d.started(c);

      // A committed step: its first pass, then the rest; the status; the memory report.
      d.begin(c);
      d.finish(c);
      d.report(status);
      { cd.list_memory(report) } -> std::convertible_to<std::size_t>;

      // Checkpoints: values kept per tensor, the file's record checked, extra tensors, restore.
      D::for_each_kept(d, kept_visitor{});
      {
        d.check_saved(meta, reader, where, lo, std::uint64_t{}, int{}, sizes)
      } -> std::convertible_to<typename D::saved>;
      d.for_each_extra(int{}, extra_visitor{});
      d.save_extra(comm, backend, write);
      d.restore(saved, comm, saved_reader{});
    };

/// Driver D says whether begin() sums the gradient's squares.
template <class D>
concept says_sums_gradient = requires {
  { D::sums_gradient } -> std::same_as<const bool&>;
};

/// D::sums_gradient, or false for a driver that does not say.
template <class D>
constexpr bool sums_gradient_v = [] {
  if constexpr (says_sums_gradient<D>) return D::sums_gradient;
  else return false;
}();

}  // namespace mpopt::detail
