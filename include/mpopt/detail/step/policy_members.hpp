// mpopt — the optional members of the policies, checked. The optimizer looks for each of these by
// its use (reducing_rule, says_serves, ...) and takes a default where the use is ill-formed; so a
// member that is declared, but with another signature, would silently be a member that is not
// there. Here a member counts as declared by its name alone, whatever its kind, and a declared
// member must be well formed, or compilation stops on a message that names it and its form.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>

#include "../../communicator.hpp"
#include "../../loss_scale.hpp"
#include "../../precision.hpp"
#include "../../rule.hpp"
#include "../../state_precision.hpp"
#include "../exchange/exchange_context.hpp"
#include "../options/field_refs.hpp"
#include "memory_listing.hpp"
#include "../drivers/rule_driver.hpp"
#include "../backend/tensor_side.hpp"

namespace mpopt::detail {

// declares_M<T>: class T has a member named M (a function, template, type or variable, its own or
// inherited). A class derived from T and from a probe with a member M finds M twice, and naming
// an ambiguous member is ill-formed. (A final class cannot be probed, and counts as declaring none.)
#define MPOPT_DETAIL_MEMBER_PROBE(M)                                                                   \
  struct M##_probe {                                                                                   \
    int M;                                                                                             \
  };                                                                                                   \
  template <class T>                                                                                   \
  struct M##_probed : T, M##_probe {};                                                                 \
  template <class T>                                                                                   \
  concept declares_##M = std::is_class_v<T> && !std::is_final_v<T> && !requires { &M##_probed<T>::M; };

MPOPT_DETAIL_MEMBER_PROBE(direction)
MPOPT_DETAIL_MEMBER_PROBE(matrix)
MPOPT_DETAIL_MEMBER_PROBE(matrix_cost)
MPOPT_DETAIL_MEMBER_PROBE(tensor_scale)
MPOPT_DETAIL_MEMBER_PROBE(tensor_state)
MPOPT_DETAIL_MEMBER_PROBE(initial_state)
MPOPT_DETAIL_MEMBER_PROBE(nonnegative_state)
MPOPT_DETAIL_MEMBER_PROBE(driver)
MPOPT_DETAIL_MEMBER_PROBE(sums_gradient)
MPOPT_DETAIL_MEMBER_PROBE(serves)
MPOPT_DETAIL_MEMBER_PROBE(iteration)
MPOPT_DETAIL_MEMBER_PROBE(rounding)
MPOPT_DETAIL_MEMBER_PROBE(state_storage)
MPOPT_DETAIL_MEMBER_PROBE(master_storage)
MPOPT_DETAIL_MEMBER_PROBE(tensor_space)
MPOPT_DETAIL_MEMBER_PROBE(tensor_buffer)
MPOPT_DETAIL_MEMBER_PROBE(list_memory)
MPOPT_DETAIL_MEMBER_PROBE(space)
MPOPT_DETAIL_MEMBER_PROBE(stream)
MPOPT_DETAIL_MEMBER_PROBE(synchronize)
MPOPT_DETAIL_MEMBER_PROBE(workspace_bytes)
MPOPT_DETAIL_MEMBER_PROBE(workspace_purpose)
MPOPT_DETAIL_MEMBER_PROBE(request)
MPOPT_DETAIL_MEMBER_PROBE(start_all_reduce)
MPOPT_DETAIL_MEMBER_PROBE(start_reduce_scatter)
MPOPT_DETAIL_MEMBER_PROBE(start_all_gather)
MPOPT_DETAIL_MEMBER_PROBE(validate)
MPOPT_DETAIL_MEMBER_PROBE(to_json)
#undef MPOPT_DETAIL_MEMBER_PROBE

// Each check is a static_assert of its own, so that the message names the one member at fault.
// (Partitions have no optional members: partition_exchange requires every one.)

template <class R, class Precision, class Partition, class Backend, class Communicator>
consteval bool rule_members_checked() {
  if constexpr (requires { typename R::options; }) {
    static_assert(described<typename R::options> || !declares_to_json<R>,
                  "mpopt: the rule's options declare no `fields` table. A rule's options now declare each field once "
                  "(fields.hpp), and to_json and from_json are no longer used: docs/extending.md, \"Migrating a rule to "
                  "fields\"");
    static_assert(!declares_validate<typename R::options> || validates<typename R::options>,
                  "mpopt: the rule options' member `validate` must be: void validate(std::string_view group) const "
                  "(what involves several fields; each field's own check is in its table)");
  }
  static_assert(!declares_direction<R> || rule_direction<R>,
                "mpopt: the rule's member `direction` must be a stage: "
                "template <class E> static void direction(const scalars& k, E& e)");
  static_assert(!declares_tensor_scale<R> || rule_tensor_scale<R>,
                "mpopt: the rule's member `tensor_scale` must be: "
                "static float tensor_scale(const scalars& k, double norm0, double norm1, double& kept)");
  static_assert(!declares_tensor_state<R> || rule_tensor_state<R>,
                "mpopt: the rule's member `tensor_state` must be: static constexpr std::string_view "
                "tensor_state = \"...\" (the checkpoint key of the value kept per tensor)");
  static_assert(!declares_initial_state<R> || rule_initial_state<R>,
                "mpopt: the rule's member `initial_state` must be: "
                "static float initial_state(const options& o, std::size_t k) (what state buffer k starts at)");
  static_assert(!declares_nonnegative_state<R> || rule_nonnegative_state<R>,
                "mpopt: the rule's member `nonnegative_state` must be: static constexpr std::array<bool, N> "
                "nonnegative_state = {...}; one flag per state buffer (whether it never holds a negative value)");
  static_assert(!declares_matrix<R> || rule_matrix<R>,
                "mpopt: the rule's member `matrix` must be a matrix stage: "
                "template <class M> static float matrix(const scalars& k, M& m) (rule.hpp, matrix_rule)");
  static_assert(!declares_matrix_cost<R> || (rule_matrix_cost<R> && declares_matrix<R>),
                "mpopt: the rule's member `matrix_cost` must be a matrix rule's: "
                "static double matrix_cost(std::size_t rows, std::size_t cols) (rule.hpp, matrix_rule)");
  static_assert(!declares_matrix<R> ||
                    (declares_direction<R> && !declares_tensor_scale<R> && !declares_tensor_state<R>),
                "mpopt: a matrix rule declares `direction` (the stage that writes what its matrix stage receives) "
                "and no per-tensor reduction (`tensor_scale`, `tensor_state`): rule.hpp, matrix_rule");
  static_assert(declares_matrix<R> || (declares_direction<R> == declares_tensor_scale<R> &&
                                        declares_direction<R> == declares_tensor_state<R>),
                "mpopt: a rule with a per-tensor reduction declares all three of `direction`, `tensor_scale` and "
                "`tensor_state` (rule.hpp, reducing_rule); this one declares only some of them");
  static_assert(!declares_driver<R> || names_driver<R, Precision, Partition, Backend, Communicator>,
                "mpopt: the rule's member `driver` must be: template <class Precision, class Partition, class "
                "Backend, class Communicator> using driver = ...; (detail/drivers/rule_driver.hpp)");
  return true;
}

template <class D>
consteval bool driver_members_checked() {
  static_assert(!declares_sums_gradient<D> || says_sums_gradient<D>,
                "mpopt: the driver's member `sums_gradient` must be: static constexpr bool sums_gradient = ...;");
  return true;
}

template <class S, class Grad>
consteval bool scaler_members_checked() {
  static_assert(!declares_serves<S> || says_serves<S, Grad>,
                "mpopt: the loss scaler's member `serves` must be: template <class Grad> static constexpr bool "
                "serves = ...;");
  static_assert(!declares_iteration<S> || counts_iterations<S>,
                "mpopt: the loss scaler's member `iteration` must be: std::int64_t iteration() const (its updates "
                "so far)");
  return true;
}

template <class P>
consteval bool precision_members_checked() {
  static_assert(!declares_rounding<P> || names_rounding<P>,
                "mpopt: the precision's member `rounding` must be a type: using rounding = "
                "mpopt::round_to_nearest; (or mpopt::stochastic_rounding)");
  static_assert(!(declares_state_storage<P> || declares_master_storage<P>) || built_with_state<P>,
                "mpopt: the precision's members `state_storage` and `master_storage` are mpopt::with_state's: "
                "choose the storage with mpopt::with_state<Precision, State, Master>");
  return true;
}

template <class B, class Precision>
consteval bool backend_members_checked() {
  static_assert(!declares_tensor_space<B> || says_tensor_space<B>,
                "mpopt: the backend's member `tensor_space` must be: static constexpr mpopt::memory_space "
                "tensor_space = ...;");
  static_assert(!declares_tensor_buffer<B> || (names_tensor_buffer<B, typename Precision::param_type> &&
                                               names_tensor_buffer<B, typename Precision::grad_type>),
                "mpopt: the backend's member `tensor_buffer` must be: template <class T> using tensor_buffer = ...;");
  static_assert(!declares_list_memory<B> || lists_memory<B>,
                "mpopt: the backend's member `list_memory` must be: std::size_t list_memory(mpopt::memory_report&) "
                "const");
  return true;
}

template <class C>
consteval bool communicator_members_checked() {
  static_assert(!declares_space<C> || says_space<C>,
                "mpopt: the communicator's member `space` must be: static constexpr mpopt::memory_space space = ...;");
  static_assert(!declares_stream<C> || requires(const C& c) { c.stream(); },
                "mpopt: the communicator's member `stream` must be callable on a const communicator: "
                "stream_type stream() const");
  static_assert(!declares_synchronize<C> || synchronizes<C>,
                "mpopt: the communicator's member `synchronize` must be: void synchronize() (waits for its "
                "collectives)");
  static_assert(!declares_workspace_bytes<C> || has_workspace<C>,
                "mpopt: the communicator's member `workspace_bytes` must be: std::size_t workspace_bytes() const");
  static_assert(!declares_workspace_purpose<C> || says_workspace_purpose<C>,
                "mpopt: the communicator's member `workspace_purpose` must be: static constexpr std::string_view "
                "workspace_purpose = \"...\";");
  static_assert(!declares_request<C> || requires { requires collective_request<typename C::request>; },
                "mpopt: the communicator's member `request` must be a default-constructible, movable type with "
                "bool test() and void wait() (communicator.hpp, collective_request)");
  static_assert(!declares_start_all_reduce<C> || requires(C& c, std::span<float> f) {
    { c.start_all_reduce(f, reduce_op::sum) } -> std::same_as<typename C::request>;
  }, "mpopt: the communicator's member `start_all_reduce` must be: template <class T> request "
     "start_all_reduce(std::span<T> data, mpopt::reduce_op op)");
  static_assert(!declares_start_reduce_scatter<C> ||
                    requires(C& c, std::span<const float> in, std::span<float> out, std::span<const std::size_t> n) {
                      { c.start_reduce_scatter(in, out, n, reduce_op::sum) } -> std::same_as<typename C::request>;
                    },
                "mpopt: the communicator's member `start_reduce_scatter` must be: template <class T> request "
                "start_reduce_scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts, "
                "mpopt::reduce_op op)");
  static_assert(!declares_start_all_gather<C> || requires(C& c, std::span<float> f, std::span<const std::size_t> n) {
    { c.start_all_gather(f, n) } -> std::same_as<typename C::request>;
  }, "mpopt: the communicator's member `start_all_gather` must be: template <class T> request "
     "start_all_gather(std::span<T> data, std::span<const std::size_t> counts)");
  static_assert(!(declares_request<C> || declares_start_all_reduce<C> || declares_start_reduce_scatter<C> ||
                  declares_start_all_gather<C>) ||
                    nonblocking_communicator<C>,
                "mpopt: a communicator that leaves collectives in flight declares all of `request`, "
                "`start_all_reduce`, `start_reduce_scatter` and `start_all_gather` (communicator.hpp, "
                "nonblocking_communicator); this one declares only some of them");
  return true;
}

/// Every optional member the optimizer over these policies looks for is absent or well formed.
template <class Precision, class LossScaler, class Partition, class Rule, class Driver, class Backend,
          class Communicator>
inline constexpr bool policy_members_checked =
    precision_members_checked<Precision>() && scaler_members_checked<LossScaler, typename Precision::grad_type>() &&
    rule_members_checked<Rule, Precision, Partition, Backend, Communicator>() && driver_members_checked<Driver>() &&
    backend_members_checked<Backend, Precision>() && communicator_members_checked<Communicator>();

}  // namespace mpopt::detail
