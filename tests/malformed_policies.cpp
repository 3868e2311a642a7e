// Policies that declare an optional member with the wrong form (detail/step/policy_members.hpp), and
// raw pointers given where add() takes a tensor. Each must stop compilation on the message after its
// `expect:` (several are separated by |), raised from its own line; built with MALFORMED_FIXED, each
// is mended and the file must compile cleanly.
// tests/compile_fail.py checks both; nothing here is run.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include <mpopt/any_optimizer.hpp>
#include <mpopt/mpopt.hpp>

#include "blocking_communicator.hpp"
#include "either.hpp"


namespace {

template <class Precision = mpopt::fp16, class Scaler = mpopt::dynamic_scale, class Rule = mpopt::adam,
          class Backend = mpopt::host, class Communicator = mpopt::single_process>
using optimizer = mpopt::optimizer<Precision, Scaler, mpopt::replicated, Rule, Backend, Communicator>;

// ---------------------------------------------------------------- rules

/// A per-tensor trust ratio over SGD (LARS without momentum): the three reduction members.
struct trust_sgd {
  struct options {
    double lr = 0.1;
    static constexpr auto fields = mpopt::fields(mpopt::field{"lr", &options::lr, mpopt::checks::rate});
    void validate(std::string_view) const {}
  };
  static constexpr std::string_view name = "trust_sgd";
  static constexpr std::array<std::string_view, 0> state = {};
  struct scalars {
    float lr;
  };
  static scalars prepare(const options& o, std::uint64_t) { return {float(o.lr)}; }
  template <class E>
  static void direction(const scalars&, E& e) {
    e.norm(0, e.param());
    e.norm(1, e.grad());
  }
  static constexpr std::string_view tensor_state = "trust_ratio";
  static float tensor_scale(const scalars&, double w, double g, double& kept) {
    kept = w > 0 && g > 0 ? w / g : 1.0;
    return float(kept);
  }
  template <class E>
  static void update(const scalars& k, E& e) {
    using V = typename E::vec;
    e.set_param(e.param() - V(k.lr) * e.tensor_scale() * e.grad());
  }
};

/// A rule written before options declared fields: to_json and from_json, no table.
struct options_as_json : trust_sgd {
  struct options {
    double lr = 0.1;
#ifdef MALFORMED_FIXED
    static constexpr auto fields = mpopt::fields(mpopt::field{"lr", &options::lr});
#endif
  };
  static scalars prepare(const options& o, std::uint64_t) { return {float(o.lr)}; }
#ifndef MALFORMED_FIXED
  static std::string to_json(const options&) { return "{}"; }
#endif
};
struct validate_not_const : trust_sgd {
  struct options {
    double lr = 0.1;
    static constexpr auto fields = mpopt::fields(mpopt::field{"lr", &options::lr});
    void validate(std::string_view) EITHER(, const) {}
  };
  static scalars prepare(const options& o, std::uint64_t) { return {float(o.lr)}; }
};
struct scale_returns_double : trust_sgd {
  static EITHER(double, float) tensor_scale(const scalars&, double, double, double& kept) { return float(kept = 1); }
};
struct direction_without_scalars : trust_sgd {
  template <class E>
  static void direction(EITHER(E&, const scalars&, E&)) {}
};
struct state_not_a_name : trust_sgd {
  static constexpr EITHER(int, std::string_view) tensor_state = EITHER(1, "trust");
};
/// A starting value that takes no options: every group would start alike, whatever its options say.
struct initial_state_without_options : mpopt::adam {
  static float initial_state(EITHER(std::size_t, const options&, std::size_t)) { return 0.1f; }
};
/// One flag for Adam's two state buffers.
struct nonnegative_state_too_short : mpopt::adam {
  static constexpr std::array<bool, EITHER(1, 2)> nonnegative_state = {};
};
struct direction_alone : mpopt::adam {
  template <class E>
  static void EITHER(direction, direction_of_mine)(const scalars&, E&) {}
};
struct driver_not_a_template : mpopt::onebit_lamb {
#ifdef MALFORMED_FIXED
  template <class P, class Partition, class B, class C>
  using driver = mpopt::detail::onebit_lamb_driver<mpopt::onebit_lamb, P, Partition, B, C>;
#else
  using driver = mpopt::detail::onebit_lamb_driver<mpopt::onebit_lamb, mpopt::fp16, mpopt::replicated, mpopt::host,
                                                   mpopt::single_process>;
#endif
};

/// 1-bit LAMB under a driver of its own that says sums_gradient in the wrong form.
template <class P, class Partition, class B, class C>
struct driver_with_sums_function : mpopt::detail::onebit_lamb_driver<mpopt::onebit_lamb, P, Partition, B, C> {
  static EITHER(bool sums_gradient(), constexpr bool sums_gradient = false);
};
struct sums_gradient_function : mpopt::onebit_lamb {
  template <class P, class Partition, class B, class C>
  using driver = driver_with_sums_function<P, Partition, B, C>;
};

/// LAMB under a staged driver that hides finish(): the stages after the per-tensor norms would never run.
template <class Rule, class P, class B, class C>
struct driver_without_finish : mpopt::detail::staged_driver<Rule, P, B, C> {
#ifndef MALFORMED_FIXED
 private:
  using mpopt::detail::staged_driver<Rule, P, B, C>::finish;
#endif
};
struct finish_hidden : mpopt::lamb {
  template <class P, class Partition, class B, class C>
  using driver = driver_without_finish<finish_hidden, P, B, C>;
};

// ---------------------------------------------------------------- scalers and precisions

struct serves_not_a_template : mpopt::dynamic_scale {
  EITHER(static constexpr bool serves = true, template <class Grad> static constexpr bool serves = true);
};
struct iteration_a_number : mpopt::dynamic_scale {
  EITHER(std::int64_t iteration = 0, std::int64_t iteration() const { return 0; });
};
struct rounding_a_value {
  using param_type = mpopt::half;
  using grad_type = mpopt::half;
  using accumulate_type = float;
  using communicate_type = float;
  static constexpr bool has_master = true;
  static constexpr std::string_view name = "fp16";
  EITHER(static constexpr int rounding = 0, using rounding = mpopt::round_to_nearest);
};
/// A storage declared by hand, not with with_state (whose checks it would skip).
struct state_by_hand : mpopt::fp16 {
  using state_storage = mpopt::bf16_state<>;
};

// ---------------------------------------------------------------- backends

struct tensor_space_a_type : mpopt::host {
  EITHER(struct tensor_space{}, static constexpr mpopt::memory_space tensor_space = mpopt::memory_space::host);
};
struct tensor_buffer_not_a_template : mpopt::host {
  EITHER(using tensor_buffer = mpopt::host::buffer<float>, template <class T> using tensor_buffer = buffer<T>);
};
struct list_memory_not_const : mpopt::host {
  std::size_t list_memory(mpopt::memory_report&) EITHER(, const) { return 0; }
};

/// The host backend hiding params_out(): the optimizer could not hand the model its parameters.
struct params_out_hidden : mpopt::host {
#ifndef MALFORMED_FIXED
 private:
  using mpopt::host::params_out;
#endif
};

// ---------------------------------------------------------------- communicators

struct space_a_number : mpopt::single_process {
  static constexpr EITHER(int, mpopt::memory_space) space = EITHER(0, mpopt::memory_space::host);
};
struct stream_not_const : mpopt::single_process {
  int stream() EITHER(, const) { return 0; }
};
struct synchronize_with_argument : mpopt::single_process {
  void synchronize(EITHER(int, )) {}
};
struct workspace_not_const : mpopt::single_process {
  std::size_t workspace_bytes() EITHER(, const) { return 0; }
};
struct workspace_purpose_a_number : mpopt::single_process {
  static constexpr EITHER(int, std::string_view) workspace_purpose = EITHER(0, "scratch");
};
struct request_without_starts : blocking_communicator {
  struct request {
    bool test() { return true; }
    void wait() {}
  };
  EITHER(, template <class T> request start_all_reduce(std::span<T>, mpopt::reduce_op) { return {}; })
  EITHER(, template <class T> request start_reduce_scatter(std::span<const T>, std::span<T>,
                                                           std::span<const std::size_t>, mpopt::reduce_op) {
    return {};
  })
  EITHER(, template <class T> request start_all_gather(std::span<T>, std::span<const std::size_t>) { return {}; })
};
struct request_without_test : blocking_communicator {
  struct request {
    EITHER(, bool test() { return true; })
    void wait() {}
  };
  template <class T>
  request start_all_reduce(std::span<T>, mpopt::reduce_op) { return {}; }
  template <class T>
  request start_reduce_scatter(std::span<const T>, std::span<T>, std::span<const std::size_t>, mpopt::reduce_op) {
    return {};
  }
  template <class T>
  request start_all_gather(std::span<T>, std::span<const std::size_t>) { return {}; }
};
struct all_reduce_without_op : mpopt::single_process {
  template <class T>
  request start_all_reduce(std::span<T> EITHER(, , mpopt::reduce_op)) { return {}; }
};
struct reduce_scatter_without_counts : mpopt::single_process {
  template <class T>
  request start_reduce_scatter(std::span<const T>, std::span<T>, EITHER(, std::span<const std::size_t>, )
                               mpopt::reduce_op) {
    return {};
  }
};
struct all_gather_returning_void : mpopt::single_process {
  template <class T>
  EITHER(void, request) start_all_gather(std::span<T>, std::span<const std::size_t>) { EITHER(, return {};) }
};

}  // namespace

// ---------------------------------------------------------------- tensors

// A raw pointer where add() takes a tensor; mended, with its length. The typed optimizer's groups
// and any_optimizer's alike (other element types: each message is given once per type).
void add_raw_pointers(optimizer<>::param_group& g, mpopt::any_optimizer::param_group& erased, mpopt::half* p,
                      mpopt::half* grad, float* p32, float* grad32) {
  g.add(p, grad, EITHER(, 4, ) "w");  // expect: a raw pointer is not a tensor (it has no length): add(param_ptr, grad_ptr, n, name
  erased.add(p32, grad32, EITHER(, 4, ) "w");  // expect: a raw pointer is not a tensor
  g.add(p, EITHER("w", 4));  // expect: add(param_ptr, n, name[, shape]) (the optimizer holds the gradient)
}

// clang-format off
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, options_as_json>));  // expect: declare no `fields` table | must model mpopt::update_rule
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, validate_not_const>));  // expect: the rule options' member `validate` must be
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, scale_returns_double>));  // expect: the rule's member `tensor_scale` must be
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, direction_without_scalars>));  // expect: the rule's member `direction` must be
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, state_not_a_name>));  // expect: the rule's member `tensor_state` must be
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, initial_state_without_options>));  // expect: the rule's member `initial_state` must be
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, nonnegative_state_too_short>));  // expect: the rule's member `nonnegative_state` must be
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, direction_alone>));  // expect: declares all three of `direction`, `tensor_scale` and `tensor_state`
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, driver_not_a_template>));  // expect: the rule's member `driver` must be
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, sums_gradient_function>));  // expect: the driver's member `sums_gradient` must be
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, finish_hidden>));  // expect: the rule's driver must model detail::rule_driver
static_assert(sizeof(optimizer<mpopt::fp16, serves_not_a_template>));  // expect: the loss scaler's member `serves` must be
static_assert(sizeof(optimizer<mpopt::fp16, iteration_a_number>));  // expect: the loss scaler's member `iteration` must be
static_assert(sizeof(optimizer<rounding_a_value>));  // expect: the precision's member `rounding` must be
static_assert(sizeof(optimizer<EITHER(state_by_hand, mpopt::with_state<mpopt::fp16, mpopt::bf16_state<>>)>));  // expect: the precision's members `state_storage` and `master_storage` are mpopt::with_state's
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, tensor_space_a_type>));  // expect: the backend's member `tensor_space` must be
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, tensor_buffer_not_a_template>));  // expect: the backend's member `tensor_buffer` must be
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, list_memory_not_const>));  // expect: the backend's member `list_memory` must be
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, params_out_hidden>));  // expect: Backend must model mpopt::backend_policy
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, mpopt::host, space_a_number>));  // expect: the communicator's member `space` must be
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, mpopt::host, stream_not_const>));  // expect: the communicator's member `stream` must be
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, mpopt::host, synchronize_with_argument>));  // expect: the communicator's member `synchronize` must be
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, mpopt::host, workspace_not_const>));  // expect: the communicator's member `workspace_bytes` must be
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, mpopt::host, workspace_purpose_a_number>));  // expect: the communicator's member `workspace_purpose` must be
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, mpopt::host, request_without_starts>));  // expect: leaves collectives in flight
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, mpopt::host, request_without_test>));  // expect: the communicator's member `request` must be | leaves collectives in flight
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, mpopt::host, all_reduce_without_op>));  // expect: the communicator's member `start_all_reduce` must be | leaves collectives in flight
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, mpopt::host, reduce_scatter_without_counts>));  // expect: the communicator's member `start_reduce_scatter` must be | leaves collectives in flight
static_assert(sizeof(optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, mpopt::host, all_gather_returning_void>));  // expect: the communicator's member `start_all_gather` must be | leaves collectives in flight
// State precisions their parameters or rule cannot have.
static_assert(sizeof(optimizer<mpopt::with_state<EITHER(mpopt::fp16, mpopt::bf16), mpopt::fp32_state, mpopt::remainder16>, mpopt::no_scaling>));  // expect: mpopt::remainder16 completes bf16 parameters
static_assert(sizeof(optimizer<mpopt::with_state<EITHER(mpopt::fp32, mpopt::bf16), mpopt::fp32_state, mpopt::remainder16>, mpopt::no_scaling>));  // expect: fp32 parameters are their own master | mpopt::remainder16 completes bf16 parameters
static_assert(sizeof(optimizer<mpopt::with_state<EITHER(mpopt::bf16, mpopt::bf16_stochastic), mpopt::fp32_state, mpopt::no_master>, mpopt::no_scaling>));  // expect: mpopt::no_master rounds every update into the 16-bit parameter
static_assert(sizeof(optimizer<mpopt::with_state<mpopt::bf16, EITHER(mpopt::bf16_state<>, mpopt::fp32_state)>, mpopt::no_scaling, mpopt::onebit_lamb>));  // expect: a compressing rule's passes read and write its state and master in fp32
// clang-format on
