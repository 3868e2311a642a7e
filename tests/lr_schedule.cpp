// Tests for the learning-rate schedules (include/mpopt/lr_schedule.hpp). DeepSpeed's are checked
// against its schedulers transcribed as the objects they are in deepspeed/runtime/lr_schedules.py
// (made with last_batch_iteration = -1, stepped after every applied optimizer step), the PyTorch
// shapes against their closed forms, over thousands of steps, bit for bit; then through optimizers:
// the rates each step uses, skipped steps, betas, a resume, any_optimizer, and bad schedules.
#include <doctest/doctest.h>

#include <mpopt/checkpoint.hpp>
#include <mpopt/mpopt.hpp>

#include "error_of.hpp"
#include "temp_dir.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

namespace {

// ---------------------------------------------------------------------------------------------------
// The references. Each holds DeepSpeed's fields and computes get_lr() as its Python does.

/// WarmupLR, and WarmupDecayLR where `total` is set.
struct ds_warmup_lr {
  std::vector<double> min_lrs, delta_lrs;
  std::int64_t warmup_num_steps;
  bool log_rate;
  double inverse_log_warm_up;
  std::optional<std::int64_t> total_num_steps;
  std::int64_t last_batch_iteration = -1;

  /// `max_lrs`: one per group (DeepSpeed's list, or its None: each group's own rate).
  ds_warmup_lr(double min_lr, std::vector<double> max_lrs, std::int64_t steps, bool log,
               std::optional<std::int64_t> total = {})
      : min_lrs(max_lrs.size(), min_lr), warmup_num_steps(std::max<std::int64_t>(2, steps)), log_rate(log),
        inverse_log_warm_up(1.0 / std::log(double(warmup_num_steps))), total_num_steps(total) {
    for (double max_lr : max_lrs) delta_lrs.push_back(max_lr - min_lr);
  }

  double get_gamma() const {
    if (last_batch_iteration < warmup_num_steps) {
      if (log_rate) return inverse_log_warm_up * std::log(double(last_batch_iteration + 1));
      return double(last_batch_iteration) / double(warmup_num_steps);
    }
    if (!total_num_steps) return 1.0;
    return std::max(0.0, double(*total_num_steps - last_batch_iteration) /
                             std::max(1.0, double(*total_num_steps - warmup_num_steps)));
  }
  std::vector<double> get_lr() const {
    if (last_batch_iteration < 0) return min_lrs;
    std::vector<double> lrs;
    for (std::size_t g = 0; g < min_lrs.size(); ++g) lrs.push_back(min_lrs[g] + (delta_lrs[g] * get_gamma()));
    return lrs;
  }
  void step() { ++last_batch_iteration; }
};

/// WarmupCosineLR over the groups' original rates.
struct ds_warmup_cosine_lr {
  std::int64_t total_num_steps;
  double warmup_min_ratio, cos_min_ratio;
  std::int64_t warmup_num_steps;
  bool log_rate;
  double inverse_log_warm_up;
  std::vector<double> org_lrs;
  std::int64_t last_batch_iteration = -1;

  double get_lr_ratio() const {
    if (last_batch_iteration < 0) return 0.0;
    if (last_batch_iteration < warmup_num_steps) {
      double ratio = log_rate ? inverse_log_warm_up * std::log(double(last_batch_iteration + 1))
                              : double(last_batch_iteration) / double(warmup_num_steps);
      const double ratio_delta = 1. - warmup_min_ratio;
      return warmup_min_ratio + ratio * ratio_delta;
    }
    const std::int64_t real_last_step = last_batch_iteration - warmup_num_steps + 1;
    const std::int64_t real_total_steps = std::max<std::int64_t>(1, total_num_steps - warmup_num_steps);
    const double cosine_progress = std::min(1.0, double(real_last_step) / double(real_total_steps));
    const double ratio_delta = 1. - cos_min_ratio;
    double ratio = (1 + std::cos(std::numbers::pi * cosine_progress)) / 2;
    return std::max(0.0, cos_min_ratio + ratio_delta * ratio);
  }
  std::vector<double> get_lr() const {
    if (last_batch_iteration < 0) return std::vector<double>(org_lrs.size(), 0.0);
    std::vector<double> lrs;
    for (double lr : org_lrs) lrs.push_back(lr * get_lr_ratio());
    return lrs;
  }
  void step() { ++last_batch_iteration; }
};

ds_warmup_cosine_lr make_ds_cosine(std::int64_t total, double wmin, std::int64_t steps, double cmin, bool log,
                                   std::vector<double> org) {
  const std::int64_t w = std::max<std::int64_t>(2, steps);
  return {total, wmin, cmin, w, log, 1.0 / std::log(double(w)), std::move(org)};
}

/// OneCycle, momentum included.
struct ds_one_cycle {
  double total_size, step_ratio, first_step_size, second_step_size;
  std::int64_t first_stair_count, second_stair_count;
  double decay_step_size, min_lr, max_lr, decay_lr_rate;
  bool skip_lr_decay, skip_mom_decay, cycle_momentum;
  double min_mom, max_mom;
  std::int64_t last_batch_iteration = -1;
  // What the last step() set, and what construction set.
  double lr, beta1, beta2;

  ds_one_cycle(double cmin, double cmax, double decay_rate, double first, std::optional<double> second,
               std::int64_t first_stairs, std::optional<std::int64_t> second_stairs, double decay_size, bool momentum,
               double mom_min, double mom_max)
      : first_step_size(first), second_step_size(second ? *second : first), first_stair_count(first_stairs),
        second_stair_count(second_stairs ? *second_stairs : first_stairs), decay_step_size(decay_size), min_lr(cmin),
        max_lr(cmax), decay_lr_rate(decay_rate), cycle_momentum(momentum), min_mom(mom_min), max_mom(mom_max) {
    total_size = first_step_size + second_step_size;
    step_ratio = first_step_size / total_size;
    skip_lr_decay = skip_mom_decay = decay_step_size == 0;
    if (decay_lr_rate == 0) skip_lr_decay = true;
    skip_mom_decay = true;  // decay_mom_rate 0
    lr = min_lr;  // _initialize_lr
    beta1 = min_mom;  // _initialize_momentum: (cycle_min_mom, 0.99)
    beta2 = 0.99;
  }
  double get_scale_factor() const {
    const double batch_iteration = double(last_batch_iteration + 1);
    const double cycle = std::floor(1 + batch_iteration / total_size);
    const double x = 1. + batch_iteration / total_size - cycle;
    double scale_factor;
    std::int64_t stair_count;
    if (x <= step_ratio) {
      scale_factor = x / step_ratio;
      stair_count = first_stair_count;
    } else {
      scale_factor = (x - 1) / (step_ratio - 1);
      stair_count = second_stair_count;
    }
    if (stair_count > 0) {
      const double cycle_iteration = std::fmod(batch_iteration, total_size);
      double stair_position;
      if (cycle_iteration <= first_step_size) stair_position = cycle_iteration * double(stair_count) / first_step_size;
      else stair_position = (total_size - cycle_iteration) * double(stair_count) / second_step_size;
      scale_factor = std::floor(stair_position) / double(stair_count);
    }
    return scale_factor;
  }
  void step() {
    ++last_batch_iteration;
    if (double(last_batch_iteration) < total_size) {
      const double scale_factor = get_scale_factor();
      lr = min_lr + (max_lr - min_lr) * scale_factor;
      beta1 = max_mom - (max_mom - min_mom) * scale_factor;
    } else {
      const double decay_batch_iteration = double(last_batch_iteration) - total_size + 1;
      lr = skip_lr_decay ? min_lr : min_lr / (1 + decay_lr_rate * (decay_batch_iteration / decay_step_size));
      beta1 = max_mom;  // skip_mom_decay: max_moms
    }
  }
};

constexpr int steps_checked = 6000;

template <class Reference>
void check_lrs(const mpopt::lr_schedule& s, Reference ref, const std::vector<double>& bases) {
  for (int k = 0; k < steps_checked; ++k) {
    const std::vector<double> want = ref.get_lr();
    for (std::size_t g = 0; g < bases.size(); ++g) {
      const double got = mpopt::scheduled_rate(s, std::uint64_t(k), bases[g]);
      if (got != want[g]) {  // one CHECK per mismatch, not per step
        CAPTURE(k);
        CAPTURE(g);
        CHECK(got == want[g]);
        return;
      }
    }
    ref.step();
  }
}

TEST_CASE("WarmupLR and WarmupDecayLR give DeepSpeed's rates, step after step") {
  SUBCASE("WarmupLR, log warm-up, defaults but the rates") {
    check_lrs(mpopt::warmup_lr{.warmup_max_lr = 3e-4}, ds_warmup_lr(0.0, {3e-4}, 1000, true), {1e-3});
  }
  SUBCASE("WarmupLR, linear from a start above 0, over 1 step (DeepSpeed warms over 2)") {
    check_lrs(mpopt::warmup_lr{.warmup_min_lr = 1e-5, .warmup_max_lr = 2e-3, .warmup_num_steps = 1,
                               .warmup_type = mpopt::warmup_shape::linear},
              ds_warmup_lr(1e-5, {2e-3}, 1, false), {1e-3});
  }
  SUBCASE("WarmupLR without a maximum: each group's own rate") {
    check_lrs(mpopt::warmup_lr{.warmup_num_steps = 700}, ds_warmup_lr(0.0, {5e-4, 1e-2}, 700, true), {5e-4, 1e-2});
  }
  SUBCASE("WarmupDecayLR, log warm-up, then linearly to 0 and held there") {
    check_lrs(mpopt::warmup_decay_lr{.total_num_steps = 4000, .warmup_max_lr = 6e-4, .warmup_num_steps = 500},
              ds_warmup_lr(0.0, {6e-4}, 500, true, 4000), {1.0});
  }
  SUBCASE("WarmupDecayLR, linear warm-up, total below the warm-up") {
    check_lrs(mpopt::warmup_decay_lr{.total_num_steps = 300, .warmup_min_lr = 1e-6, .warmup_num_steps = 800,
                                     .warmup_type = mpopt::warmup_shape::linear},
              ds_warmup_lr(1e-6, {0.001}, 800, false, 300), {1.0});
  }
}

TEST_CASE("WarmupCosineLR gives DeepSpeed's rates for each group's own base, step after step") {
  SUBCASE("defaults but the total") {
    check_lrs(mpopt::warmup_cosine_lr{.total_num_steps = 5000}, make_ds_cosine(5000, 0.0, 1000, 0.0001, true, {3e-4, 1e-2}),
              {3e-4, 1e-2});
  }
  SUBCASE("linear warm-up from a ratio, a floor, past the end") {
    check_lrs(mpopt::warmup_cosine_lr{.total_num_steps = 2500, .warmup_min_ratio = 0.1, .warmup_num_steps = 250,
                                      .cos_min_ratio = 0.05, .warmup_type = mpopt::warmup_shape::linear},
              make_ds_cosine(2500, 0.1, 250, 0.05, false, {6e-4}), {6e-4});
  }
  SUBCASE("total below the warm-up: the floor after it") {
    check_lrs(mpopt::warmup_cosine_lr{.total_num_steps = 100, .warmup_num_steps = 400},
              make_ds_cosine(100, 0.0, 400, 0.0001, true, {1e-3}), {1e-3});
  }
}

TEST_CASE("OneCycle gives DeepSpeed's rates and betas, through the cycle and its decay") {
  struct cycle_case {
    const char* what;
    mpopt::one_cycle s;
    ds_one_cycle ref;
  };
  const cycle_case cases[] = {
      {"symmetric, no stairs, no decay", {.cycle_min_lr = 1e-4, .cycle_max_lr = 1e-2, .cycle_first_step_size = 1000},
       ds_one_cycle(1e-4, 1e-2, 0, 1000, {}, 0, {}, 0, true, 0.8, 0.9)},
      {"asymmetric, in stairs, decaying after",
       {.cycle_min_lr = 2e-5, .cycle_max_lr = 3e-3, .decay_lr_rate = 0.5, .cycle_first_step_size = 700,
        .cycle_second_step_size = 1300, .cycle_first_stair_count = 7, .cycle_second_stair_count = 5,
        .decay_step_size = 100, .cycle_min_mom = 0.85, .cycle_max_mom = 0.95},
       ds_one_cycle(2e-5, 3e-3, 0.5, 700, 1300, 7, 5, 100, true, 0.85, 0.95)},
      {"odd sizes, one stair count for both halves, decay step but no rate",
       {.cycle_min_lr = 0.0, .cycle_max_lr = 1e-3, .cycle_first_step_size = 333, .cycle_first_stair_count = 4,
        .decay_step_size = 10},
       ds_one_cycle(0.0, 1e-3, 0, 333, {}, 4, {}, 10, true, 0.8, 0.9)},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    ds_one_cycle ref = c.ref;
    for (int k = 0; k < steps_checked; ++k) {
      const double lr = mpopt::scheduled_rate(c.s, std::uint64_t(k), 1.0);
      const auto betas = mpopt::scheduled_momentum(c.s, std::uint64_t(k));
      const bool same = lr == ref.lr && betas && betas->beta1 == ref.beta1 && betas->beta2 == ref.beta2;
      if (!same) {
        CAPTURE(k);
        CHECK(lr == ref.lr);
        REQUIRE(betas);
        CHECK(betas->beta1 == ref.beta1);
        CHECK(betas->beta2 == ref.beta2);
        break;
      }
      ref.step();
    }
  }
  mpopt::one_cycle no_momentum{.cycle_min_lr = 1e-4, .cycle_max_lr = 1e-3, .cycle_momentum = false};
  CHECK_FALSE(mpopt::scheduled_momentum(no_momentum, 10));
  CHECK_FALSE(mpopt::scheduled_momentum(mpopt::warmup_lr{}, 10));
}

TEST_CASE("cosine_with_warmup, linear_with_warmup and step_decay give their closed forms (LambdaLR at last_epoch = k)") {
  const mpopt::cosine_with_warmup cos{.warmup_steps = 100, .total_steps = 1100, .min_ratio = 0.1};
  const mpopt::linear_with_warmup linear{.warmup_steps = 60, .total_steps = 3001};
  const mpopt::step_decay steps{.step_size = 30, .gamma = 0.5};
  const double base = 4e-4;
  for (std::uint64_t k = 0; k < std::uint64_t(steps_checked); ++k) {
    // transformers' get_cosine_with_min_lr_schedule_with_warmup (num_cycles 0.5), held at its end.
    double factor;
    if (k < 100) {
      factor = double(k) / double(std::max(1, 100));
    } else {
      const double progress = std::min(1.0, double(k - 100) / double(std::max(1, 1100 - 100)));
      factor = 0.5 * (1.0 + std::cos(std::numbers::pi * 0.5 * 2.0 * progress));
      factor = std::max(0.0, factor * (1 - 0.1) + 0.1);
    }
    // transformers' get_linear_schedule_with_warmup.
    const double linear_factor =
        k < 60 ? double(k) / double(std::max(1, 60))
               : std::max(0.0, double(3001 - std::int64_t(k)) / double(std::max(1, 3001 - 60)));
    const double want_step = base * std::pow(0.5, double(k / 30));  // StepLR's closed form
    if (mpopt::scheduled_rate(cos, k, base) != base * factor || mpopt::scheduled_rate(linear, k, base) != base * linear_factor ||
        mpopt::scheduled_rate(steps, k, base) != want_step) {
      CAPTURE(k);
      CHECK(mpopt::scheduled_rate(cos, k, base) == base * factor);
      CHECK(mpopt::scheduled_rate(linear, k, base) == base * linear_factor);
      CHECK(mpopt::scheduled_rate(steps, k, base) == want_step);
      break;
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Through the optimizer.

using fp32_adam = mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::adam>;
using fp16_adam = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam>;

float grad_at(std::size_t i, int step) { return 0.01f * std::sin(0.7f * float(i) + 0.3f * float(step)); }

TEST_CASE("a schedule sets each group's rate from its base before every step, bit for bit as set_lr would") {
  const mpopt::lr_schedule s = mpopt::warmup_cosine_lr{.total_num_steps = 40, .warmup_num_steps = 10};
  std::vector<float> pa(50, 0.5f), ga(50), pb(50, 0.5f), gb(50), qa(7, 0.1f), qga(7), qb(7, 0.1f), qgb(7);
  fp32_adam a, b;
  a.add_group({.lr = 1e-2}).add(pa, ga, "w");
  a.add_group({.lr = 3e-3, .weight_decay = 0.0}).add(qa, qga, "b");
  a.set_schedule(s);
  b.add_group({.lr = 1e-2}).add(pb, gb, "w");
  b.add_group({.lr = 3e-3, .weight_decay = 0.0}).add(qb, qgb, "b");
  for (int step = 0; step < 60; ++step) {
    CAPTURE(step);
    for (std::size_t i = 0; i < 50; ++i) ga[i] = gb[i] = grad_at(i, step);
    for (std::size_t i = 0; i < 7; ++i) qga[i] = qgb[i] = grad_at(i + 50, step);
    b.group(0).set_lr(mpopt::scheduled_rate(s, std::uint64_t(step), 1e-2));
    b.group(1).set_lr(mpopt::scheduled_rate(s, std::uint64_t(step), 3e-3));
    CHECK(a.step().applied);
    CHECK(b.step().applied);
    CHECK(a.group(0).lr() == b.group(0).lr());  // the rate its last step used
    CHECK(a.group(1).lr() == b.group(1).lr());
    CHECK(a.group(0).base_lr() == 1e-2);
  }
  CHECK(std::memcmp(pa.data(), pb.data(), sizeof(float) * pa.size()) == 0);
  CHECK(std::memcmp(qa.data(), qb.data(), sizeof(float) * qa.size()) == 0);
  CHECK(pa[0] != 0.5f);
  CHECK(a.group(0).lr() == 1e-2 * 0.0001);  // past total_num_steps: the floor
  a.clear_schedule();
  CHECK_FALSE(a.schedule());
}

TEST_CASE("a skipped step does not advance the schedule, and OneCycle moves beta1 and beta2") {
  const mpopt::lr_schedule s = mpopt::one_cycle{.cycle_min_lr = 1e-4, .cycle_max_lr = 1e-3, .cycle_first_step_size = 4};
  std::vector<mpopt::half> p(16, mpopt::half(0.25f)), g(16);
  fp16_adam opt({}, {.init_scale = 1024});
  opt.add_group({.lr = 5e-3, .beta2 = 0.999}).add(p, g, "w");
  opt.set_schedule(s);
  std::uint64_t applied = 0;
  for (int step = 0; step < 12; ++step) {
    CAPTURE(step);
    const float scale = float(opt.loss_scale());
    for (std::size_t i = 0; i < 16; ++i) g[i] = mpopt::half(scale * grad_at(i, step));
    if (step == 3 || step == 7) g[2] = mpopt::half(std::numeric_limits<float>::infinity());
    const mpopt::step_status st = opt.step();
    CHECK(st.applied == (step != 3 && step != 7));
    if (!st.applied) continue;
    // The rate and betas of the step after `applied` applied ones.
    CHECK(opt.group(0).lr() == mpopt::scheduled_rate(s, applied, 5e-3));
    const auto betas = mpopt::scheduled_momentum(s, applied);
    REQUIRE(betas);
    CHECK(opt.group(0).options().beta1 == betas->beta1);
    CHECK(opt.group(0).options().beta2 == 0.99);
    ++applied;
    CHECK(opt.group(0).step() == applied);
  }
}

TEST_CASE("a checkpoint holds the schedule and the base rates: a resume without set_schedule goes on bit for bit") {
  const mpopt::lr_schedule s = mpopt::warmup_decay_lr{.total_num_steps = 30, .warmup_max_lr = 2e-2, .warmup_num_steps = 8};
  const mpopt::lr_schedule cosine = mpopt::warmup_cosine_lr{.total_num_steps = 30, .warmup_num_steps = 5};
  auto model = [] { return std::vector<float>(33, 0.75f); };
  auto run = [&](fp32_adam& opt, std::vector<float>& p, std::vector<float>& g, int from, int to) {
    for (int step = from; step < to; ++step) {
      for (std::size_t i = 0; i < p.size(); ++i) g[i] = grad_at(i, step);
      CHECK(opt.step().applied);
    }
  };
  for (const mpopt::lr_schedule& schedule : {s, cosine}) {
    CAPTURE(mpopt::schedule_name(schedule));
    temp_dir dir;
    std::vector<float> p = model(), g(33), q = model(), h(33);
    fp32_adam whole;
    whole.add_group({.lr = 1e-3}).add(p, g, "w");
    whole.set_schedule(schedule);
    run(whole, p, g, 0, 25);

    fp32_adam first;
    first.add_group({.lr = 1e-3}).add(q, h, "w");
    first.set_schedule(schedule);
    run(first, q, h, 0, 12);
    first.save((dir / "at12.safetensors").string());
    std::vector<float> r = model(), k(33);
    fp32_adam resumed;
    resumed.add_group({.lr = 5e-3}).add(r, k, "w");  // another rate, and no schedule: the file's take their place
    resumed.load((dir / "at12.safetensors").string());
    REQUIRE(resumed.schedule());
    CHECK(mpopt::detail::schedule_settings(resumed.schedule()) == mpopt::detail::schedule_settings(schedule));
    CHECK(resumed.group(0).base_lr() == 1e-3);  // the rate it was given, not the saved step's
    CHECK(resumed.group(0).lr() == first.group(0).lr());
    run(resumed, r, k, 12, 25);
    CHECK(std::memcmp(p.data(), r.data(), sizeof(float) * p.size()) == 0);
    CHECK(resumed.group(0).lr() == whole.group(0).lr());
  }
}

TEST_CASE("load() of a file saved without a schedule clears the one set, and restores the saved base rate") {
  temp_dir dir;
  std::vector<float> p(9, 0.5f), g(9, 0.01f), q(9, 0.5f), h(9, 0.01f);
  fp32_adam plain;
  plain.add_group({.lr = 2e-3}).add(p, g, "w");
  CHECK(plain.step().applied);
  plain.group(0).set_lr(4e-3);  // after the step: the file's base and rate
  plain.save((dir / "plain.safetensors").string());
  fp32_adam scheduled;
  scheduled.add_group({.lr = 1e-3}).add(q, h, "w");
  scheduled.set_schedule(mpopt::step_decay{.step_size = 2});
  scheduled.load((dir / "plain.safetensors").string());
  CHECK_FALSE(scheduled.schedule());
  CHECK(scheduled.group(0).base_lr() == 4e-3);
  CHECK(scheduled.step().applied);
  CHECK(scheduled.group(0).lr() == 4e-3);
}

TEST_CASE("a bad schedule is refused, naming the field; the last one stays") {
  fp32_adam opt;
  std::vector<float> p(4), g(4);
  opt.add_group({.lr = 1e-3}).add(p, g, "w");
  opt.set_schedule(mpopt::step_decay{.step_size = 10});
  CHECK(error_of([&] { opt.set_schedule(mpopt::warmup_cosine_lr{}); }).find("WarmupCosineLR.total_num_steps") !=
        std::string::npos);
  CHECK(error_of([&] { opt.set_schedule(mpopt::warmup_lr{.warmup_num_steps = 0}); }).find("WarmupLR.warmup_num_steps") !=
        std::string::npos);
  CHECK(error_of([&] { opt.set_schedule(mpopt::warmup_lr{.warmup_min_lr = -1e-3}); }).find("WarmupLR.warmup_min_lr") !=
        std::string::npos);
  CHECK(error_of([&] { opt.set_schedule(mpopt::one_cycle{.cycle_max_lr = 1e-3}); }).find("cycle_min_lr and cycle_max_lr are "
                                                                                          "required") != std::string::npos);
  CHECK(error_of([&] {
          opt.set_schedule(mpopt::one_cycle{.cycle_min_lr = 1e-4, .cycle_max_lr = 1e-3, .decay_mom_rate = 0.1});
        }).find("OneCycle.decay_mom_rate") != std::string::npos);
  CHECK(error_of([&] { opt.set_schedule(mpopt::cosine_with_warmup{.warmup_steps = 10, .total_steps = 10}); })
            .find("cosine_with_warmup.total_steps") != std::string::npos);
  CHECK(error_of([&] { opt.set_schedule(mpopt::step_decay{.step_size = 5, .gamma = 1.5}); }).find("step_decay.gamma") !=
        std::string::npos);
  CHECK(error_of([&] { opt.set_schedule(mpopt::linear_with_warmup{.warmup_steps = 3}); })
            .find("linear_with_warmup.total_steps") != std::string::npos);
  REQUIRE(opt.schedule());
  CHECK(std::holds_alternative<mpopt::step_decay>(*opt.schedule()));
}

}  // namespace
