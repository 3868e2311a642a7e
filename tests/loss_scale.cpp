// Tests for the loss-scaler policies (include/mpopt/loss_scale.hpp), on the scaler classes directly and
// through a real fp16 optimizer whose gradients overflow on chosen steps. Every scenario is checked
// against an independent transcription of DeepSpeed's DynamicLossScaler.update_scale
// (docs/design.md §3.1) and, for the DeepSpeed unit-test schedules
// (test_dynamic_loss_scale.py, test_zero_optim_overflow.py, test_fp16.py), against sequences derived by hand.
#include <doctest/doctest.h>

#include <mpopt/mpopt.hpp>

#include "test_backend.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr float f_inf = std::numeric_limits<float>::infinity();
constexpr float f_nan = std::numeric_limits<float>::quiet_NaN();

// ---------------------------------------------------------------------------------------------------
// The model: DeepSpeed's DynamicLossScaler.update_scale, transcribed line by line from the pseudo-code
// (scale_factor fixed at 2). It shares nothing with the library.
struct deepspeed_scaler {
  struct raised {};  // "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."

  double cur_scale;
  std::int64_t scale_window;
  double min_scale;
  std::int64_t delayed_shift;
  bool consecutive_hysteresis;
  bool raise_error_at_min_scale;
  std::int64_t cur_iter = 0;
  std::int64_t last_overflow_iter = -1;
  std::int64_t cur_hysteresis;
  // Not DeepSpeed's: our one decision against its rule, a largest scale (its scale doubles without end).
  double max_scale = std::numeric_limits<double>::infinity();

  explicit deepspeed_scaler(const mpopt::dynamic_scale_options& o)
      : cur_scale(o.init_scale),
        scale_window(o.window),
        min_scale(o.min_scale),
        delayed_shift(o.hysteresis),
        consecutive_hysteresis(o.consecutive_hysteresis),
        raise_error_at_min_scale(o.on_min_scale == mpopt::at_min_scale::raise),
        cur_hysteresis(o.hysteresis) {}

  // Python raises before touching any attribute, so after `raised` the model is unchanged.
  void update_scale(bool overflow) {
    if (overflow) {
      if (delayed_shift == 1 || cur_hysteresis == 1) {
        if (cur_scale == min_scale && raise_error_at_min_scale) throw raised{};
        cur_scale = std::max(cur_scale / 2.0, min_scale);
      } else {
        cur_hysteresis -= 1;
      }
      last_overflow_iter = cur_iter;
    } else {
      if (consecutive_hysteresis) cur_hysteresis = delayed_shift;
      const std::int64_t stable = cur_iter - last_overflow_iter - 1;
      if (stable > 0 && stable % scale_window == 0) {
        if (!consecutive_hysteresis) cur_hysteresis = delayed_shift;
        cur_scale = std::min(cur_scale * 2.0, max_scale);
      }
    }
    cur_iter += 1;
  }

  // Whether update_scale(overflow) would raise, without calling it.
  bool would_raise(bool overflow) const {
    try {
      deepspeed_scaler copy = *this;
      copy.update_scale(overflow);
      return false;
    } catch (const raised&) {
      return true;
    }
  }
};

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// ---------------------------------------------------------------------------------------------------
// A real fp16 optimizer over two user-owned tensors in two groups. Clean steps write finite gradients
// (already "multiplied by the loss scale": their value does not matter to the scaler); an overflow step
// writes one non-finite element into a chosen tensor.
template <class Scaler, class Rule = mpopt::adam>
struct fp16_rig {
  using opt_t = mpopt::optimizer<mpopt::fp16, Scaler, mpopt::replicated, Rule, test_backend>;

  std::vector<mpopt::half> p0, g0, p1, g1;
  opt_t opt;
  std::uint64_t step_index = 0;

  explicit fp16_rig(typename Scaler::options s, mpopt::optimizer_options o = {}) : opt(o, s) {
    for (int i = 0; i < 37; ++i) p0.push_back(mpopt::half(0.01f * float(i - 18)));
    for (int i = 0; i < 5; ++i) p1.push_back(mpopt::half(0.5f - 0.125f * float(i)));
    g0.assign(p0.size(), mpopt::half(0.0f));
    g1.assign(p1.size(), mpopt::half(0.0f));
    opt.add_group({.lr = 1e-2}).add(p0, g0, "weight");
    opt.add_group({.lr = 1e-2, .weight_decay = 0.1}).add(p1, g1, "bias");
  }
  fp16_rig(const fp16_rig&) = delete;
  fp16_rig& operator=(const fp16_rig&) = delete;

  void write_grads(bool overflow, float bad = f_inf) {
    ++step_index;
    for (std::size_t i = 0; i < g0.size(); ++i)
      g0[i] = mpopt::half(0.25f * std::sin(float(step_index * 7 + i)));
    for (std::size_t i = 0; i < g1.size(); ++i)
      g1[i] = mpopt::half(-0.5f * std::cos(float(step_index * 3 + i)));
    if (overflow) {
      auto& g = (step_index % 2) ? g0 : g1;
      g[step_index % g.size()] = mpopt::half(bad);
    }
  }

  mpopt::step_status step(bool overflow, float bad = f_inf) {
    write_grads(overflow, bad);
    return opt.step();
  }

  // Everything the optimizer lets us observe, bitwise (after the first step).
  struct snapshot {
    std::vector<std::uint16_t> params;
    std::vector<std::uint32_t> state;
    std::vector<std::uint64_t> steps;
    double scale;
    bool operator==(const snapshot&) const = default;
  };
  snapshot snap() {
    snapshot s;
    for (auto* p : {&p0, &p1})
      for (auto h : *p) s.params.push_back(h.bits);
    for (std::size_t t = 0; t < opt.tensor_count(); ++t) {
      for (float f : opt.master(t)) s.state.push_back(bits(f));
      for (std::size_t k = 0; k < 2; ++k)
        for (float f : opt.moment(k, t)) s.state.push_back(bits(f));
    }
    for (std::size_t g = 0; g < opt.group_count(); ++g) s.steps.push_back(opt.group(g).step());
    s.scale = opt.loss_scale();
    return s;
  }
};

using fp16_dynamic = fp16_rig<mpopt::dynamic_scale>;
using fp16_static = fp16_rig<mpopt::static_scale>;

// Runs `overflows` on the scaler class, on the model and through an fp16 optimizer, checking all three
// agree after every step, and returns the scale after each step. The schedule must not raise.
std::vector<double> run_schedule(const mpopt::dynamic_scale_options& o, const std::vector<bool>& overflows) {
  mpopt::dynamic_scale scaler(o);
  deepspeed_scaler model(o);
  model.max_scale = mpopt::max_loss_scale;
  fp16_dynamic rig(o);
  std::vector<double> after;
  std::uint64_t skipped = 0, consecutive = 0, applied = 0;
  for (std::size_t i = 0; i < overflows.size(); ++i) {
    CAPTURE(i);
    const bool ov = overflows[i];
    const double before = model.cur_scale;
    REQUIRE(scaler.scale() == before);
    REQUIRE(rig.opt.loss_scale() == before);
    CHECK_FALSE(scaler.raises_on(ov));

    std::optional<fp16_dynamic::snapshot> pre;
    if (i > 0) pre = rig.snap();
    model.update_scale(ov);
    scaler.update(ov);
    const auto st = rig.step(ov, (i % 3 == 0) ? f_inf : (i % 3 == 1 ? -f_inf : f_nan));

    CHECK(scaler.scale() == model.cur_scale);
    CHECK(scaler.iteration() == model.cur_iter);
    CHECK(scaler.hysteresis_left() == model.cur_hysteresis);
    CHECK(st.scale_before == before);
    CHECK(st.scale_after == model.cur_scale);
    CHECK(rig.opt.loss_scale() == model.cur_scale);
    CHECK(rig.opt.scaler().iteration() == model.cur_iter);
    CHECK(rig.opt.scaler().hysteresis_left() == model.cur_hysteresis);
    if (ov) {
      ++skipped;
      ++consecutive;
      CHECK(st.result == mpopt::step_result::skipped_nonfinite);
      CHECK_FALSE(st.applied);
      if (pre) {
        auto post = rig.snap();
        post.scale = pre->scale;  // the scale may legitimately move on a skipped step
        CHECK(post == *pre);      // params, masters, moments, step counters bit-identical
      }
    } else {
      ++applied;
      consecutive = 0;
      CHECK(st.result == mpopt::step_result::applied);
      CHECK(st.applied);
    }
    CHECK(st.skipped_steps == skipped);
    CHECK(st.consecutive_skips == consecutive);
    CHECK(st.step == applied);
    after.push_back(st.scale_after);
  }
  return after;
}

std::vector<bool> clean(std::size_t n) { return std::vector<bool>(n, false); }
std::vector<bool> overflow(std::size_t n) { return std::vector<bool>(n, true); }
std::vector<bool> operator+(std::vector<bool> a, const std::vector<bool>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST_SUITE("loss_scale") {

TEST_CASE("the model transcribes DeepSpeed's update_scale (self-check on hand-derived values)") {
  // Guards the reference itself: a model that never doubles or never halves must not pass silently.
  deepspeed_scaler m({.init_scale = 256, .window = 2, .min_scale = 1, .hysteresis = 2});
  for (int i = 0; i < 3; ++i) m.update_scale(false);
  CHECK(m.cur_scale == 512);
  CHECK(m.cur_iter == 3);
  m.update_scale(true);
  CHECK(m.cur_scale == 512);
  CHECK(m.cur_hysteresis == 1);
  m.update_scale(true);
  CHECK(m.cur_scale == 256);
  CHECK(m.last_overflow_iter == 4);
  deepspeed_scaler at_min({.init_scale = 1, .window = 2, .min_scale = 1, .hysteresis = 1});
  CHECK(at_min.would_raise(true));
  CHECK_FALSE(at_min.would_raise(false));
  CHECK_THROWS_AS(at_min.update_scale(true), deepspeed_scaler::raised);
  CHECK(at_min.cur_iter == 0);
}

TEST_CASE("defaults are DeepSpeed's fp16 config defaults") {
  const mpopt::dynamic_scale_options o;
  CHECK(o.init_scale == 65536.0);
  CHECK(o.window == 1000);
  CHECK(o.min_scale == 1.0);
  CHECK(o.hysteresis == 2);
  CHECK_FALSE(o.consecutive_hysteresis);
  CHECK(o.on_min_scale == mpopt::at_min_scale::raise);
  mpopt::dynamic_scale s;
  CHECK(s.scale() == 65536.0);
  CHECK(s.iteration() == 0);
  CHECK(s.hysteresis_left() == 2);
  CHECK(mpopt::dynamic_scale::factor == 2.0);
}

TEST_CASE("no overflow, init 2^8, window 2: the scale doubles after steps 3, 5, 7 (cur_iter 2, 4, 6)") {
  const mpopt::dynamic_scale_options o{.init_scale = 256, .window = 2};
  // Hand-derived: stable = cur_iter - last_overflow_iter - 1 = cur_iter; it doubles at cur_iter 2, 4, 6.
  // DeepSpeed's test checks the scale, then doubles its expectation when cur_iter % 2 == 0.
  const std::vector<double> expected{256, 256, 512, 512, 1024, 1024, 2048, 2048, 4096, 4096};
  CHECK(run_schedule(o, clean(10)) == expected);

  mpopt::dynamic_scale s(o);
  double expected_loss_scale = 256;
  for (int i = 0; i < 10; ++i) {
    s.update(false);
    CHECK(s.scale() == expected_loss_scale);  // test_dynamic_loss_scale.py::test_no_overflow
    CHECK(s.iteration() == i + 1);
    if (s.iteration() % 2 == 0) expected_loss_scale *= 2;
  }
}

TEST_CASE("all overflow from 2^4, hysteresis 1, min 1, keep_skipping: halves to 1 and stays there") {
  const mpopt::dynamic_scale_options o{.init_scale = 16, .window = 2, .min_scale = 1, .hysteresis = 1,
                                       .on_min_scale = mpopt::at_min_scale::keep_skipping};
  const std::vector<double> expected{8, 4, 2, 1, 1, 1, 1, 1, 1, 1};
  CHECK(run_schedule(o, overflow(10)) == expected);

  mpopt::dynamic_scale s(o);
  double expected_loss_scale = 16;
  for (int i = 0; i < 10; ++i) {  // test_dynamic_loss_scale.py::test_all_overflow
    CHECK_FALSE(s.raises_on(true));
    s.update(true);
    expected_loss_scale = std::max(expected_loss_scale / 2, 1.0);
    CHECK(s.scale() == expected_loss_scale);
    CHECK(s.iteration() == i + 1);
  }
}

TEST_CASE("all overflow with the default raise policy: throws mpopt::error at the first overflow at min scale") {
  const mpopt::dynamic_scale_options o{.init_scale = 16, .window = 2, .min_scale = 1, .hysteresis = 1};
  mpopt::dynamic_scale s(o);
  for (double want : {8.0, 4.0, 2.0, 1.0}) {
    CHECK_FALSE(s.raises_on(true));
    s.update(true);
    CHECK(s.scale() == want);
  }
  CHECK(s.raises_on(true));
  CHECK_FALSE(s.raises_on(false));

  fp16_dynamic rig(o);
  for (double want : {8.0, 4.0, 2.0, 1.0}) CHECK(rig.step(true).scale_after == want);
  const auto before = rig.snap();
  const auto iter = rig.opt.scaler().iteration();
  bool threw = false;
  try {
    rig.step(true);
  } catch (const mpopt::error& e) {
    threw = true;
    const std::string what = e.what();
    CHECK(what.find("minimum") != std::string::npos);
    CHECK(what.find("weight") != std::string::npos);  // names the non-finite tensor (step 5 corrupts g0)
  }
  CHECK(threw);
  CHECK(rig.snap() == before);
  CHECK(rig.opt.scaler().iteration() == iter);
  CHECK(rig.opt.loss_scale() == 1.0);
  // The run can go on: a clean step applies at scale 1, and the skip counters were not advanced by the throw.
  const auto st = rig.step(false);
  CHECK(st.applied);
  CHECK(st.scale_before == 1.0);
  CHECK(st.skipped_steps == 4);
}

TEST_CASE("raise at min scale at an accumulation boundary leaves the accumulation window as it was") {
  // The throw must leave the optimizer's state unchanged (error.hpp), including the micro-step counter:
  // calling step() again retries the same boundary and throws again, instead of silently starting a new
  // accumulation window that drops the micro-steps already folded in.
  const mpopt::dynamic_scale_options o{.init_scale = 1, .window = 2, .min_scale = 1, .hysteresis = 1};
  fp16_dynamic rig(o, {.accumulation_steps = 2});
  CHECK(rig.step(false).result == mpopt::step_result::accumulating);
  CHECK_THROWS_AS(rig.step(true), mpopt::error);
  // Same gradients still in place: retrying the boundary must throw again.
  CHECK_THROWS_AS(rig.opt.step(), mpopt::error);
}

TEST_CASE("some overflow (test_dynamic_loss_scale.py): 2 overflows give S/4, window+1 clean give x2, 1 overflow /2") {
  const mpopt::dynamic_scale_options o{.init_scale = 256, .window = 2, .hysteresis = 1};
  // cur_iter 0,1 overflow: 128, 64 (last_overflow_iter 1); cur_iter 2,3,4 clean: stable 0,1,2 -> x2 at 4;
  // cur_iter 5 overflow: /2.
  const std::vector<double> expected{128, 64, 64, 64, 128, 64};
  CHECK(run_schedule(o, overflow(2) + clean(3) + overflow(1)) == expected);

  mpopt::dynamic_scale s(o);
  double expected_loss_scale = 256;
  std::int64_t expected_iteration = 0;
  for (int i = 0; i < 2; ++i) s.update(true);
  expected_iteration += 2;
  expected_loss_scale /= 4;
  CHECK(s.scale() == expected_loss_scale);
  CHECK(s.iteration() == expected_iteration);
  for (int i = 0; i < 3; ++i) s.update(false);
  expected_iteration += 3;
  expected_loss_scale *= 2;
  CHECK(s.scale() == expected_loss_scale);
  CHECK(s.iteration() == expected_iteration);
  s.update(true);
  expected_iteration += 1;
  expected_loss_scale /= 2;
  CHECK(s.scale() == expected_loss_scale);
  CHECK(s.iteration() == expected_iteration);
}

TEST_CASE("hysteresis 2 (default): the first overflow keeps the scale, the second halves") {
  const mpopt::dynamic_scale_options o{.init_scale = 1024, .window = 1000};
  CHECK(o.hysteresis == 2);
  CHECK(run_schedule(o, overflow(4)) == std::vector<double>{1024, 512, 256, 128});

  mpopt::dynamic_scale s(o);
  s.update(true);
  CHECK(s.scale() == 1024);
  CHECK(s.hysteresis_left() == 1);
  s.update(true);
  CHECK(s.scale() == 512);
  CHECK(s.hysteresis_left() == 1);  // stays 1: every further overflow halves until a window increase
}

TEST_CASE("hysteresis is refilled by a window increase when consecutive_hysteresis is false") {
  const mpopt::dynamic_scale_options o{.init_scale = 1024, .window = 2, .hysteresis = 2};
  // cur_iter 0 overflow: h 1; 1, 2 clean: stable 0, 1; 3 clean: stable 2 -> 2048, h refilled to 2;
  // 4 overflow: h 1, no halving; 5 overflow: halves.
  CHECK(run_schedule(o, overflow(1) + clean(3) + overflow(2)) ==
        std::vector<double>{1024, 1024, 1024, 2048, 2048, 1024});
}

TEST_CASE("consecutive_hysteresis true refills on every clean step, false does not") {
  mpopt::dynamic_scale_options o{.init_scale = 1024, .window = 1000, .hysteresis = 2};
  const auto schedule = overflow(1) + clean(1) + overflow(2);
  o.consecutive_hysteresis = false;
  // h: 1 after the overflow, still 1 after the clean step (no window increase), so both overflows halve.
  CHECK(run_schedule(o, schedule) == std::vector<double>{1024, 1024, 512, 256});
  o.consecutive_hysteresis = true;
  // h: 1, refilled to 2 by the clean step, 1 (no halving), then halves.
  CHECK(run_schedule(o, schedule) == std::vector<double>{1024, 1024, 1024, 512});

  mpopt::dynamic_scale a({.init_scale = 64, .window = 1000, .hysteresis = 3, .consecutive_hysteresis = true});
  mpopt::dynamic_scale b({.init_scale = 64, .window = 1000, .hysteresis = 3, .consecutive_hysteresis = false});
  for (auto* s : {&a, &b}) {
    s->update(true);
    s->update(true);
    s->update(false);
  }
  CHECK(a.hysteresis_left() == 3);
  CHECK(b.hysteresis_left() == 1);
}

TEST_CASE("ZeRO overflow schedule: 8 overflows take 2^8 to 1 with hysteresis 1 (no raise on the way)") {
  const mpopt::dynamic_scale_options o{.init_scale = 256, .window = 2, .min_scale = 1, .hysteresis = 1};
  CHECK(o.on_min_scale == mpopt::at_min_scale::raise);
  CHECK(run_schedule(o, overflow(8)) == std::vector<double>{128, 64, 32, 16, 8, 4, 2, 1});
  // And the ninth overflow, now at the minimum, raises.
  fp16_dynamic rig(o);
  for (int i = 0; i < 8; ++i) rig.step(true);
  CHECK(rig.opt.loss_scale() == 1.0);
  CHECK_THROWS_AS(rig.step(true), mpopt::error);
  CHECK(rig.opt.loss_scale() == 1.0);
}

TEST_CASE("ZeRO no-overflow schedule: init 2^8, window 2, no skips") {
  const mpopt::dynamic_scale_options o{.init_scale = 256, .window = 2, .min_scale = 1, .hysteresis = 1};
  fp16_dynamic rig(o);
  for (int i = 0; i < 8; ++i) {
    const auto st = rig.step(false);
    CHECK(st.applied);
    CHECK(st.skipped_steps == 0);
  }
  CHECK(rig.opt.loss_scale() == 256.0 * 8);
}

TEST_CASE("the minimum scale is a floor that need not be a power of two") {
  const mpopt::dynamic_scale_options o{.init_scale = 100, .window = 3, .min_scale = 30, .hysteresis = 1,
                                       .on_min_scale = mpopt::at_min_scale::keep_skipping};
  // 100 -> 50 -> max(25, 30) = 30 -> 30; then 3 clean after the last overflow... doubles at stable 3.
  CHECK(run_schedule(o, overflow(3) + clean(4)) == std::vector<double>{50, 30, 30, 30, 30, 30, 60});
}

TEST_CASE("the scale stops doubling at mpopt::max_loss_scale, 2^64 (DeepSpeed's would grow without end)") {
  mpopt::dynamic_scale s({.init_scale = 0x1p62, .window = 1, .hysteresis = 1});
  deepspeed_scaler m({.init_scale = 0x1p62, .window = 1, .min_scale = 1, .hysteresis = 1});
  for (int i = 0; i < 6; ++i) {
    s.update(false);
    m.update_scale(false);
    CHECK(s.scale() == std::min(m.cur_scale, 0x1p64));  // the same rule below the cap
  }
  CHECK(m.cur_scale > 0x1p64);
  CHECK(s.scale() == mpopt::max_loss_scale);
  s.update(true);  // and halves from there on overflow
  CHECK(s.scale() == 0x1p63);
}

TEST_CASE("static_scale 138: constant scale; an overflow still skips the step and leaves the scale alone") {
  mpopt::static_scale s({.scale = 138});
  CHECK(s.scale() == 138);
  CHECK_FALSE(s.raises_on(true));
  s.update(true);
  s.update(false);
  CHECK(s.scale() == 138);

  fp16_static rig({.scale = 138});
  CHECK(rig.opt.loss_scale() == 138);
  std::uint64_t applied = 0, skipped = 0;
  for (int i = 0; i < 12; ++i) {
    CAPTURE(i);
    const bool ov = (i % 3 == 1) || i == 5;  // overflows at 1, 4, 5, 7, 10: two in a row at 4 and 5
    std::optional<fp16_static::snapshot> pre;
    if (i > 0) pre = rig.snap();
    const auto st = rig.step(ov, i % 2 ? f_nan : -f_inf);
    CHECK(st.scale_before == 138);
    CHECK(st.scale_after == 138);
    CHECK(rig.opt.loss_scale() == 138);
    if (ov) {
      ++skipped;
      CHECK(st.result == mpopt::step_result::skipped_nonfinite);
      if (pre) CHECK(rig.snap() == *pre);
    } else {
      ++applied;
      CHECK(st.applied);
      if (pre) CHECK(rig.snap().params != pre->params);  // the weights moved
    }
    CHECK(st.skipped_steps == skipped);
    CHECK(st.step == applied);
  }
}

TEST_CASE("static_scale: the true gradient is the written gradient divided by the scale") {
  // fp16 grads k/128 * 138 are exact in fp16 (k*138 < 2048), so the unscaled gradient is k/128 up to the
  // rounding of 1/138: with SGD-like Adam at step 1 (update = lr * sign(g) for |g| >> eps) the params
  // move by exactly lr both ways; the norm reported is the norm of the true gradient.
  using opt_t = mpopt::optimizer<mpopt::fp16, mpopt::static_scale, mpopt::replicated, mpopt::adam, test_backend>;
  std::vector<mpopt::half> p(8, mpopt::half(1.0f)), g(8);
  opt_t opt({.clip_grad = 0}, {.scale = 138});
  opt.add_group({.lr = 0.25}).add(p, g, "w");
  double sumsq = 0;
  for (int k = 0; k < 8; ++k) {
    const float true_g = float(k + 1) / 128.0f;
    g[k] = mpopt::half(true_g * 138.0f);
    REQUIRE(float(g[k]) == true_g * 138.0f);
    sumsq += double(true_g) * true_g;
  }
  const auto st = opt.step();
  REQUIRE(st.applied);
  CHECK(st.grad_norm == doctest::Approx(std::sqrt(sumsq)).epsilon(1e-6));
  for (int k = 0; k < 8; ++k) CHECK(float(p[k]) == 0.75f);
}

TEST_CASE("no_scaling: the scale is 1 and never moves") {
  mpopt::no_scaling s;
  s.update(true);
  CHECK(s.scale() == 1.0);
  CHECK_FALSE(s.raises_on(true));
}

namespace {
/// A scaler of your own that serves bf16 and fp32 as well as fp16: a constant power of two, so that
/// scaling and unscaling are exact unless a gradient overflows.
struct power_of_two_options {
  int exponent = 8;
  static constexpr auto fields = mpopt::fields(mpopt::field{"exponent", &power_of_two_options::exponent});
};
struct power_of_two_scale {
  using options = power_of_two_options;
  static constexpr std::string_view name = "power_of_two_scale";
  template <class Grad>
  static constexpr bool serves = true;

  struct state {
    std::int64_t overflows = 0;
    static constexpr auto fields = mpopt::fields(mpopt::field{"overflows", &state::overflows});
  };

  explicit power_of_two_scale(options o = {}) : options_(o), scale_(std::ldexp(1.0, o.exponent)) {}
  double scale() const { return scale_; }
  bool raises_on(bool) const { return false; }
  void update(bool overflow) { overflows += overflow; }
  options config() const { return options_; }
  state save() const { return {overflows}; }
  void load(const state& s) { overflows = s.overflows; }

  options options_;
  double scale_;
  std::int64_t overflows = 0;
};
}  // namespace

static_assert(mpopt::scaler_serves<power_of_two_scale, mpopt::bfloat16>);
static_assert(mpopt::scaler_serves<power_of_two_scale, float>);
static_assert(mpopt::scaler_serves<mpopt::no_scaling, mpopt::bfloat16>);
static_assert(mpopt::scaler_serves<mpopt::dynamic_scale, mpopt::half>);
static_assert(!mpopt::scaler_serves<mpopt::dynamic_scale, mpopt::bfloat16>);
static_assert(!mpopt::scaler_serves<mpopt::static_scale, float>);

TEST_CASE_TEMPLATE("a scaler of your own may serve bf16 and fp32: at 2^8 it trains bit for bit as no_scaling does, and "
                   "an overflow skips the step",
                   P, mpopt::bf16, mpopt::fp32) {
  using G = typename P::grad_type;
  using W = typename P::param_type;
  mpopt::optimizer<P, power_of_two_scale, mpopt::replicated, mpopt::adam, test_backend> scaled({}, {.exponent = 8});
  mpopt::optimizer<P, mpopt::no_scaling, mpopt::replicated, mpopt::adam, test_backend> plain;
  const std::size_t n = 1001;
  std::vector<W> w1(n), w2(n);
  std::vector<G> g1(n), g2(n);
  for (std::size_t i = 0; i < n; ++i) w1[i] = w2[i] = W(0.5f * std::sin(0.1f * float(i)));
  scaled.add_group({.lr = 1e-2}).add(w1, g1, "w");
  plain.add_group({.lr = 1e-2}).add(w2, g2, "w");
  auto same = [&] {
    for (std::size_t i = 0; i < n; ++i)
      if (float(w1[i]) != float(w2[i]) || scaled.master(0)[i] != plain.master(0)[i]) return false;
    return true;
  };
  for (int s = 0; s < 20; ++s) {
    CAPTURE(s);
    for (std::size_t i = 0; i < n; ++i) {
      g2[i] = G(0.02f * std::sin(0.37f * float(i) + float(s)) * (s % 4 == 0 ? 50.0f : 1.0f));  // clipping binds
      g1[i] = G(float(g2[i]) * 256.0f);
    }
    const auto a = scaled.step(), b = plain.step();
    REQUIRE(a.applied);
    CHECK(a.grad_norm == b.grad_norm);
    CHECK(a.scale_before == 256.0);
    CHECK(same());
  }
  g1[7] = G(std::numeric_limits<float>::infinity());
  const std::vector<W> before = w1;
  const auto st = scaled.step();
  CHECK(st.result == mpopt::step_result::skipped_nonfinite);
  CHECK(scaled.scaler().overflows == 1);
  CHECK(std::equal(w1.begin(), w1.end(), before.begin(), [](W x, W y) { return float(x) == float(y); }));
}

TEST_CASE("randomized: 2000 random schedules and configurations on dynamic_scale match DeepSpeed's rule") {
  std::mt19937_64 rng(20240917);
  auto uniform = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  int raises = 0, doublings = 0, halvings = 0, hysteresis_holds = 0;
  for (int seq = 0; seq < 2000; ++seq) {
    CAPTURE(seq);
    mpopt::dynamic_scale_options o;
    o.init_scale = std::ldexp(1.0, int(uniform(0, 24))) * (uniform(0, 3) == 0 ? 3.0 : 1.0);
    switch (uniform(0, 3)) {
      case 0: o.min_scale = 1; break;
      case 1: o.min_scale = o.init_scale; break;
      case 2: o.min_scale = o.init_scale / std::ldexp(1.0, int(uniform(0, 6))); break;
      default: o.min_scale = std::uniform_real_distribution<double>(1e-3, 1.0)(rng) * o.init_scale; break;
    }
    if (o.min_scale > o.init_scale) o.min_scale = o.init_scale;
    o.window = uniform(1, 6);
    o.hysteresis = uniform(1, 4);
    o.consecutive_hysteresis = uniform(0, 1) == 1;
    o.on_min_scale = uniform(0, 1) ? mpopt::at_min_scale::raise : mpopt::at_min_scale::keep_skipping;
    const double p_overflow = std::uniform_real_distribution<double>(0.05, 0.95)(rng);
    const auto length = uniform(1, 80);

    mpopt::dynamic_scale s(o);
    deepspeed_scaler m(o);
    m.max_scale = mpopt::max_loss_scale;
    for (std::int64_t i = 0; i < length; ++i) {
      const bool ov = std::bernoulli_distribution(p_overflow)(rng);
      const bool model_raises = m.would_raise(ov);
      REQUIRE(s.raises_on(ov) == model_raises);
      if (model_raises) {  // the optimizer throws instead of calling update: nothing changes
        ++raises;
        continue;
      }
      const double before = m.cur_scale;
      const auto h_before = m.cur_hysteresis;
      m.update_scale(ov);
      s.update(ov);
      REQUIRE(s.scale() == m.cur_scale);
      REQUIRE(s.iteration() == m.cur_iter);
      REQUIRE(s.hysteresis_left() == m.cur_hysteresis);
      doublings += m.cur_scale > before;
      halvings += m.cur_scale < before;
      hysteresis_holds += ov && m.cur_hysteresis < h_before;
    }
  }
  // The random configurations really exercise every branch.
  CHECK(raises > 100);
  CHECK(doublings > 1000);
  CHECK(halvings > 1000);
  CHECK(hysteresis_holds > 1000);
}

TEST_CASE("randomized: 2000 random schedules through an fp16 optimizer match DeepSpeed's rule step by step") {
  std::mt19937_64 rng(77);
  auto uniform = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  int raises = 0, skips = 0, applies = 0;
  for (int seq = 0; seq < 2000; ++seq) {
    CAPTURE(seq);
    mpopt::dynamic_scale_options o;
    o.init_scale = std::ldexp(1.0, int(uniform(0, 16)));
    o.min_scale = uniform(0, 1) ? 1.0 : o.init_scale / std::ldexp(1.0, int(uniform(0, 4)));
    if (o.min_scale > o.init_scale) o.min_scale = o.init_scale;
    o.window = uniform(1, 5);
    o.hysteresis = uniform(1, 3);
    o.consecutive_hysteresis = uniform(0, 1) == 1;
    o.on_min_scale = uniform(0, 1) ? mpopt::at_min_scale::raise : mpopt::at_min_scale::keep_skipping;
    const double p_overflow = std::uniform_real_distribution<double>(0.1, 0.8)(rng);
    const auto length = uniform(1, 40);

    fp16_dynamic rig(o);
    deepspeed_scaler m(o);
    m.max_scale = mpopt::max_loss_scale;
    std::uint64_t skipped = 0, consecutive = 0, applied = 0;
    for (std::int64_t i = 0; i < length; ++i) {
      const bool ov = std::bernoulli_distribution(p_overflow)(rng);
      const double before = m.cur_scale;
      if (m.would_raise(ov)) {
        ++raises;
        REQUIRE_THROWS_AS(rig.step(ov, f_nan), mpopt::error);
        REQUIRE(rig.opt.loss_scale() == before);
        REQUIRE(rig.opt.scaler().iteration() == m.cur_iter);
        continue;
      }
      m.update_scale(ov);
      const auto st = rig.step(ov, uniform(0, 1) ? f_inf : f_nan);
      if (ov) {
        ++skipped, ++consecutive, ++skips;
      } else {
        ++applied, consecutive = 0, ++applies;
      }
      REQUIRE(st.scale_before == before);
      REQUIRE(st.scale_after == m.cur_scale);
      REQUIRE(st.applied == !ov);
      REQUIRE(st.skipped_steps == skipped);
      REQUIRE(st.consecutive_skips == consecutive);
      REQUIRE(st.step == applied);
      REQUIRE(rig.opt.scaler().iteration() == m.cur_iter);
      REQUIRE(rig.opt.scaler().hysteresis_left() == m.cur_hysteresis);
    }
  }
  CHECK(raises > 50);
  CHECK(skips > 1000);
  CHECK(applies > 1000);
}

TEST_CASE("max_consecutive_skips throws when that many skips in a row would be reached, before changing anything") {
  const mpopt::dynamic_scale_options o{.init_scale = 1024, .window = 1000, .hysteresis = 1};
  fp16_dynamic rig(o, {.max_consecutive_skips = 3});
  rig.step(false);
  CHECK(rig.step(true).consecutive_skips == 1);
  CHECK(rig.step(true).consecutive_skips == 2);
  const auto before = rig.snap();
  CHECK_THROWS_AS(rig.step(true), mpopt::error);
  CHECK(rig.snap() == before);
  CHECK(rig.opt.loss_scale() == 256);  // two halvings, not three
  const auto st = rig.step(false);
  CHECK(st.applied);
  CHECK(st.skipped_steps == 2);
}

}  // TEST_SUITE
