// The step pipeline around the update rule: overflow skips, loss-scale reactions, non-finite values
// without a check, gradient accumulation, clipping, parameter groups, and the failure policies. Every
// step is compared with the float64 reference (tests/reference.hpp) as in adam.cpp.
#include <doctest/doctest.h>

#include <cstring>

#include "harness.hpp"

using namespace harness;

namespace {

template <class Rule>
std::pair<typename Rule::options, typename Rule::options> two_groups() {
  typename Rule::options a, b;
  a.lr = 2e-3;
  a.weight_decay = 0.05;
  b.lr = 1e-3;
  b.beta1 = 0.85;
  b.weight_decay = 0.0;
  return {a, b};
}

/// A rig with two groups: sizes include 1, odd sizes and a tensor spanning several chunks.
template <class Opt>
std::unique_ptr<rig<Opt>> make_rig(layout lay, mpopt::optimizer_options oo, typename Opt::scaler_options so,
                                   std::uint64_t seed, bool big = true) {
  auto rp = std::make_unique<rig<Opt>>(lay, oo, so);
  auto& r = *rp;
  const auto [a, b] = two_groups<typename Opt::rule>();
  r.add_group(a, big ? std::vector<std::size_t>{1, 7, 301, 70001} : std::vector<std::size_t>{1, 7, 301, 1001}, seed);
  r.add_group(b, {3, 64}, seed + 1);
  return rp;
}

template <class Precision, class Scaler, class Rule, layout Layout>
struct pcfg {
  using scaler = Scaler;
  using opt = mpopt::optimizer<Precision, Scaler, mpopt::replicated, Rule, test_backend>;
  static constexpr layout lay = Layout;
  static std::string describe() {
    return std::string(Precision::name) + "+" + std::string(Scaler::name) + "+" + std::string(Rule::name) +
           (Layout == layout::flat ? "+flat" : "+unfused");
  }
};

template <class Scaler>
typename Scaler::options scaler_options() {
  if constexpr (std::is_same_v<Scaler, mpopt::static_scale>) return {512.0};
  else if constexpr (std::is_same_v<Scaler, mpopt::dynamic_scale>) {
    mpopt::dynamic_scale_options o;
    o.init_scale = 1024;
    return o;
  } else return {};
}

}  // namespace

#define FAULT_CFGS(R, L)                                                                          \
  pcfg<mpopt::fp16, mpopt::dynamic_scale, R, L>, pcfg<mpopt::fp16, mpopt::static_scale, R, L>, \
      pcfg<mpopt::bf16, mpopt::no_scaling, R, L>, pcfg<mpopt::fp32, mpopt::no_scaling, R, L>
// Without a loss scale (where skip_nonfinite = false is allowed): both rules and layouts.
#define UNSCALED_CFGS                                                                                      \
  pcfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::unfused>,                                      \
      pcfg<mpopt::bf16, mpopt::no_scaling, mpopt::adam, layout::flat>,                                     \
      pcfg<mpopt::fp32, mpopt::no_scaling, mpopt::lamb, layout::flat>,                                     \
      pcfg<mpopt::bf16, mpopt::no_scaling, mpopt::lamb, layout::unfused>
#define ALL_FAULT_CFGS                                                                                  \
  FAULT_CFGS(mpopt::adam, layout::unfused), FAULT_CFGS(mpopt::adam, layout::flat),                      \
      FAULT_CFGS(mpopt::lamb, layout::unfused), FAULT_CFGS(mpopt::lamb, layout::flat)

TEST_SUITE("pipeline") {
  TEST_CASE_TEMPLATE("one inf or NaN gradient element skips the step bit-exactly; training then follows the reference",
                     C, ALL_FAULT_CFGS) {
    using opt_t = typename C::opt;
    const std::string what = C::describe();
    CAPTURE(what);
    auto rp = make_rig<opt_t>(C::lay, {}, scaler_options<typename C::scaler>(), 0xFA17);
    auto& r = *rp;
    std::mt19937_64 rng(0xFA17 + 1);
    const std::vector<int> faults{3, 4, 9, 14};  // two in a row: the dynamic scaler's hysteresis, then halving
    const double bad_values[] = {INFINITY, -INFINITY, NAN};
    int nfault = 0;
    for (int s = 0; s < 20; ++s) {
      CAPTURE(s);
      auto truth = random_grads(r.sizes, rng, s % 2 ? 3.0 : 0.3);
      const bool fault = std::find(faults.begin(), faults.end(), s) != faults.end();
      std::size_t ti = 0, pos = 0;
      if (fault) {
        ti = rng() % truth.size();
        const std::size_t n = truth[ti].size();
        pos = nfault % 3 == 0 ? 0 : nfault % 3 == 1 ? n - 1 : rng() % n;  // first, last, anywhere
        truth[ti][pos] = bad_values[nfault % 3];
      }
      CAPTURE(ti);
      CAPTURE(pos);
      const snapshot before = take(r.opt, r.params);
      const double scale = r.opt.loss_scale();
      const auto res = r.step(truth);
      r.check(res);
      if (fault) {
        CHECK(res.lib.result == mpopt::step_result::skipped_nonfinite);
        CHECK_FALSE(res.lib.applied);
        CHECK(res.lib.scale_before == scale);
        const snapshot after = take(r.opt, r.params);
        CHECK(after.params == before.params);
        CHECK(after.masters == before.masters);
        CHECK(after.m == before.m);
        CHECK(after.v == before.v);
        CHECK(after.coeffs == before.coeffs);
        CHECK(after.group_steps == before.group_steps);
        // The scale: static never moves; dynamic (hysteresis 2) keeps it on the first overflow and halves
        // it on every later one (the counter refills only at a window increase, 1000 clean steps away).
        if constexpr (std::is_same_v<typename C::scaler, mpopt::dynamic_scale>)
          CHECK(res.lib.scale_after == (nfault == 0 ? scale : scale / 2));
        else
          CHECK(res.lib.scale_after == scale);
        ++nfault;
      } else {
        CHECK(res.lib.applied);
      }
    }
    CHECK(r.opt.group(0).step() == 16);
  }

  TEST_CASE_TEMPLATE("without the check (skip_nonfinite = false, no_scaling) a NaN gradient reaches the weights", C,
                     UNSCALED_CFGS) {
    using opt_t = typename C::opt;
    const std::string what = C::describe();
    CAPTURE(what);
    auto rp = make_rig<opt_t>(C::lay, {.skip_nonfinite = false}, {}, 0x0A0, false);
    auto& r = *rp;
    std::mt19937_64 rng(0x0A1);
    for (int s = 0; s < 3; ++s) r.check(r.step(random_grads(r.sizes, rng, 0.5)));
    auto truth = random_grads(r.sizes, rng, 0.5);
    truth[2][150] = NAN;
    const auto res = r.step(truth);
    r.check(res);  // the reference lets the NaN through too
    CHECK(res.lib.result == mpopt::step_result::applied);
    CHECK(std::isnan(res.lib.grad_norm));
    CHECK(std::isnan(r.opt.master(2)[150]));
    CHECK(std::isnan(float(r.params[2][150])));
    CHECK(std::isnan(r.opt.moment(0, 2)[150]));
    CHECK(std::isnan(r.opt.moment(1, 2)[150]));
    CHECK(r.opt.group(0).step() == 4);
  }

  TEST_CASE_TEMPLATE("with nothing to know before the update (clip_grad = 0, skip_nonfinite = false) the update pass "
                     "sums the norm: the steps of a step with a gradient pass, bit for bit",
                     C, UNSCALED_CFGS) {
    using opt_t = typename C::opt;
    const std::string what = C::describe();
    CAPTURE(what);
    for (const int window : {1, 3}) {
      CAPTURE(window);
      // Fused: no separate gradient pass. Checked: a clip that never binds and the overflow check,
      // so the gradient is read first, and the same update follows.
      auto fused = make_rig<opt_t>(C::lay, {.clip_grad = 0, .accumulation_steps = window, .skip_nonfinite = false},
                                   {}, 0xF0, true);
      auto checked = make_rig<opt_t>(C::lay, {.clip_grad = 1e30, .accumulation_steps = window}, {}, 0xF0, true);
      std::mt19937_64 rng(0xF1);
      for (int s = 0; s < 4 * window; ++s) {
        const auto truth = random_grads(fused->sizes, rng, 3.0);
        const auto a = fused->step(truth), b = checked->step(truth);
        fused->check(a);
        checked->check(b);
        if (!a.lib.applied) continue;
        REQUIRE(b.lib.applied);
        // Both passes sum in double; the gradient pass rounds each chunk's sum to float precision
        // (so that any order adds it exactly): within the reference's tolerance, and of each other.
        CHECK(close(a.lib.grad_norm, b.lib.grad_norm, 1e-6));
        CHECK(a.lib.clip_coef == 1.0);
        CHECK(a.lib.grad_norm_clipped == a.lib.grad_norm);
        for (std::size_t i = 0; i < fused->sizes.size(); ++i) {
          CHECK(std::memcmp(fused->params[i].data(), checked->params[i].data(), fused->sizes[i] * sizeof(fused->params[i][0])) == 0);
          CHECK(std::memcmp(fused->opt.moment(1, i).data(), checked->opt.moment(1, i).data(), fused->sizes[i] * sizeof(float)) == 0);
        }
      }
      // A NaN gradient goes through, and the norm it gives says so.
      auto truth = random_grads(fused->sizes, rng, 3.0);
      truth[3][70000] = NAN;
      for (int m = 0; m < window; ++m) {
        const auto res = fused->step(truth);
        fused->check(res);
        if (m + 1 == window) CHECK((res.lib.applied && std::isnan(res.lib.grad_norm)));
      }
      CHECK(std::isnan(fused->opt.master(3)[70000]));
    }
  }

  TEST_CASE_TEMPLATE("gradient accumulation: 4 micro-steps make one step on their mean (or sum); micro-steps change nothing",
                     C, pcfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::unfused>,
                     pcfg<mpopt::fp16, mpopt::static_scale, mpopt::lamb, layout::flat>,
                     pcfg<mpopt::bf16, mpopt::no_scaling, mpopt::adam, layout::flat>,
                     pcfg<mpopt::bf16, mpopt::no_scaling, mpopt::lamb, layout::unfused>,
                     pcfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::flat>,
                     pcfg<mpopt::fp32, mpopt::no_scaling, mpopt::lamb, layout::unfused>) {
    using opt_t = typename C::opt;
    for (auto combine : {mpopt::accumulation::mean, mpopt::accumulation::sum}) {
      const std::string what = C::describe() + (combine == mpopt::accumulation::mean ? "+mean" : "+sum");
      CAPTURE(what);
      auto rp = make_rig<opt_t>(C::lay, {.accumulation_steps = 4, .combine = combine}, scaler_options<typename C::scaler>(),
                               0xACC, false);
      auto& r = *rp;
      // The same optimizer as a plain reference fed the combined gradient in one step: the meaning of
      // accumulation, independent of the reference's own micro-step code.
      ref::model plain = r.model;
      plain.accumulation_steps = 1;
      std::mt19937_64 rng(0xACC + 1);
      for (int b = 0; b < 6; ++b) {
        CAPTURE(b);
        std::vector<ref::tensor> combined(r.sizes.size());
        for (std::size_t i = 0; i < r.sizes.size(); ++i) combined[i].assign(r.sizes[i], 0.0);
        const double scale = r.opt.loss_scale();
        for (int micro = 1; micro <= 4; ++micro) {
          CAPTURE(micro);
          auto truth = random_grads(r.sizes, rng, 0.2 + 0.5 * micro);
          if (b == 3 && micro == 2) truth[1][3] = INFINITY;  // one overflowing micro-step spoils the boundary
          const snapshot before = take(r.opt, r.params);
          r.write_grads(truth);
          for (std::size_t i = 0; i < r.sizes.size(); ++i)
            for (std::size_t k = 0; k < r.sizes[i]; ++k) combined[i][k] += double(float(r.grads[i][k]));
          const auto res = r.step_written();
          r.check(res);
          if (micro < 4) {
            CHECK(res.lib.result == mpopt::step_result::accumulating);
            CHECK(res.lib.micro_step == micro);
            CHECK_FALSE(res.lib.applied);
            CHECK(take(r.opt, r.params) == before);
          } else {
            CHECK(res.lib.result == (b == 3 ? mpopt::step_result::skipped_nonfinite : mpopt::step_result::applied));
            if (b == 3) CHECK(take(r.opt, r.params) == before);
          }
        }
        if (combine == mpopt::accumulation::mean)
          for (auto& t : combined)
            for (double& x : t) x /= 4;
        (void)scale;
        const auto st = plain.step(combined);
        CHECK(st.result == (b == 3 ? ref::outcome::skipped_nonfinite : ref::outcome::applied));
        double worst = 0;
        for (std::size_t i = 0; i < r.sizes.size(); ++i)
          for (std::size_t k = 0; k < r.sizes[i]; ++k)
            worst = std::max(worst, std::abs(plain.p[i][k] - r.model.p[i][k]) / (std::abs(plain.p[i][k]) + 1e-30));
        CHECK(worst < 1e-12);  // float64 vs float64: the same computation up to double rounding
      }
      CHECK(r.opt.group(0).step() == 5);
    }
  }

  TEST_CASE_TEMPLATE("clipping: a norm far above clip_grad is scaled to clip_grad; clip_grad = 0 disables clipping", C,
                     pcfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::flat>,
                     pcfg<mpopt::bf16, mpopt::no_scaling, mpopt::lamb, layout::unfused>,
                     pcfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::unfused>) {
    using opt_t = typename C::opt;
    const std::string what = C::describe();
    CAPTURE(what);
    {
      auto rp = make_rig<opt_t>(C::lay, {.clip_grad = 0.5}, scaler_options<typename C::scaler>(), 0xC11, false);
      auto& r = *rp;
      std::mt19937_64 rng(0xC12);
      for (int s = 0; s < 5; ++s) {
        const auto res = r.step(random_grads(r.sizes, rng, 20.0));  // 20 / S per element stays finite in fp16
        r.check(res);
        REQUIRE(res.lib.applied);
        CHECK(close(res.lib.grad_norm, 20.0, 1e-2));  // the grads are rounded to G
        CHECK(close(res.lib.grad_norm_clipped, 0.5, 1e-6));
        CHECK(close(res.lib.clip_coef, 0.5 / (res.lib.grad_norm + 1e-6), 1e-6));
      }
    }
    {
      auto rp = make_rig<opt_t>(C::lay, {.clip_grad = 0}, scaler_options<typename C::scaler>(), 0xC13, false);
      auto& r = *rp;
      std::mt19937_64 rng(0xC14);
      for (int s = 0; s < 5; ++s) {
        const auto res = r.step(random_grads(r.sizes, rng, 20.0));
        r.check(res);
        REQUIRE(res.lib.applied);
        CHECK(res.lib.clip_coef == 1.0);
        CHECK(res.lib.grad_norm_clipped == res.lib.grad_norm);
      }
    }
  }

  TEST_CASE_TEMPLATE("parameter groups keep their own lr and weight decay; set_lr and set_options take effect at the next step",
                     C, pcfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::unfused>,
                     pcfg<mpopt::bf16, mpopt::no_scaling, mpopt::lamb, layout::flat>,
                     pcfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::flat>) {
    using opt_t = typename C::opt;
    const std::string what = C::describe();
    CAPTURE(what);
    auto rp = make_rig<opt_t>(C::lay, {}, scaler_options<typename C::scaler>(), 0x6A0, false);
    auto& r = *rp;
    typename opt_t::group_options third;
    third.lr = 5e-3;
    third.weight_decay = 0.2;
    r.add_group(third, {17, 2}, 0x6A1);
    std::mt19937_64 rng(0x6A2);
    for (int s = 0; s < 15; ++s) {
      CAPTURE(s);
      if (s == 5) {
        r.opt.group(1).set_lr(4e-3);
        r.model.groups[1].h.lr = 4e-3;
      }
      if (s == 9) {
        auto o = r.opt.group(2).options();
        o.weight_decay = 0.0;
        o.lr = 1e-4;
        r.opt.group(2).set_options(o);
        r.model.groups[2].h = to_ref(o);
        r.opt.group(0).set_lr(0.0);  // lr 0 freezes group 0 (decay included)
        r.model.groups[0].h.lr = 0.0;
      }
      const auto res = r.step(random_grads(r.sizes, rng, s % 2 ? 2.0 : 0.5));
      r.check(res);
      CHECK(res.lib.applied);
    }
    CHECK(r.opt.group(1).lr() == 4e-3);
  }

  TEST_CASE("at_min_scale::raise throws naming the tensor with the non-finite gradient and leaves the state unchanged") {
    using opt_t = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam, test_backend>;
    for (layout lay : {layout::unfused, layout::flat}) {
      CAPTURE(int(lay));
      auto rp = make_rig<opt_t>(lay, {}, {.init_scale = 4, .min_scale = 1, .hysteresis = 1}, 0x4A1, false);
      auto& r = *rp;
      std::mt19937_64 rng(0x4A2);
      r.check(r.step(random_grads(r.sizes, rng, 0.5)));
      for (int k = 0; k < 3; ++k) {  // 4 -> 2 -> 1, then the third overflow at the minimum raises
        CAPTURE(k);
        auto truth = random_grads(r.sizes, rng, 0.5);
        truth[4][1] = NAN;
        const snapshot before = take(r.opt, r.params);
        const auto res = r.step(truth);
        r.check(res);
        if (k < 2) {
          CHECK(res.lib.result == mpopt::step_result::skipped_nonfinite);
          CHECK(res.lib.scale_after == (k == 0 ? 2.0 : 1.0));
        } else {
          REQUIRE(res.ref.result == ref::outcome::error);
          CHECK(res.ref.bad_tensor == 4);
          CHECK_MESSAGE(r.last_error.find(r.names[4]) != std::string::npos, r.last_error);
          CHECK(take(r.opt, r.params) == before);
          CHECK(r.opt.loss_scale() == 1.0);
        }
      }
      for (int s = 0; s < 3; ++s) {  // training goes on after the error
        const auto res = r.step(random_grads(r.sizes, rng, 0.5));
        r.check(res);
        CHECK(res.lib.applied);
      }
    }
  }

  TEST_CASE("at_min_scale::keep_skipping keeps skipping at the minimum scale without throwing") {
    using opt_t = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::lamb, test_backend>;
    auto rp = make_rig<opt_t>(layout::flat, {},
                             {.init_scale = 2, .min_scale = 1, .hysteresis = 1, .on_min_scale = mpopt::at_min_scale::keep_skipping},
                             0x4B1, false);
    auto& r = *rp;
    std::mt19937_64 rng(0x4B2);
    for (int s = 0; s < 6; ++s) {
      auto truth = random_grads(r.sizes, rng, 0.5);
      truth[0][0] = -INFINITY;
      const snapshot before = take(r.opt, r.params);
      const auto res = r.step(truth);
      r.check(res);
      CHECK(res.lib.result == mpopt::step_result::skipped_nonfinite);
      CHECK(res.lib.scale_after == 1.0);
      CHECK(res.lib.consecutive_skips == std::uint64_t(s + 1));
      CHECK(take(r.opt, r.params).params == before.params);
    }
    const auto res = r.step(random_grads(r.sizes, rng, 0.5));
    r.check(res);
    CHECK(res.lib.applied);
    CHECK(res.lib.skipped_steps == 6);
    CHECK(res.lib.consecutive_skips == 0);
  }

  TEST_CASE_TEMPLATE("max_consecutive_skips throws when that many skips in a row would be reached", C,
                     pcfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::unfused>,
                     pcfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::lamb, layout::flat>) {
    using opt_t = typename C::opt;
    const std::string what = C::describe();
    CAPTURE(what);
    auto so = scaler_options<typename C::scaler>();
    auto rp = make_rig<opt_t>(C::lay, {.max_consecutive_skips = 3}, so, 0x3C1, false);
    auto& r = *rp;
    std::mt19937_64 rng(0x3C2);
    // skip, skip, clean (resets the count), skip, skip, third skip in a row throws, clean
    const std::vector<int> bad{1, 1, 0, 1, 1, 1, 0};
    for (std::size_t s = 0; s < bad.size(); ++s) {
      CAPTURE(s);
      auto truth = random_grads(r.sizes, rng, 0.5);
      if (bad[s]) truth[2][0] = NAN;
      const snapshot before = take(r.opt, r.params);
      const auto res = r.step(truth);
      r.check(res);
      if (s == 5) {
        CHECK(res.ref.result == ref::outcome::error);
        CHECK_MESSAGE(r.last_error.find("consecutive") != std::string::npos, r.last_error);
        CHECK(take(r.opt, r.params) == before);
      } else {
        CHECK(res.lib.applied == !bad[s]);
      }
    }
  }

  TEST_CASE_TEMPLATE("finite gradients up to the largest finite value clip and never skip: one whose square is no float, "
                     "a sum of squares beyond float, elements at the largest finite value",
                     C, pcfg<mpopt::bf16, mpopt::no_scaling, mpopt::adam, layout::unfused>,
                     pcfg<mpopt::fp32, mpopt::no_scaling, mpopt::lamb, layout::flat>) {
    using opt_t = typename C::opt;
    using G = typename opt_t::grad_type;
    const double largest = std::is_same_v<G, float> ? double(std::numeric_limits<float>::max()) : 0x1.fep127;
    const std::string what = C::describe();
    CAPTURE(what);
    auto rp = make_rig<opt_t>(C::lay, {.clip_grad = 1.0}, {}, 0x5A1, false);
    auto& r = *rp;
    std::mt19937_64 rng(0x5A2);
    // The other elements are of a size that clipping leaves normal floats (0.5 / 1e20 would leave
    // moments far below float's normal range, which the float64 reference keeps).
    const double sigma[] = {1e19, 1e18, 1e37, 0.5};
    for (int s = 0; s < 4; ++s) {
      CAPTURE(s);
      auto g = random_grads(r.sizes, rng, sigma[s]);
      if (s == 0) g[3][10] = 1e20;  // its square, 1e40, is no float
      if (s == 1)
        for (auto& t : g) std::fill(t.begin(), t.end(), 1e18);  // each square a float, their sum not
      if (s == 2) g[1][0] = largest, g[2][1] = -largest;  // the norm itself beyond float
      const auto res = r.step(g);  // against the float64 reference, which never skips a finite step
      r.check(res);
      REQUIRE(res.lib.applied);
      CHECK(std::isfinite(res.lib.grad_norm));
      CHECK(res.lib.clip_coef < (s == 3 ? 1.0 + 1e-9 : 1e-15));
    }
  }

  TEST_CASE("zero_grad sets every gradient to +0 in both layouts and leaves parameters and state alone") {
    using opt_t = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam, test_backend>;
    for (const layout lay : {layout::unfused, layout::flat}) {
      auto rp = make_rig<opt_t>(lay, {}, {}, 0x2E40, false);
      auto& r = *rp;
      std::mt19937_64 rng(0x2E41);
      r.check(r.step(random_grads(r.sizes, rng, 0.5)));
      // Fill every gradient with nonzero values (also -0 and inf, whose bits must go too).
      for (std::size_t g = 0; g < r.opt.group_count(); ++g)
        for (std::size_t t = 0; t < r.opt.group(g).size(); ++t) {
          auto grad = r.opt.group(g).grad(t);
          for (std::size_t i = 0; i < grad.size(); ++i)
            grad[i] = mpopt::half(i % 3 == 0 ? -0.0f : (i % 3 == 1 ? 1.5f : INFINITY));
        }
      const snapshot before = take(r.opt, r.params);
      r.opt.zero_grad();
      std::size_t checked = 0;
      for (std::size_t g = 0; g < r.opt.group_count(); ++g)
        for (std::size_t t = 0; t < r.opt.group(g).size(); ++t)
          for (const mpopt::half x : r.opt.group(g).grad(t)) {
            CHECK(x.bits == 0);
            ++checked;
          }
      CHECK(checked > 0);
      CHECK(take(r.opt, r.params) == before);
    }
  }
}
