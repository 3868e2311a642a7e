// mpopt — make_optimizer: the optimizer a DeepSpeed configuration describes (deepspeed_config.hpp),
// as an mpopt::any_optimizer (any_optimizer.hpp). This header instantiates every combination a
// configuration can name, on the host backend and the communicator given:
//   precision fp32 | fp16 with a static scale | fp16 with a dynamic scale | bf16
//   x ZeRO stage 0 | 1 | 2  x  Adam/AdamW | Lamb,   plus OneBitLamb, OneBitAdam and ZeroOneAdam
//   (stage 0) in each precision.
// That is most of an optimizer's compile time, 36 times over: include it in one translation unit
// and the rest of the program includes any_optimizer.hpp only. In the separately compiled mode the
// 36 over one process are compiled once per program instead (src_optimizers.hpp).
// make_optimizer_as<Precision, Scaler, Partition, Rule>(c) builds one type instead, which the
// configuration must agree with: the way to types it cannot name (a state precision, a rounding).
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "adam.hpp"
#include "any_optimizer.hpp"
#include "checkpoint.hpp"
#include "communicator.hpp"
#include "deepspeed_config.hpp"
#include "detail/config.hpp"
#include "host.hpp"
#include "lamb.hpp"
#include "loss_scale.hpp"
#include "onebit_adam.hpp"
#include "onebit_lamb.hpp"
#include "optimizer.hpp"
#include "partition.hpp"
#include "precision.hpp"
#include "zero_one_adam.hpp"

namespace mpopt {

namespace detail {

/// The names of Rule's rules: its own, or a set's members'.
template <class Rule>
std::span<const std::string_view> rule_choices() {
  if constexpr (rule_set<Rule>) {
    return Rule::options::choices;
  } else {
    static constexpr std::array<std::string_view, 1> one = {Rule::name};
    return one;
  }
}
/// Sets the field of o that `field` selects to `value`; false where o's rule has no such field.
template <class O, class F>
bool apply_setting(O& o, double value, F field) {
  auto set = [&](auto& m) {
    if constexpr (std::is_invocable_v<F, decltype(m)>) {
      field(m) = value;
      return true;
    } else {
      return false;
    }
  };
  if constexpr (chooses_fields<O>) return o.visit(set);
  else return set(o);
}

/// any_optimizer's interface over one mpopt::optimizer. New groups take `defaults` (the
/// configuration's rule options) with the group_settings applied.
template <class Precision, class Scaler, class Partition, class Rule, class Backend, class Communicator>
class erased_optimizer final : public optimizer_interface {
  using opt_type = optimizer<Precision, Scaler, Partition, Rule, Backend, Communicator>;
  using param_t = typename opt_type::param_type;
  using grad_t = typename opt_type::grad_type;
  using group_options = typename opt_type::group_options;

 public:
  /// `defaults`: each rule's options, in the order of rule_choices<Rule>.
  erased_optimizer(Communicator&& comm, const optimizer_options& o, const typename Scaler::options& s,
                   std::vector<group_options> defaults)
      : opt_(std::move(comm), o, s), defaults_(std::move(defaults)) {}

  std::size_t add_group(const group_settings& s) override {
    opt_.add_group(options_for(s));
    return opt_.group_count() - 1;
  }
  MPOPT_COLD std::size_t add_flat_group(const group_settings& s, std::span<const tensor_spec> tensors) override {
    opt_.add_flat_group(options_for(s), tensors);
    return opt_.group_count() - 1;
  }
  MPOPT_COLD void add(std::size_t g, erased_tensor param, erased_tensor grad, std::string name,
                      tensor_shape shape) override {
    auto& group = opt_.group(g);
    name = group.next_name(std::move(name));
    check_type(name, "parameter", param.type, element_type_of<param_t>);
    check_type(name, "gradient", grad.type, element_type_of<grad_t>);
    group.add(view<param_t>{static_cast<param_t*>(param.data), param.size, param.space},
              view<grad_t>{static_cast<grad_t*>(grad.data), grad.size, grad.space}, std::move(name), std::move(shape));
  }
  MPOPT_COLD erased_tensor add(std::size_t g, erased_tensor param, std::string name, tensor_shape shape) override {
    auto& group = opt_.group(g);
    name = group.next_name(std::move(name));
    check_type(name, "parameter", param.type, element_type_of<param_t>);
    const auto grad = group.add(static_cast<param_t*>(param.data), param.size, std::move(name), std::move(shape));
    return erase(view<grad_t>{grad.data(), grad.size(), detail::tensor_space_of<Backend>()});
  }
  std::size_t group_count() const override { return opt_.group_count(); }
  std::size_t group_size(std::size_t g) const override { return group(g).size(); }
  const std::string& tensor_name(std::size_t g, std::size_t i) const override { return group(g).name(i); }
  erased_tensor param(std::size_t g, std::size_t i) override {
    const auto s = opt_.group(g).param(i);
    return erase(view<param_t>{s.data(), s.size(), detail::tensor_space_of<Backend>()});
  }
  erased_tensor grad(std::size_t g, std::size_t i) override {
    const auto s = opt_.group(g).grad(i);
    return erase(view<grad_t>{s.data(), s.size(), detail::tensor_space_of<Backend>()});
  }
  double lr(std::size_t g) const override { return group(g).lr(); }
  void set_lr(std::size_t g, double lr) override { opt_.group(g).set_lr(lr); }
  std::uint64_t group_step(std::size_t g) const override { return group(g).step(); }

  void finalize() override { opt_.finalize(); }
  void grad_ready(std::size_t i) override { opt_.grad_ready(i); }
  bool grad_consumed(std::size_t i) const override { return opt_.grad_consumed(i); }
  step_status step() override { return opt_.step(); }
  step_status step(double loss) override { return opt_.step(loss); }
  void finish_step() override { opt_.finish_step(); }
  void wait_params(std::size_t i) override { opt_.wait_params(i); }
  void zero_grad() override { opt_.zero_grad(); }

  MPOPT_COLD void set_schedule(const lr_schedule& s) override { opt_.set_schedule(s); }
  void clear_schedule() override { opt_.clear_schedule(); }
  const std::optional<lr_schedule>& schedule() const override { return opt_.schedule(); }

  double loss_scale() const override { return opt_.loss_scale(); }
  const optimizer_options& config() const override { return opt_.config(); }
  MPOPT_COLD std::string policies() const override {
    std::string s;
    for (std::string_view n :
         {Precision::name, Scaler::name, Partition::name, Rule::name, Backend::name, Communicator::name})
      s += (s.empty() ? "" : ", ") + std::string(n);
    return s;
  }
  element_type param_type() const override { return element_type_of<param_t>; }
  element_type grad_type() const override { return element_type_of<grad_t>; }
  std::size_t tensor_count() const override {
    std::size_t n = 0;
    for (std::size_t g = 0; g < opt_.group_count(); ++g) n += group(g).size();
    return n;
  }
  std::span<const float> master(std::size_t i) const override { return opt_.master(i); }
  owned_elements owned(std::size_t i) const override { return opt_.owned(i); }
  mpopt::memory_report memory_report() const override { return opt_.memory_report(); }
  void save(const std::filesystem::path& path) override { opt_.save(path); }
  void save(std::vector<std::byte>& bytes) override { opt_.save(bytes); }
  void save(std::ostream& out) override { opt_.save(out); }
  void load(const std::filesystem::path& path, load_options o) override { opt_.load(path, o); }
  void load(std::span<const std::byte> bytes, load_options o) override { opt_.load(bytes, o); }
  void load(std::istream& in, load_options o) override { opt_.load(in, o); }
  void* target(const std::type_info& t) override { return t == typeid(opt_type) ? &opt_ : nullptr; }

 private:
  /// The optimizer's group() is not const; its groups are.
  const typename opt_type::param_group& group(std::size_t g) const { return const_cast<opt_type&>(opt_).group(g); }

  /// The defaults of the rule `s` names, with its settings.
  MPOPT_COLD group_options options_for(const group_settings& s) const {
    const auto names = rule_choices<Rule>();
    std::size_t k = 0;
    if (s.rule) k = find_choice(names, *s.rule, "group_settings.rule");
    group_options o = defaults_[k];
    auto set = [&](const char* name, const std::optional<double>& value, auto field) {
      if (value && !apply_setting(o, *value, field))
        fail("group_settings.", name, ": ", names[k], " has no ", name);
    };
    set("lr", s.lr, [](auto& m) -> decltype((m.lr)) { return m.lr; });
    set("weight_decay", s.weight_decay, [](auto& m) -> decltype((m.weight_decay)) { return m.weight_decay; });
    set("beta1", s.beta1, [](auto& m) -> decltype((m.beta1)) { return m.beta1; });
    set("beta2", s.beta2, [](auto& m) -> decltype((m.beta2)) { return m.beta2; });
    set("eps", s.eps, [](auto& m) -> decltype((m.eps)) { return m.eps; });
    return o;
  }

  static void check_type(const std::string& name, std::string_view what, element_type got, element_type want) {
    if (got != want)
      fail("tensor '", name, "': its ", what, " holds ", to_string(got), " elements, but the optimizer trains in ",
           Precision::name, ", whose ", what, "s are ", to_string(want));
  }

  opt_type opt_;
  std::vector<group_options> defaults_;
};

/// The options a configuration gives Rule's groups and Scaler.
template <class Rule>
typename Rule::options rule_options_in(const deepspeed_config& c) {
  if constexpr (std::is_same_v<Rule, adam>) return c.adam_options;
  else if constexpr (std::is_same_v<Rule, lamb>) return c.lamb_options;
  else if constexpr (std::is_same_v<Rule, onebit_lamb>) return c.onebit_lamb_options;
  else if constexpr (std::is_same_v<Rule, onebit_adam>) return c.onebit_adam_options;
  else if constexpr (std::is_same_v<Rule, zero_one_adam>) return c.zero_one_adam_options;
  else return {};  // a rule no configuration names: its own defaults
}
/// The options of each rule of Rule (rule_choices): the configuration's, or their defaults.
template <class Rule>
std::vector<typename Rule::options> member_options_in(const deepspeed_config& c) {
  if constexpr (rule_set<Rule>)
    return std::apply([&]<class... R>(R...) { return std::vector<typename Rule::options>{rule_options_in<R>(c)...}; },
                      typename Rule::member_rules{});
  else return {rule_options_in<Rule>(c)};
}
template <class Scaler>
typename Scaler::options scaler_options_in(const deepspeed_config& c) {
  if constexpr (std::is_same_v<Scaler, static_scale>) return c.static_options;
  else if constexpr (std::is_same_v<Scaler, dynamic_scale>) return c.dynamic_options;
  else return {};
}

template <class Precision, class Scaler, class Partition, class Rule, class C>
MPOPT_COLD any_optimizer make_erased(C&& comm, const deepspeed_config& c, const typename Scaler::options& s) {
  using impl = erased_optimizer<Precision, Scaler, Partition, Rule, host, C>;
  any_optimizer made(std::make_unique<impl>(std::move(comm), c.options, s, member_options_in<Rule>(c)));
  if (c.schedule) made.set_schedule(*c.schedule);
  return made;
}

/// A compressing rule, which needs the whole momentum on every rank: replicated only.
template <class Precision, class Scaler, class Partition, class Rule, class C>
any_optimizer make_compressing(C&& comm, const deepspeed_config& c, const typename Scaler::options& s) {
  if constexpr (std::is_same_v<Partition, replicated>)
    return make_erased<Precision, Scaler, Partition, Rule>(std::move(comm), c, s);
  else
    fail("zero_optimization.stage: ", c.zero_stage, " does not go with ", Rule::title,
         " (its compression needs the whole momentum on every rank)");
}

template <class Precision, class Scaler, class Partition, class C>
any_optimizer make_with_rule(C&& comm, const deepspeed_config& c, const typename Scaler::options& s) {
  switch (c.rule) {
    case config_rule::adam: return make_erased<Precision, Scaler, Partition, adam>(std::move(comm), c, s);
    case config_rule::lamb: return make_erased<Precision, Scaler, Partition, lamb>(std::move(comm), c, s);
    case config_rule::onebit_lamb: return make_compressing<Precision, Scaler, Partition, onebit_lamb>(std::move(comm), c, s);
    case config_rule::onebit_adam: return make_compressing<Precision, Scaler, Partition, onebit_adam>(std::move(comm), c, s);
    case config_rule::zero_one_adam:
      return make_compressing<Precision, Scaler, Partition, zero_one_adam>(std::move(comm), c, s);
  }
  fail("deepspeed_config.rule: not one of adam, lamb, onebit_lamb, onebit_adam, zero_one_adam");
}

template <class Precision, class Scaler, class C>
any_optimizer make_with_partition(C&& comm, const deepspeed_config& c, const typename Scaler::options& s) {
  switch (c.zero_stage) {
    case 0: return make_with_rule<Precision, Scaler, replicated>(std::move(comm), c, s);
    case 1: return make_with_rule<Precision, Scaler, zero1>(std::move(comm), c, s);
    case 2: return make_with_rule<Precision, Scaler, zero2>(std::move(comm), c, s);
  }
  fail("zero_optimization.stage: ", c.zero_stage, " is not supported (mpopt has stages 0, 1 and 2)");
}

/// The rules a configuration names, in config_rule's order.
inline constexpr std::size_t config_rules = 5;
template <class R>
constexpr std::size_t config_rule_index() {
  constexpr std::array<bool, config_rules> is = {std::is_same_v<R, adam>, std::is_same_v<R, lamb>,
                                                 std::is_same_v<R, onebit_lamb>, std::is_same_v<R, onebit_adam>,
                                                 std::is_same_v<R, zero_one_adam>};
  return std::size_t(std::find(is.begin(), is.end(), true) - is.begin());
}
/// The rule a configuration names for Rule (as config_rule's index; config_rules: none): Rule, or
/// a set's first member that a configuration names.
template <class Rule>
constexpr std::size_t configured_rule() {
  if constexpr (rule_set<Rule>) {
    return std::apply(
        []<class... R>(R...) {
          std::size_t k = config_rules;
          ((k = k < config_rules ? k : config_rule_index<R>()), ...);
          return k;
        },
        typename Rule::member_rules{});
  } else {
    return config_rule_index<Rule>();
  }
}

/// What a configuration says of an optimizer's types.
struct configured_types {
  config_precision precision;
  config_scaler scaler;
  int zero_stage;
  config_rule rule;
};

template <class Precision, class Scaler, class Partition, class Rule>
constexpr configured_types configured_types_of() {
  using P = typename Precision::param_type;
  static_assert(std::is_same_v<Scaler, no_scaling> || std::is_same_v<Scaler, static_scale> ||
                    std::is_same_v<Scaler, dynamic_scale>,
                "a DeepSpeed configuration's loss scale is mpopt::no_scaling, static_scale or dynamic_scale");
  static_assert(std::is_same_v<Partition, replicated> || std::is_same_v<Partition, zero1> || std::is_same_v<Partition, zero2>,
                "a DeepSpeed configuration's ZeRO stage is mpopt::replicated, zero1 or zero2");
  static_assert(configured_rule<Rule>() < config_rules,
                "a DeepSpeed configuration names adam, lamb, onebit_lamb, onebit_adam or zero_one_adam (or a set of "
                "rules, mpopt::rules, with one of them)");
  return {.precision = std::is_same_v<P, float> ? config_precision::fp32
                       : std::is_same_v<P, half> ? config_precision::fp16
                                                 : config_precision::bf16,
          .scaler = std::is_same_v<Scaler, static_scale>    ? config_scaler::static_scale
                    : std::is_same_v<Scaler, dynamic_scale> ? config_scaler::dynamic_scale
                                                            : config_scaler::none,
          .zero_stage = std::is_same_v<Partition, replicated> ? 0 : std::is_same_v<Partition, zero1> ? 1 : 2,
          .rule = config_rule(configured_rule<Rule>())};
}

/// Refuses a configuration whose accumulation steps were worked out for another number of ranks.
MPOPT_COLD inline void check_configured_world(const deepspeed_config& c, int ranks) {
  if (c.accumulation_from_batch_sizes && c.world_size != ranks)
    fail("the configuration was read for ", c.world_size, " ranks, which its train_batch_size divides into ",
         c.options.accumulation_steps, " accumulation steps; the communicator has ", ranks,
         ": read it with deepspeed_config::parse(json, ", ranks, ")");
}

/// Refuses a configuration that says otherwise than `t`, the types of `policies`.
MPOPT_COLD inline void check_configured_types(const deepspeed_config& c, const configured_types& t,
                                              std::string_view policies) {
  static constexpr std::string_view precisions[] = {"fp32 parameters", "fp16 parameters", "bf16 parameters"};
  static constexpr std::string_view scalers[] = {"no loss scale", "a static loss scale", "a dynamic loss scale"};
  static constexpr std::string_view rules[] = {"adam", "lamb", "onebit_lamb", "onebit_adam", "zero_one_adam"};
  std::string differences;
  auto differ = [&](const std::string& configured, const std::string& typed) {
    if (configured != typed) (differences += differences.empty() ? "" : "; ") += configured + " where the types have " + typed;
  };
  differ(std::string(precisions[int(c.precision)]), std::string(precisions[int(t.precision)]));
  differ(std::string(scalers[int(c.scaler)]), std::string(scalers[int(t.scaler)]));
  differ("ZeRO stage " + std::to_string(c.zero_stage), "ZeRO stage " + std::to_string(t.zero_stage));
  differ("rule " + std::string(rules[int(c.rule)]), "rule " + std::string(rules[int(t.rule)]));
  if (!differences.empty())
    fail("make_optimizer_as<", policies, ">: the configuration says ", differences);
}

}  // namespace detail

/// The factory over one process in four parts, one per precision and scaler, each nine optimizer
/// types. In the separately compiled mode they are declared here and defined once per program, with
/// the types, by <mpopt/src_optimizers.hpp> or src/optimizers_*.cpp; over another communicator
/// make_optimizer instantiates its types where it is called.
#define MPOPT_FACTORY_PART(EXTERN, PRECISION, SCALER)                                                   \
  EXTERN template any_optimizer make_with_partition<PRECISION, SCALER, single_process>(                 \
      single_process&&, const deepspeed_config&, const typename SCALER::options&);
#define MPOPT_FACTORY_PARTS(EXTERN)                   \
  MPOPT_FACTORY_PART(EXTERN, fp32, no_scaling)        \
  MPOPT_FACTORY_PART(EXTERN, bf16, no_scaling)        \
  MPOPT_FACTORY_PART(EXTERN, fp16, static_scale)      \
  MPOPT_FACTORY_PART(EXTERN, fp16, dynamic_scale)
#if defined(MPOPT_SEPARATE_COMPILATION)
namespace detail {
MPOPT_FACTORY_PARTS(extern)
}  // namespace detail
#endif

/// The optimizer `c` describes, over `comm` (single_process, mpi, or any host communicator), on the
/// host backend, following the configuration's schedule where it has one. Under MPI every rank calls
/// it with the same configuration.
template <communicator C = single_process>
any_optimizer make_optimizer(const deepspeed_config& c, C comm = {}) {
  using detail::fail;
  detail::check_configured_world(c, comm.size());
  switch (c.precision) {
    case config_precision::fp32:
      if (c.scaler != config_scaler::none) fail("fp32 trains without a loss scale (deepspeed_config.scaler is not none)");
      return detail::make_with_partition<fp32, no_scaling>(std::move(comm), c, {});
    case config_precision::bf16:
      if (c.scaler != config_scaler::none) fail("bf16 trains without a loss scale (deepspeed_config.scaler is not none)");
      return detail::make_with_partition<bf16, no_scaling>(std::move(comm), c, {});
    case config_precision::fp16:
      if (c.scaler == config_scaler::static_scale)
        return detail::make_with_partition<fp16, static_scale>(std::move(comm), c, c.static_options);
      if (c.scaler == config_scaler::dynamic_scale)
        return detail::make_with_partition<fp16, dynamic_scale>(std::move(comm), c, c.dynamic_options);
      fail("fp16 from a DeepSpeed configuration has a loss scale, static or dynamic (deepspeed_config.scaler is none)");
  }
  fail("deepspeed_config.precision: not one of fp32, fp16, bf16");
}

/// The optimizer `c` describes, of the types given, over `comm`: how a program reaches what a
/// configuration cannot name, such as a state precision (with_state<bf16, blockwise8_state,
/// remainder16>) or stochastic rounding. `c` must agree with the types on precision (the parameter
/// type), loss scaling, ZeRO stage and rule, and gives the options and schedule as for
/// make_optimizer. Only this type is instantiated, where it is called.
template <class Precision, class Scaler, class Partition, class Rule, communicator C = single_process>
any_optimizer make_optimizer_as(const deepspeed_config& c, C comm = {}) {
  const std::string_view names[] = {Precision::name, Scaler::name, Partition::name, Rule::name};
  std::string policies;
  for (std::string_view n : names) (policies += policies.empty() ? "" : ", ") += n;
  detail::check_configured_world(c, comm.size());
  detail::check_configured_types(c, detail::configured_types_of<Precision, Scaler, Partition, Rule>(), policies);
  return detail::make_erased<Precision, Scaler, Partition, Rule>(std::move(comm), c,
                                                                 detail::scaler_options_in<Scaler>(c));
}

/// The same from a parsed DeepSpeed JSON (deepspeed_config::parse with comm.size() ranks).
template <communicator C = single_process>
any_optimizer make_optimizer(const nlohmann::json& j, C comm = {}) {
  const int ranks = comm.size();
  return make_optimizer(deepspeed_config::parse(j, ranks), std::move(comm));
}

}  // namespace mpopt
