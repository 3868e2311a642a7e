// Rules a user writes outside include/ (examples/user_rules.hpp: Lion, SGD with momentum, LARS, Adagrad)
// against float64 references written here from their papers' formulas, for 50 steps in fp32, fp16
// with dynamic loss scaling and bf16, with clipping and skipped steps; their checkpoints round-trip.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <mpopt/mpopt.hpp>

#include "../examples/user_rules.hpp"
#include "error_of.hpp"
#include "temp_dir.hpp"
#include "test_backend.hpp"

namespace {

using vec = std::vector<double>;

// ---------------------------------------------------------------- float64 references

/// One tensor's reference state: its weights, the rule's buffer and, for LARS, its local lr.
struct ref_tensor {
  vec w, s;
  double kept = 1.0;
  std::vector<int> ambiguous;  // Lion: steps whose sign(c) float rounding may flip, per element
};

double norm(const vec& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

/// Lion, from Chen et al. 2023: c = b1 m + (1 - b1) g; w -= lr (sign(c) + wd w); m = b2 m + (1 - b2) g.
void reference_step(const user_rules::lion::options& o, std::uint64_t, ref_tensor& t, const vec& g) {
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double a = o.beta1 * t.s[i], b = (1 - o.beta1) * g[i], c = a + b;
    if (std::abs(c) <= 1e-5 * (std::abs(a) + std::abs(b))) ++t.ambiguous[i];
    t.w[i] -= o.lr * (double((c > 0) - (c < 0)) + o.weight_decay * t.w[i]);
    t.s[i] = o.beta2 * t.s[i] + (1 - o.beta2) * g[i];
  }
}

/// torch.optim.SGD: d = g + wd w; buf = d on the first step, then momentum buf + (1 - dampening) d;
/// w -= lr (nesterov ? d + momentum buf : buf).
void reference_step(const user_rules::sgd::options& o, std::uint64_t step, ref_tensor& t, const vec& g) {
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double d = g[i] + o.weight_decay * t.w[i];
    t.s[i] = step == 1 ? d : o.momentum * t.s[i] + (1 - o.dampening) * d;
    t.w[i] -= o.lr * (o.nesterov ? d + o.momentum * t.s[i] : t.s[i]);
  }
}

/// LARS, You et al. 2017, Algorithm 1: local lr = eta ||w|| / (||g|| + wd ||w||) (1 if a norm is 0);
/// v = momentum v + lr local (g + wd w); w -= v.
void reference_step(const user_rules::lars::options& o, std::uint64_t, ref_tensor& t, const vec& g) {
  const double wn = norm(t.w), gn = norm(g);
  t.kept = wn > 0 && gn > 0 ? o.eta * wn / (gn + o.weight_decay * wn) : 1.0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    t.s[i] = o.momentum * t.s[i] + o.lr * t.kept * (g[i] + o.weight_decay * t.w[i]);
    t.w[i] -= t.s[i];
  }
}

/// torch.optim.Adagrad: d = g + wd w; clr = lr / (1 + (t - 1) lr_decay); sum += d^2 (sum starts at
/// initial_accumulator_value); w -= clr d / (sqrt(sum) + eps).
void reference_step(const user_rules::adagrad::options& o, std::uint64_t step, ref_tensor& t, const vec& g) {
  const double clr = o.lr / (1 + double(step - 1) * o.lr_decay);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double d = g[i] + o.weight_decay * t.w[i];
    t.s[i] += d * d;
    t.w[i] -= clr * d / (std::sqrt(t.s[i]) + o.eps);
  }
}
/// What the rule's buffer starts at: Adagrad's initial_accumulator_value, otherwise zero.
double reference_start(const user_rules::adagrad::options& o) { return o.initial_accumulator_value; }
template <class Options>
double reference_start(const Options&) {
  return 0.0;
}

// ---------------------------------------------------------------- the runs

template <class Precision, class Scaler, class Rule>
using optimizer = mpopt::optimizer<Precision, Scaler, mpopt::replicated, Rule, test_backend>;

/// Two groups of tensors (sizes 1, odd, and one over several chunks), their options, and a float64
/// reference fed the gradients the optimizer sees.
template <class Precision, class Scaler, class Rule>
struct rig {
  using P = typename Precision::param_type;
  using options = typename Rule::options;
  optimizer<Precision, Scaler, Rule> opt;
  std::vector<std::vector<P>> params, grads;
  std::vector<ref_tensor> ref;
  std::vector<options> group_options;
  std::vector<std::size_t> group_of;
  std::vector<std::uint64_t> ref_steps;
  std::mt19937_64 rng{11};

  int micro_steps;

  rig(const options& a, const options& b, typename Scaler::options so = {}, int micro = 1)
      : opt(mpopt::optimizer_options{.clip_grad = 1.0, .accumulation_steps = micro}, so),
        group_options{a, b},
        ref_steps{0, 0},
        micro_steps(micro) {
    const std::vector<std::vector<std::size_t>> sizes = {{1, 77, 70001}, {3, 1024}};
    std::normal_distribution<double> normal(0.0, 0.5);
    for (std::size_t gi = 0; gi < 2; ++gi) {
      auto& g = opt.add_group(group_options[gi]);
      for (std::size_t n : sizes[gi]) {
        params.emplace_back(n);
        grads.emplace_back(n, P(0.0f));
        ref.push_back({vec(n), vec(n, reference_start(group_options[gi])), 1.0, std::vector<int>(n, 0)});
        for (std::size_t i = 0; i < n; ++i) {
          params.back()[i] = P(float(normal(rng)));
          ref.back().w[i] = double(float(params.back()[i]));
        }
        group_of.push_back(gi);
      }
      for (std::size_t t = params.size() - sizes[gi].size(); t < params.size(); ++t)
        // append, not "g" + ...: GCC 12 warns falsely there (-Wrestrict, PR105651)
        g.add(params[t], grads[t], std::string("g").append(std::to_string(gi)).append(".t").append(std::to_string(t)));
    }
  }

  /// One step: random gradients with global norm `target` (clipping binds above 1), stored scaled
  /// in the gradient type, the same in each micro-step; `poison` puts an inf in one element of the
  /// last. The reference applies the same unscaled, clipped gradients unless the optimizer must skip.
  mpopt::step_status step(double target, bool poison) {
    const double scale = opt.loss_scale();
    std::normal_distribution<double> normal;
    std::vector<vec> g(params.size());
    double sumsq = 0;
    for (std::size_t t = 0; t < params.size(); ++t) {
      g[t].resize(params[t].size());
      for (double& x : g[t]) x = normal(rng);
      sumsq += norm(g[t]) * norm(g[t]);
    }
    double true_sumsq = 0;
    for (std::size_t t = 0; t < params.size(); ++t)
      for (std::size_t i = 0; i < g[t].size(); ++i) {
        grads[t][i] = P(float(g[t][i] * target / std::sqrt(sumsq) * scale));
        g[t][i] = double(float(grads[t][i])) / scale;  // what the optimizer reads, unscaled
        true_sumsq += g[t][i] * g[t][i];
      }
    for (int a = 1; a < micro_steps; ++a) CHECK(opt.step().micro_step == a);
    if (poison) grads.back()[5] = P(std::numeric_limits<float>::infinity());
    const mpopt::step_status st = opt.step();
    CHECK(st.applied == !poison);
    if (poison) return st;
    const double clip = std::min(1.0, 1.0 / (std::sqrt(true_sumsq) + 1e-6));
    for (std::size_t t = 0; t < params.size(); ++t) {
      for (double& x : g[t]) x *= clip;
      const std::size_t gi = group_of[t];
      reference_step(group_options[gi], ref_steps[gi] + 1, ref[t], g[t]);
    }
    ++ref_steps[0];
    ++ref_steps[1];
    return st;
  }

  /// The largest error of the masters and state against the reference, relative to each tensor's
  /// largest weight, after discounting Lion's sign flips (2 lr each, where float rounding decides).
  double worst_error(double flip_allowance = 0) const {
    double worst = 0;
    for (std::size_t t = 0; t < params.size(); ++t) {
      const auto master = opt.master(t);
      const auto state = opt.moment(0, t);
      double scale = 1e-3;
      for (double x : ref[t].w) scale = std::max(scale, std::abs(x));
      for (std::size_t i = 0; i < master.size(); ++i) {
        const double slack = flip_allowance * ref[t].ambiguous[i];
        worst = std::max(worst, std::max(0.0, std::abs(double(master[i]) - ref[t].w[i]) - slack) / scale);
        worst = std::max(worst, std::abs(double(state[i]) - ref[t].s[i]) / std::max(scale, 1.0));
      }
    }
    return worst;
  }
};

/// 50 steps, clipping binding on every third, an overflow on steps 9 and 30; the masters and state
/// stay within `tolerance` of the reference (relative to the tensor's scale) after every step.
template <class Precision, class Scaler, class Rule>
void check_against_reference(const typename Rule::options& a, const typename Rule::options& b, double tolerance,
                             double flip_allowance = 0, int micro_steps = 1) {
  rig<Precision, Scaler, Rule> r(a, b, {}, micro_steps);
  double worst = 0;
  for (int step = 1; step <= 50; ++step) {
    r.step(step % 3 == 0 ? 4.0 : 0.5, step == 9 || step == 30);
    worst = std::max(worst, r.worst_error(flip_allowance));
  }
  CAPTURE(worst);
  CHECK(worst <= tolerance);
  CHECK(r.opt.group(0).step() == 48);
  CHECK(r.opt.scaler().scale() > 0);
}

const user_rules::lion::options lion_a{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.1};
const user_rules::lion::options lion_b{.lr = 3e-4, .beta1 = 0.95, .beta2 = 0.98, .weight_decay = 0.0};
const user_rules::sgd::options sgd_a{.lr = 0.05, .momentum = 0.9, .dampening = 0.0, .weight_decay = 0.01, .nesterov = true};
const user_rules::sgd::options sgd_b{.lr = 0.02, .momentum = 0.8, .dampening = 0.1, .weight_decay = 0.0, .nesterov = false};
const user_rules::lars::options lars_a{.lr = 0.5, .momentum = 0.9, .weight_decay = 5e-4, .eta = 1e-2};
const user_rules::lars::options lars_b{.lr = 0.1, .momentum = 0.5, .weight_decay = 0.0, .eta = 2e-2};
const user_rules::adagrad::options adagrad_a{.lr = 0.05, .lr_decay = 0.01, .weight_decay = 0.01, .initial_accumulator_value = 0.1};
const user_rules::adagrad::options adagrad_b{.lr = 0.02, .initial_accumulator_value = 0.5, .eps = 1e-6};

/// The two groups' options each rule is tested with.
template <class Rule>
std::pair<typename Rule::options, typename Rule::options> options_of() {
  if constexpr (std::is_same_v<Rule, user_rules::lion>) return {lion_a, lion_b};
  else if constexpr (std::is_same_v<Rule, user_rules::sgd>) return {sgd_a, sgd_b};
  else if constexpr (std::is_same_v<Rule, user_rules::adagrad>) return {adagrad_a, adagrad_b};
  else return {lars_a, lars_b};
}

}  // namespace

TEST_SUITE("custom_rules") {
  TEST_CASE_TEMPLATE("a user rule matches its float64 reference for 50 steps in every precision", Rule, user_rules::lion,
                     user_rules::sgd, user_rules::lars, user_rules::adagrad) {
    const auto [a, b] = options_of<Rule>();
    // Lion: a sign that float rounding may flip costs 2 lr; elsewhere the errors are roundings.
    const double flips = std::is_same_v<Rule, user_rules::lion> ? 2 * lion_a.lr : 0.0;
    SUBCASE("fp32") { check_against_reference<mpopt::fp32, mpopt::no_scaling, Rule>(a, b, 2e-5, flips); }
#ifndef MPOPT_TEST_DEVICE_BACKEND  // on the device: the stages in fp32 here, in bf16 by the checkpoint case below
    SUBCASE("fp16, dynamic loss scale") { check_against_reference<mpopt::fp16, mpopt::dynamic_scale, Rule>(a, b, 2e-5, flips); }
    SUBCASE("bf16") { check_against_reference<mpopt::bf16, mpopt::no_scaling, Rule>(a, b, 2e-5, flips); }
#endif
    // Every stage reads the accumulated gradient (LARS reads it in both).
    SUBCASE("fp32, 3 micro-steps") { check_against_reference<mpopt::fp32, mpopt::no_scaling, Rule>(a, b, 2e-5, flips, 3); }
  }

  TEST_CASE("the reference comparison fails for a rule that differs from it") {
    // SGD run by the optimizer without Nesterov, checked against a Nesterov reference.
    rig<mpopt::fp32, mpopt::no_scaling, user_rules::sgd> r(sgd_b, sgd_b);
    r.group_options = {sgd_a, sgd_b};
    for (int step = 1; step <= 10; ++step) r.step(0.5, false);
    CHECK(r.worst_error() > 1e-3);
  }

  TEST_CASE("a rule's state starts where it declares, per group") {
    rig<mpopt::bf16, mpopt::no_scaling, user_rules::adagrad> r(adagrad_a, adagrad_b);
    r.opt.finalize();
    for (std::size_t t = 0; t < r.params.size(); ++t) {
      const float start = float(r.group_of[t] == 0 ? adagrad_a.initial_accumulator_value : adagrad_b.initial_accumulator_value);
      const auto sum = r.opt.moment(0, t);
      CHECK(std::all_of(sum.begin(), sum.end(), [&](float x) { return x == start; }));
    }
    // A rule of zeros (SGD's buffer) still starts at zero.
    rig<mpopt::bf16, mpopt::no_scaling, user_rules::sgd> z(sgd_a, sgd_b);
    z.opt.finalize();
    const auto buffer = z.opt.moment(0, 2);
    CHECK(std::all_of(buffer.begin(), buffer.end(), [](float x) { return x == 0.0f; }));
  }

  TEST_CASE("LARS keeps its local learning rates, as it declares") {
    rig<mpopt::fp32, mpopt::no_scaling, user_rules::lars> r(lars_a, lars_b);
    for (int step = 1; step <= 3; ++step) r.step(0.5, false);
    const auto kept = r.opt.tensor_state();
    REQUIRE(kept.size() == r.ref.size());
    for (std::size_t t = 0; t < kept.size(); ++t) CHECK(kept[t] == doctest::Approx(r.ref[t].kept).epsilon(1e-5));
  }

  TEST_CASE_TEMPLATE("a user rule's checkpoint round-trips under the names its declaration gives", Rule, user_rules::lion,
                     user_rules::sgd, user_rules::lars, user_rules::adagrad) {
    const auto o = options_of<Rule>().first;
    temp_dir dir;
    const auto file = dir.path / "rule.safetensors";
    rig<mpopt::bf16, mpopt::no_scaling, Rule> a(o, o), b(o, o);
    for (int step = 1; step <= 5; ++step) {
      a.step(0.5, false);
      b.step(0.5, false);
    }
    a.opt.save(file);
    const std::string header = [&] {
      std::ifstream in(file, std::ios::binary);
      std::uint64_t n = 0;
      in.read(reinterpret_cast<char*>(&n), 8);
      std::string h(n, ' ');
      in.read(h.data(), std::streamsize(n));
      return h;
    }();
    for (std::string_view name : Rule::state) CHECK(header.find("\"" + std::string(name) + "/g0.t2\"") != std::string::npos);
    // The metadata is JSON serialized into a string: its quotes are escaped.
    CHECK(header.find(std::string("\\\"rule\\\":\\\"") + std::string(Rule::name) + "\\\"") != std::string::npos);
    // b continues from a's file (its own five steps overwritten) and both take the same steps.
    for (int step = 1; step <= 2; ++step) b.step(0.5, false);
    b.opt.load(file);
    b.rng = a.rng;
    for (int step = 1; step <= 4; ++step) {
      a.step(0.5, false);
      b.step(0.5, false);
    }
    for (std::size_t t = 0; t < a.params.size(); ++t) {
      CHECK(std::equal(a.opt.master(t).begin(), a.opt.master(t).end(), b.opt.master(t).begin()));
      CHECK(std::equal(a.opt.moment(0, t).begin(), a.opt.moment(0, t).end(), b.opt.moment(0, t).begin()));
    }
    CHECK(b.opt.group(0).step() == 9);
  }

  TEST_CASE("a user rule's options are checked like a built-in's") {
    using opt_t = optimizer<mpopt::fp32, mpopt::no_scaling, user_rules::sgd>;
    opt_t opt;
    CHECK_THROWS_AS(opt.add_group({.lr = 0.1, .momentum = 0.0, .nesterov = true}), mpopt::error);
    CHECK_THROWS_AS(opt.add_group({.lr = std::nan("")}), mpopt::error);
    auto& g = opt.add_group({.lr = 0.1});
    CHECK_THROWS_AS(g.set_lr(-1), mpopt::error);
    CHECK(g.lr() == 0.1);
  }

  TEST_CASE("a schedule sets a user rule's rate; OneCycle's momentum needs betas the rule does not have") {
    using opt_t = optimizer<mpopt::fp32, mpopt::no_scaling, user_rules::adagrad>;
    opt_t opt;
    std::vector<float> p(5, 1.0f), g(5, 0.1f);
    opt.add_group({.lr = 0.05}).add(p, g, "w");
    const std::string msg = error_of([&] { opt.set_schedule(mpopt::one_cycle{.cycle_min_lr = 0.01, .cycle_max_lr = 0.1}); });
    CHECK(msg.find("OneCycle.cycle_momentum: adagrad has no beta1 and beta2 to cycle; set it to false") != std::string::npos);
    CHECK_FALSE(opt.schedule());
    const mpopt::lr_schedule s = mpopt::one_cycle{.cycle_min_lr = 0.01, .cycle_max_lr = 0.1, .cycle_first_step_size = 3,
                                                  .cycle_momentum = false};
    opt.set_schedule(s);
    for (std::uint64_t k = 0; k < 8; ++k) {
      CHECK(opt.step().applied);
      CHECK(opt.group(0).lr() == mpopt::scheduled_rate(s, k, 0.05));
    }
  }
}
