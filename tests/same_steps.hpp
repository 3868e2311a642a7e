// Two optimizers side by side: one built from a DeepSpeed configuration behind any_optimizer
// (make_optimizer, or make_optimizer_as with the types given) and the typed optimizer of the same
// policies, stepped on the same model and gradients; every status and every parameter bit must agree.
#pragma once

#include <doctest/doctest.h>

#include <mpopt/make_optimizer.hpp>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace same_steps {

using mpopt::deepspeed_config;

template <class Scaler>
typename Scaler::options scaler_options_of(const deepspeed_config& c) {
  if constexpr (std::is_same_v<Scaler, mpopt::dynamic_scale>) return c.dynamic_options;
  else if constexpr (std::is_same_v<Scaler, mpopt::static_scale>) return c.static_options;
  else return {};
}

template <class Rule>
typename Rule::options rule_options_of(const deepspeed_config& c) {
  if constexpr (std::is_same_v<Rule, mpopt::adam>) return c.adam_options;
  else if constexpr (std::is_same_v<Rule, mpopt::lamb>) return c.lamb_options;
  else if constexpr (std::is_same_v<Rule, mpopt::onebit_lamb>) return c.onebit_lamb_options;
  else if constexpr (std::is_same_v<Rule, mpopt::onebit_adam>) return c.onebit_adam_options;
  else return c.zero_one_adam_options;
}

/// A small model in element type T: two tensors in a group with the configuration's options and
/// one in a group without weight decay.
template <class T>
struct model {
  static constexpr std::size_t sizes[] = {1000, 37, 64};
  std::vector<T> p[3], g[3];
  model() {
    for (std::size_t t = 0; t < 3; ++t) {
      p[t].resize(sizes[t]);
      g[t].resize(sizes[t]);
      for (std::size_t i = 0; i < sizes[t]; ++i) p[t][i] = T(0.5f * std::sin(0.1f * float(i) + float(t)));
    }
  }
  /// The scaled gradient of micro-step `k`; an inf at micro-step `overflow_at`.
  void backward(int k, double scale, int overflow_at) {
    for (std::size_t t = 0; t < 3; ++t)
      for (std::size_t i = 0; i < sizes[t]; ++i)
        g[t][i] = T(float(scale) * 0.05f * std::cos(0.37f * float(i) + 1.3f * float(k) + float(t)));
    if (k == overflow_at) g[0][5] = T(std::numeric_limits<float>::infinity());
  }
};

/// Runs the configuration's optimizer from make_optimizer (or, `as_types`, make_optimizer_as with
/// Opt's types) and the typed optimizer Opt side by side on the same model and gradients: the status
/// of every call and every parameter bit must agree.
template <class Opt, bool as_types = false>
void check_same_steps(const std::string& json, int calls, int overflow_at) {
  using P = typename Opt::param_type;
  using scaler = std::remove_cvref_t<decltype(std::declval<Opt&>().scaler())>;
  const deepspeed_config c = deepspeed_config::parse_text(json);
  mpopt::any_optimizer a =
      as_types ? mpopt::make_optimizer_as<typename Opt::precision, scaler, typename Opt::partition, typename Opt::rule>(c)
               : mpopt::make_optimizer(c);
  REQUIRE(a.target<Opt>() != nullptr);
  CHECK(a.config().overlap_comm == c.options.overlap_comm);
  Opt b(c.options, scaler_options_of<scaler>(c));
  if (c.schedule) b.set_schedule(*c.schedule);  // as make_optimizer does
  auto no_decay = rule_options_of<typename Opt::rule>(c);
  no_decay.weight_decay = 0.0;
  no_decay.lr = 2e-3;

  model<P> ma, mb;
  a.add_group().add(ma.p[0], ma.g[0], "w0").add(ma.p[1], ma.g[1], "w1");
  a.add_group({.lr = 2e-3, .weight_decay = 0.0}).add(ma.p[2], ma.g[2], "bias");
  auto& b0 = b.add_group(rule_options_of<typename Opt::rule>(c));
  b0.add(mb.p[0], mb.g[0], "w0");
  b0.add(mb.p[1], mb.g[1], "w1");
  b.add_group(no_decay).add(mb.p[2], mb.g[2], "bias");

  int applied = 0;
  for (int k = 0; k < calls; ++k) {
    CAPTURE(k);
    REQUIRE(a.loss_scale() == b.loss_scale());
    ma.backward(k, a.loss_scale(), overflow_at);
    mb.backward(k, b.loss_scale(), overflow_at);
    for (std::size_t t = 3; t-- > 0;) {  // as backward reports them
      a.grad_ready(t);
      b.grad_ready(t);
    }
    const mpopt::step_status sa = a.step(), sb = b.step();
    a.wait_params();  // overlap_comm: the gathers may still run
    b.wait_params();
    CHECK(sa.result == sb.result);
    CHECK(sa.scale_after == sb.scale_after);
    CHECK(std::memcmp(&sa.grad_norm, &sb.grad_norm, sizeof(double)) == 0);
    CHECK(sa.step == sb.step);
    CHECK(sa.compression_step == sb.compression_step);
    applied += sa.applied;
    for (std::size_t t = 0; t < 3; ++t) CHECK(std::memcmp(ma.p[t].data(), mb.p[t].data(), ma.p[t].size() * sizeof(P)) == 0);
  }
  CHECK(applied > 1);
  CHECK(a.group(0).step() == b.group(0).step());
  if (overflow_at >= 0) CHECK(b.group(0).step() < std::uint64_t(calls / c.options.accumulation_steps));
  for (std::size_t t = 0; t < 3; ++t) {
    const auto ma_t = a.master(t);  // (each its own: a span or a vector, by storage)
    const auto mb_t = b.master(t);
    REQUIRE(ma_t.size() == mb_t.size());
    CHECK(std::memcmp(ma_t.data(), mb_t.data(), ma_t.size_bytes()) == 0);
  }
}

}  // namespace same_steps
