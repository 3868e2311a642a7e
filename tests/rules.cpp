// mpopt::rules<muon, adam>: Muon's groups and AdamW's in one optimizer on one rank. Every step
// against float64 Muon (muon_reference.hpp) and float64 Adam (reference.hpp), under one global norm,
// clip and overflow decision; bitwise the steps of one optimizer per rule where nothing couples
// them; its checkpoint (each tensor's state by its rule's names, resumed bitwise), its memory report,
// a schedule over both rules, and what it refuses.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include <mpopt/adam.hpp>
#include <mpopt/checkpoint.hpp>
#include <mpopt/host_passes.hpp>  // Muon's host passes (not compiled once in libmpopt)
#include <mpopt/make_optimizer.hpp>
#include <mpopt/muon.hpp>
#include <mpopt/optimizer.hpp>
#include <mpopt/rules.hpp>
#include <mpopt/state_precision.hpp>

#include "error_of.hpp"
#include "muon_reference.hpp"
#include "reference.hpp"

namespace {

using mpopt::adam;
using mpopt::muon;
using muon_and_adam = mpopt::rules<muon, adam>;

/// A model of four groups, Muon's and Adam's interleaved: matrices (tall, wide, 3-D) and vectors of
/// 1, 7 and 33 elements, each group with settings of its own.
struct layout {
  struct tensor {
    std::size_t group;
    std::string name;
    mpopt::tensor_shape shape;
    std::size_t size;
  };
  std::vector<muon_reference::muon_settings> muon_groups;  // groups 0 and 2
  std::vector<ref::hyper> adam_groups;                     // groups 1 and 3
  std::vector<tensor> tensors;

  layout() {
    muon_reference::muon_settings m0, m2;
    m2.lr = 0.01;
    m2.nesterov = false;
    m2.adjustment = muon::lr_adjustment::match_rms_adamw;
    muon_groups = {m0, m2};
    ref::hyper a1, a3;
    a1.lr = 3e-3;
    a1.weight_decay = 0.01;
    a3.lr = 1e-3;
    a3.weight_decay = 0.02;
    a3.decoupled = false;
    adam_groups = {a1, a3};
    tensors = {{0, "w0", {12, 5}, 60}, {0, "w1", {5, 12}, 60}, {1, "b0", {1}, 1},    {1, "b1", {7}, 7},
               {2, "w2", {3, 4, 5}, 60}, {3, "b2", {33}, 33}};
  }
  static bool is_muon(std::size_t group) { return group % 2 == 0; }
  muon::options muon_options(std::size_t group) const {
    const auto& s = muon_groups[group / 2];
    muon::options o{.lr = s.lr, .weight_decay = s.weight_decay, .momentum = s.momentum, .nesterov = s.nesterov};
    o.adjust_lr_fn = s.adjustment;
    o.ns_precision = s.ns.precision;
    return o;
  }
  adam::options adam_options(std::size_t group) const {
    const auto& h = adam_groups[group / 2];
    return {.lr = h.lr, .beta1 = h.beta1, .beta2 = h.beta2, .eps = h.eps, .weight_decay = h.weight_decay,
            .decoupled_weight_decay = h.decoupled};
  }
};

/// Every step of rules<muon, adam> over `layout` against the float64 rules, with one norm and clip
/// over all tensors; step `overflow` (if any) has an inf in an Adam tensor, and changes nothing.
template <class Precision, class Scaler>
void check_steps(muon::iteration_precision iteration, double clip, typename Scaler::options so, int overflow = 0) {
  using param_t = typename Precision::param_type;
  using grad_t = typename Precision::grad_type;
  layout l;
  for (auto& m : l.muon_groups) m.ns.precision = iteration;
  mpopt::optimizer<Precision, Scaler, mpopt::replicated, muon_and_adam> opt({.clip_grad = clip}, so);
  std::vector<typename decltype(opt)::param_group*> groups;
  for (std::size_t g = 0; g < 4; ++g)
    groups.push_back(layout::is_muon(g) ? &opt.add_group(l.muon_options(g)) : &opt.add_group(l.adam_options(g)));

  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::size_t n = l.tensors.size();
  std::vector<std::vector<param_t>> params(n);
  std::vector<std::vector<grad_t>> grads(n);
  std::vector<std::vector<double>> p_ref(n), m_ref(n), v_ref(n), p0(n);
  for (std::size_t t = 0; t < n; ++t) {
    const auto& e = l.tensors[t];
    params[t].resize(e.size);
    grads[t].resize(e.size);
    for (auto& v : params[t]) v = param_t(0.1f * normal(gen));
    p0[t].assign(params[t].begin(), params[t].end());
    p_ref[t] = p0[t];
    m_ref[t].assign(e.size, 0.0);
    v_ref[t].assign(e.size, 0.0);
    groups[e.group]->add(params[t], grads[t], e.name, e.shape);
  }

  std::uint64_t applied = 0;
  for (int step = 1; step <= 5; ++step) {
    CAPTURE(step);
    const double scale = opt.loss_scale();
    std::vector<std::vector<double>> g(n);
    double squares = 0;
    for (std::size_t t = 0; t < n; ++t) {
      for (auto& v : grads[t]) v = grad_t(float(scale) * 0.01f * normal(gen));
      if (step == overflow && t == 3) grads[t][2] = grad_t(INFINITY);
      for (auto v : grads[t]) g[t].push_back(double(float(v)) / scale);
      for (double v : g[t]) squares += v * v;
    }
    const auto status = opt.step();
    if (step == overflow) {
      CHECK(status.result == mpopt::step_result::skipped_nonfinite);
    } else {
      REQUIRE(status.applied);
      ++applied;
      const double norm = std::sqrt(squares);
      CHECK(status.grad_norm == doctest::Approx(norm).epsilon(1e-6));
      const double coef = clip > 0 && clip / (norm + 1e-6) < 1 ? clip / (norm + 1e-6) : 1.0;
      for (std::size_t t = 0; t < n; ++t) {
        const auto& e = l.tensors[t];
        for (double& v : g[t]) v *= coef;
        if (layout::is_muon(e.group))
          muon_reference::reference_step(p_ref[t], m_ref[t], g[t], e.shape.dims()[0], e.size / e.shape.dims()[0],
                                         l.muon_groups[e.group / 2]);
        else
          ref::model::adam_update(l.adam_groups[e.group / 2], applied, p_ref[t], m_ref[t], v_ref[t], g[t]);
      }
    }
    for (std::size_t t = 0; t < n; ++t) {
      CAPTURE(l.tensors[t].name);
      const bool muon_tensor = layout::is_muon(l.tensors[t].group);
      const auto master = opt.master(t);
      std::vector<double> moved(master.size()), want(master.size());
      for (std::size_t k = 0; k < master.size(); ++k) {
        moved[k] = double(master[k]) - p0[t][k];
        want[k] = p_ref[t][k] - p0[t][k];
      }
      const double bound = !muon_tensor || iteration == muon::iteration_precision::fp32 ? 1e-5 : 5e-3;
      CHECK(newton_schulz_reference::relative_error(moved, want) < bound);
      const auto m0 = opt.moment(0, t);
      std::vector<double> first(m0.begin(), m0.end()), first_want = m_ref[t];
      if (muon_tensor)
        for (double& v : first_want) v *= 1 - l.muon_groups[l.tensors[t].group / 2].momentum;  // torch's buffer
      CHECK(newton_schulz_reference::relative_error(first, first_want) < 1e-5);
      if (!muon_tensor) {
        const auto m1 = opt.moment(1, t);
        CHECK(newton_schulz_reference::relative_error(std::vector<double>(m1.begin(), m1.end()), v_ref[t]) < 1e-5);
      }
    }
  }
  for (std::size_t g = 0; g < 4; ++g) CHECK(groups[g]->step() == applied);
}

}  // namespace

TEST_CASE("rules<muon, adam> follows float64 Muon and Adam per group, with one norm, clip and skip") {
  using iteration = muon::iteration_precision;
  for (auto it : {iteration::fp32, iteration::bf16}) {
    CAPTURE(int(it));
    SUBCASE("fp32, unclipped") { check_steps<mpopt::fp32, mpopt::no_scaling>(it, 0.0, {}); }
    SUBCASE("bf16, clipped") { check_steps<mpopt::bf16, mpopt::no_scaling>(it, 0.05, {}); }
    SUBCASE("fp16, dynamic scale, an overflow in an Adam tensor skips every group") {
      check_steps<mpopt::fp16, mpopt::dynamic_scale>(it, 1.0, {.init_scale = 4096, .hysteresis = 1}, 3);
    }
  }
}

namespace {

/// The layout's model with an optimizer of rules<muon, adam>, or with one optimizer per rule.
template <class Precision>
struct mixed_model {
  using param_t = typename Precision::param_type;
  using grad_t = typename Precision::grad_type;
  layout l;
  std::vector<std::vector<param_t>> params;
  std::vector<std::vector<grad_t>> grads;

  mixed_model() {
    for (const auto& e : l.tensors) {
      std::vector<param_t> p(e.size);
      for (std::size_t k = 0; k < e.size; ++k) p[k] = param_t(0.05f * std::sin(float(k * 3 + e.size)));
      params.push_back(p);
      grads.emplace_back(e.size);
    }
  }
  /// Registers group g's tensors with `group`.
  template <class Group>
  void add(std::size_t g, Group& group) {
    for (std::size_t t = 0; t < l.tensors.size(); ++t)
      if (l.tensors[t].group == g) group.add(params[t], grads[t], l.tensors[t].name, l.tensors[t].shape);
  }
  void set_grads(int step) {
    for (std::size_t t = 0; t < grads.size(); ++t)
      for (std::size_t k = 0; k < grads[t].size(); ++k)
        grads[t][k] = grad_t(0.01f * std::cos(float(k * 7 + t * 13 + std::size_t(step) * 5)));
  }
};

template <class Precision, class Scaler = mpopt::no_scaling>
using rules_opt = mpopt::optimizer<Precision, Scaler, mpopt::replicated, muon_and_adam>;
/// Quantized state: each buffer's blocks and their scales where only some groups keep it.
using bf16_state8 = mpopt::with_state<mpopt::bf16, mpopt::blockwise8_state>;

/// The bytes of the memory report's buffer `name` (0 where it lists none).
std::size_t bytes_of(const mpopt::memory_report& r, const std::string& name) {
  for (const auto& b : r.buffers)
    if (b.name == name) return b.bytes;
  return 0;
}

template <class Precision, class Scaler = mpopt::no_scaling>
void add_groups(rules_opt<Precision, Scaler>& opt, mixed_model<Precision>& m) {
  for (std::size_t g = 0; g < 4; ++g) {
    if (layout::is_muon(g)) m.add(g, opt.add_group(m.l.muon_options(g)));
    else m.add(g, opt.add_group(m.l.adam_options(g)));
  }
}
/// The layout's groups in an optimizer per rule: Muon's groups in one, Adam's in the other.
template <class Precision, class MuonOpt, class AdamOpt>
void add_groups_apart(MuonOpt& muon_opt, AdamOpt& adam_opt, mixed_model<Precision>& m) {
  for (std::size_t g = 0; g < 4; ++g) {
    if (layout::is_muon(g)) m.add(g, muon_opt.add_group(m.l.muon_options(g)));
    else m.add(g, adam_opt.add_group(m.l.adam_options(g)));
  }
}

}  // namespace

TEST_CASE("rules<muon, adam> takes, bitwise, the steps of one optimizer per rule where nothing couples them") {
  // Unclipped and without overflow, each group's step depends on its own gradients only.
  auto check = [&]<class Precision, class Scaler>(typename Scaler::options so) {
    mixed_model<Precision> both, apart;
    rules_opt<Precision, Scaler> opt({}, so);
    add_groups(opt, both);
    mpopt::optimizer<Precision, Scaler, mpopt::replicated, muon> muon_opt({}, so);
    mpopt::optimizer<Precision, Scaler, mpopt::replicated, adam> adam_opt({}, so);
    add_groups_apart(muon_opt, adam_opt, apart);
    for (int step = 0; step < 4; ++step) {
      both.set_grads(step);
      apart.set_grads(step);
      REQUIRE(opt.step().applied);
      REQUIRE(muon_opt.step().applied);
      REQUIRE(adam_opt.step().applied);
    }
    std::size_t in_muon = 0, in_adam = 0;
    for (std::size_t t = 0; t < both.l.tensors.size(); ++t) {
      CAPTURE(both.l.tensors[t].name);
      const bool m = layout::is_muon(both.l.tensors[t].group);
      const std::size_t i = m ? in_muon++ : in_adam++;
      CHECK(both.params[t] == apart.params[t]);
      const auto a = opt.master(t);
      const auto b = m ? muon_opt.master(i) : adam_opt.master(i);
      CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end()));
      for (std::size_t k = 0; k < (m ? 1u : 2u); ++k) {
        const auto x = opt.moment(k, t);
        const auto y = m ? muon_opt.moment(k, i) : adam_opt.moment(k, i);
        CHECK(std::equal(x.begin(), x.end(), y.begin(), y.end()));
      }
    }
  };
  SUBCASE("fp32") { check.operator()<mpopt::fp32, mpopt::no_scaling>({}); }
  SUBCASE("fp16, dynamic scale") { check.operator()<mpopt::fp16, mpopt::dynamic_scale>({.init_scale = 1024}); }
  SUBCASE("bf16, 8-bit state") { check.operator()<bf16_state8, mpopt::no_scaling>({}); }
}

namespace {

/// An optimizer of rules<muon, adam> over the layout's model, stepped on the model's gradients.
template <class Precision>
struct rules_run {
  mixed_model<Precision> m;
  rules_opt<Precision> opt;
  rules_run() { add_groups(opt, m); }
  void step(int s) {
    m.set_grads(s);
    REQUIRE(opt.step().applied);
  }
  std::size_t kept(std::size_t t) const { return layout::is_muon(m.l.tensors[t].group) ? 1 : 2; }
};

/// Saved after 3 steps and loaded into a fresh optimizer, the run goes on with the same bits.
template <class Precision>
std::vector<std::byte> check_resume() {
  rules_run<Precision> a;
  for (int s = 0; s < 3; ++s) a.step(s);
  std::vector<std::byte> saved;
  a.opt.save(saved);
  for (int s = 3; s < 6; ++s) a.step(s);

  rules_run<Precision> b;
  b.opt.load(saved);
  for (int s = 3; s < 6; ++s) b.step(s);
  for (std::size_t t = 0; t < a.m.l.tensors.size(); ++t) {
    CAPTURE(a.m.l.tensors[t].name);
    CHECK(a.m.params[t] == b.m.params[t]);
    const auto ma = a.opt.master(t), mb = b.opt.master(t);
    CHECK(std::equal(ma.begin(), ma.end(), mb.begin(), mb.end()));
    for (std::size_t k = 0; k < a.kept(t); ++k) {
      const auto x = a.opt.moment(k, t), y = b.opt.moment(k, t);
      CHECK(std::equal(x.begin(), x.end(), y.begin(), y.end()));
    }
  }
  return saved;
}

}  // namespace

TEST_CASE("rules<muon, adam> resumes bitwise; its checkpoint keeps each tensor's state by its rule's names") {
  const std::vector<std::byte> saved = check_resume<mpopt::bf16>();
  check_resume<bf16_state8>();

  // Loaded into 8-bit state, each tensor's state is its own, within the codes' rounding: a code
  // decodes to at most half the dynamic map's widest gap (1/71) of its block's largest value off,
  // and each tensor here is one block.
  rules_run<mpopt::bf16> fp32_state;
  fp32_state.opt.load(saved);
  rules_run<bf16_state8> codes;
  codes.opt.load(saved);
  for (std::size_t t = 0; t < codes.m.l.tensors.size(); ++t)
    for (std::size_t k = 0; k < codes.kept(t); ++k) {
      CAPTURE(codes.m.l.tensors[t].name);
      CAPTURE(k);
      const auto exact = fp32_state.opt.moment(k, t);
      const auto decoded = codes.opt.moment(k, t);
      REQUIRE(exact.size() == decoded.size());
      float largest = 0;
      for (const float x : exact) largest = std::max(largest, std::abs(x));
      for (std::size_t j = 0; j < exact.size(); ++j) CHECK(std::abs(decoded[j] - exact[j]) <= largest / 140);
      CHECK(largest > 0.0f);
    }

  const std::string text(reinterpret_cast<const char*>(saved.data()), saved.size());
  for (const std::string key :
       {"momentum_buffer/w0", "momentum_buffer/w2", "exp_avg/b0", "exp_avg_sq/b2", "muon+adam", "match_rms_adamw"}) {
    CAPTURE(key);
    CHECK(text.find(key) != std::string::npos);
  }
  for (const std::string key : {"exp_avg/w0", "exp_avg_sq/w1", "momentum_buffer/b0"}) {
    CAPTURE(key);
    CHECK(text.find(key) == std::string::npos);
  }

  // A file whose group 1 took Muon does not load where it takes Adam; nothing changes.
  mixed_model<mpopt::bf16> swapped_model;
  rules_opt<mpopt::bf16> swapped;
  for (std::size_t g = 0; g < 4; ++g) {
    if (g == 1) swapped_model.add(g, swapped.add_group(muon::options{}));
    else if (layout::is_muon(g)) swapped_model.add(g, swapped.add_group(swapped_model.l.muon_options(g)));
    else swapped_model.add(g, swapped.add_group(swapped_model.l.adam_options(g)));
  }
  const auto before = swapped_model.params;
  const std::string refused = error_of([&] { swapped.load(saved); });
  CAPTURE(refused);
  CHECK(refused.ends_with("group 1 was saved under adam, and this optimizer's takes muon: each group loads the state "
                          "of its own rule"));
  CHECK(swapped_model.params == before);
}

TEST_CASE("rules<muon, adam>: the memory report, a schedule over both rules, and what it refuses") {
  // The schedule sets each group's rate, Muon's and Adam's alike: as setting it by hand does.
  mixed_model<mpopt::fp32> m, by_hand;
  rules_opt<mpopt::fp32> opt, manual;
  add_groups(opt, m);
  add_groups(manual, by_hand);
  opt.set_schedule(mpopt::step_decay{.step_size = 1, .gamma = 0.5});
  for (int s = 0; s < 3; ++s) {
    for (std::size_t g = 0; g < 4; ++g) {
      const double base = layout::is_muon(g) ? m.l.muon_groups[g / 2].lr : m.l.adam_groups[g / 2].lr;
      manual.group(g).set_lr(base * std::ldexp(1.0, -s));
    }
    m.set_grads(s);
    by_hand.set_grads(s);
    REQUIRE(opt.step().applied);
    REQUIRE(manual.step().applied);
  }
  for (std::size_t g = 0; g < 4; ++g) {
    const double base = layout::is_muon(g) ? m.l.muon_groups[g / 2].lr : m.l.adam_groups[g / 2].lr;
    CHECK(opt.group(g).lr() == base / 4);
    CHECK(opt.group(g).base_lr() == base);
  }
  CHECK(m.params == by_hand.params);
  REQUIRE(opt.group(0).options().get_if<muon::options>() != nullptr);
  CHECK(opt.group(0).options().get_if<adam::options>() == nullptr);
  CHECK(opt.group(3).options().get_if<adam::options>()->decoupled_weight_decay == false);

  // Buffer 0 holds every group's state (Muon's momentum, Adam's exp_avg), buffer 1 Adam's groups'
  // alone: as much as optimizers of one rule each hold for the same groups.
  mixed_model<mpopt::fp32> apart;
  mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, muon> muon_opt;
  mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, adam> adam_opt;
  add_groups_apart(muon_opt, adam_opt, apart);
  muon_opt.finalize();
  adam_opt.finalize();
  const auto report = opt.memory_report(), muon_report = muon_opt.memory_report(),
             adam_report = adam_opt.memory_report();
  CHECK(bytes_of(report, "momentum_buffer|exp_avg") ==
        bytes_of(muon_report, "momentum_buffer") + bytes_of(adam_report, "exp_avg"));
  CHECK(bytes_of(report, "exp_avg_sq") == bytes_of(adam_report, "exp_avg_sq"));
  CHECK(bytes_of(report, "exp_avg_sq") > 0);
  CHECK(bytes_of(report, "exp_avg_sq") < bytes_of(report, "momentum_buffer|exp_avg") / 2);
  // Groups of one member only: the other's buffer holds nothing, and the steps are its rule's alone.
  mixed_model<mpopt::fp32> in_set, alone;
  rules_opt<mpopt::fp32> muon_set;
  mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, muon> plain_muon;
  for (const std::size_t g : {0, 2}) {
    in_set.add(g, muon_set.add_group(in_set.l.muon_options(g)));
    alone.add(g, plain_muon.add_group(alone.l.muon_options(g)));
  }
  for (int step = 0; step < 3; ++step) {
    in_set.set_grads(step);
    alone.set_grads(step);
    REQUIRE(muon_set.step().applied);
    REQUIRE(plain_muon.step().applied);
  }
  CHECK(in_set.params == alone.params);
  CHECK(bytes_of(muon_set.memory_report(), "exp_avg_sq") == 0);
  CHECK(bytes_of(muon_set.memory_report(), "momentum_buffer|exp_avg") == bytes_of(muon_report, "momentum_buffer"));

  CHECK(error_of([&] { (void)opt.moment(1, 0); }) ==
        "mpopt: moment 1: muon (the rule of tensor 'w0') keeps moments 0 to 0");
  CHECK(error_of([&] { (void)opt.moment(2, 2); }) ==
        "mpopt: moment 2: adam (the rule of tensor 'b0') keeps moments 0 to 1");

  // A vector in a Muon group: refused at finalize, naming Muon and the tensor.
  std::vector<float> p(8, 0.5f), g(8, 0.1f), w(16, 0.5f), gw(16, 0.1f);
  rules_opt<mpopt::fp32> bad;
  bad.add_group(adam::options{}).add(w, gw, "w", {4, 4});
  bad.add_group(muon::options{}).add(p, g, "bias", {8});
  CHECK(error_of([&] { bad.step(); }).find("muon works on matrices: tensor 'bias' has the shape [8]") !=
        std::string::npos);
  CHECK(p[0] == 0.5f);
  CHECK(w[0] == 0.5f);
  // A member's options are checked as its own, named by the group and the rule.
  muon::options o;
  o.ns_steps = 100;
  CHECK(error_of([&] { bad.add_group(o); }).find("group 2.muon.ns_steps") != std::string::npos);
}

TEST_CASE("rules<muon, adam> under OneCycle: Adam's betas cycle, Muon's momentum stays, each as its rule alone") {
  // OneCycle sets the betas of the groups that have them (DeepSpeed's writes betas, which only
  // rules with betas read). Unclipped, each group steps as an optimizer of its rule alone under the
  // same schedule: Adam's cycling its betas, Muon's (which has none) its rate only.
  const mpopt::one_cycle cycle{.cycle_min_lr = 1e-3, .cycle_max_lr = 1e-2, .cycle_first_step_size = 2};
  mpopt::one_cycle rate_only = cycle;
  rate_only.cycle_momentum = false;
  mixed_model<mpopt::fp32> both, apart;
  rules_opt<mpopt::fp32> opt;
  add_groups(opt, both);
  mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, muon> muon_opt;
  mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, adam> adam_opt;
  add_groups_apart(muon_opt, adam_opt, apart);
  opt.set_schedule(cycle);
  adam_opt.set_schedule(cycle);
  muon_opt.set_schedule(rate_only);
  CHECK(error_of([&] { muon_opt.set_schedule(cycle); }) ==
        "mpopt: OneCycle.cycle_momentum: muon has no beta1 and beta2 to cycle; set it to false");
  for (int step = 0; step < 6; ++step) {
    CAPTURE(step);
    both.set_grads(step);
    apart.set_grads(step);
    REQUIRE(opt.step().applied);
    REQUIRE(muon_opt.step().applied);
    REQUIRE(adam_opt.step().applied);
    const auto betas = mpopt::scheduled_momentum(cycle, std::uint64_t(step));
    REQUIRE(betas);
    CHECK(opt.group(1).options().get_if<adam::options>()->beta1 == betas->beta1);
    CHECK(opt.group(3).options().get_if<adam::options>()->beta2 == 0.99);
    CHECK(opt.group(0).options().get_if<muon::options>()->momentum == both.l.muon_options(0).momentum);
  }
  CHECK(both.params == apart.params);
}

TEST_CASE("make_optimizer_as builds rules<muon, adam>: each group takes the rule its settings name") {
  mpopt::deepspeed_config c;
  c.adam_options = {.lr = 3e-3, .beta2 = 0.99, .weight_decay = 0.05};
  auto opt = mpopt::make_optimizer_as<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, muon_and_adam>(c);
  mixed_model<mpopt::fp32> m, direct_model;
  // Group 0 Muon, with a rate of its own; group 1 AdamW, the configuration's options.
  auto muon_group = opt.add_group({.lr = 0.01, .rule = "muon"});
  auto adam_group = opt.add_group({.rule = "adam"});
  rules_opt<mpopt::fp32> direct;
  auto& direct_muon = direct.add_group(muon::options{.lr = 0.01});
  auto& direct_adam = direct.add_group(c.adam_options);
  for (std::size_t t = 0; t < m.l.tensors.size(); ++t) {
    const auto& e = m.l.tensors[t];
    const bool matrix = layout::is_muon(e.group);
    (matrix ? muon_group : adam_group).add(m.params[t], m.grads[t], e.name, e.shape);
    (matrix ? direct_muon : direct_adam).add(direct_model.params[t], direct_model.grads[t], e.name, e.shape);
  }
  for (int s = 0; s < 3; ++s) {
    m.set_grads(s);
    direct_model.set_grads(s);
    REQUIRE(opt.step().applied);
    REQUIRE(direct.step().applied);
  }
  CHECK(m.params == direct_model.params);
  CHECK(opt.policies().find("muon+adam") != std::string::npos);

  CHECK(error_of([&] { opt.add_group({.rule = "lion"}); }) ==
        "mpopt: group_settings.rule must be one of \"muon\", \"adam\", got \"lion\"");
  CHECK(error_of([&] { opt.add_group({.beta1 = 0.8, .rule = "muon"}); }) ==
        "mpopt: group_settings.beta1: muon has no beta1");
  mpopt::deepspeed_config lamb_config;
  lamb_config.rule = mpopt::config_rule::lamb;
  CHECK(error_of([&] {
          (void)mpopt::make_optimizer_as<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, muon_and_adam>(lamb_config);
        }).find("the configuration says rule lamb where the types have rule adam") != std::string::npos);
}
