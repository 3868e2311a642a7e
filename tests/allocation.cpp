// After the first step(), the step allocates nothing: every buffer is sized at finalize().
#include <doctest/doctest.h>

#include <mpopt/mpopt.hpp>

#include "../examples/user_rules.hpp"
#include "test_backend.hpp"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <vector>

namespace {
std::atomic<long> allocations{0};
}

// Replacement allocation functions that count; GCC cannot see that free() pairs with our malloc().
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  const std::size_t al = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace {

/// Allocations made by f().
template <class F>
long count_allocations(F&& f) {
  const long before = allocations.load();
  f();
  return allocations.load() - before;
}

template <class Opt>
void check_steady_state_allocates_nothing(Opt& opt, std::vector<std::vector<typename Opt::grad_type>*> grads,
                                          int steps_per_check) {
  using G = typename Opt::grad_type;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  auto fill = [&](float poison) {
    for (auto* g : grads)
      for (auto& x : *g) x = G(normal(rng) * float(opt.loss_scale()));
    if (!std::isnan(poison)) (*grads[0])[0] = G(poison);
  };
  fill(std::numeric_limits<float>::quiet_NaN());
  // The first step allocates the state (this also shows the counter sees the library's allocations).
  CHECK(count_allocations([&] { opt.step(); }) > 0);
  // At every SIMD level this CPU runs (the host backend's passes; one level on the device backend).
  const auto before = mpopt::host::simd();
  for (auto level : {mpopt::simd_level::scalar, mpopt::simd_level::avx2, mpopt::simd_level::avx512}) {
    if (!mpopt::cpu_supports(level)) continue;
    CAPTURE(std::string(mpopt::to_string(level)));
    mpopt::host::use_simd(level);
    for (int i = 0; i < 3 * steps_per_check; ++i) {
      const bool overflow = i % 5 == 3;  // skipped steps take another path through step()
      fill(overflow ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN());
      long n = count_allocations([&] { opt.step(); });
      CHECK_MESSAGE(n == 0, "step ", i, " allocated ", n, " times");
    }
  }
  mpopt::host::use_simd(before);
  CHECK(count_allocations([&] { opt.zero_grad(); }) == 0);
}

}  // namespace

TEST_SUITE("allocation") {
  TEST_CASE("fp16 Adam with a dynamic scaler allocates nothing after the first step, applied or skipped") {
    mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam, test_backend> opt{{}, {.init_scale = 256, .hysteresis = 1, .on_min_scale = mpopt::at_min_scale::keep_skipping}};
    std::vector<mpopt::half> w(100000, mpopt::half(0.5f)), gw(100000), b(33, mpopt::half(0.0f)), gb(33);
    opt.add_group({.lr = 1e-3, .weight_decay = 0.1}).add(w, gw, "w");
    opt.add_group({.lr = 1e-3}).add(b, gb, "b");
    check_steady_state_allocates_nothing(opt, {&gw, &gb}, 1);
  }

  TEST_CASE("bf16 LAMB allocates nothing after the first step") {
    mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::lamb, test_backend> opt;
    std::vector<mpopt::bfloat16> w(70001, mpopt::bfloat16(0.5f)), gw(70001);
    opt.add_group({.weight_decay = 0.01}).add(w, gw, "w");
    check_steady_state_allocates_nothing(opt, {&gw}, 1);
  }

  TEST_CASE("bf16 Adam and fp16 LAMB allocate nothing after the first step") {
    mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::adam, test_backend> adam;
    std::vector<mpopt::bfloat16> w(70001, mpopt::bfloat16(0.5f)), gw(70001);
    adam.add_group({}).add(w, gw, "w");
    check_steady_state_allocates_nothing(adam, {&gw}, 1);
    mpopt::optimizer<mpopt::fp16, mpopt::static_scale, mpopt::replicated, mpopt::lamb, test_backend> lamb;
    std::vector<mpopt::half> p(70001, mpopt::half(0.5f)), gp(70001);
    lamb.add_group({.weight_decay = 0.01}).add(p, gp, "p");
    check_steady_state_allocates_nothing(lamb, {&gp}, 1);
  }

  TEST_CASE("stochastic rounding allocates nothing after the first step") {
    mpopt::optimizer<mpopt::bf16_stochastic, mpopt::no_scaling, mpopt::replicated, mpopt::adam, test_backend> adam;
    std::vector<mpopt::bfloat16> w(70001, mpopt::bfloat16(0.5f)), gw(70001);
    adam.add_group({}).add(w, gw, "w");
    check_steady_state_allocates_nothing(adam, {&gw}, 1);
    mpopt::optimizer<mpopt::fp16_stochastic, mpopt::dynamic_scale, mpopt::replicated, mpopt::lamb, test_backend> lamb;
    std::vector<mpopt::half> p(70001, mpopt::half(0.5f)), gp(70001);
    lamb.add_group({.weight_decay = 0.01}).add(p, gp, "p");
    check_steady_state_allocates_nothing(lamb, {&gp}, 1);
  }

  TEST_CASE("1-bit LAMB allocates nothing after the first step, in warm-up and compression") {
    mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::onebit_lamb, test_backend> opt;
    std::vector<mpopt::bfloat16> w(70001, mpopt::bfloat16(0.5f)), gw(70001);
    opt.add_group({.freeze_step = 4}).add(w, gw, "w");
    check_steady_state_allocates_nothing(opt, {&gw}, 3);
  }

  TEST_CASE("rules written outside the library allocate nothing after the first step") {
    mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, user_rules::lion, test_backend> lion{
        {}, {.init_scale = 256, .hysteresis = 1, .on_min_scale = mpopt::at_min_scale::keep_skipping}};
    std::vector<mpopt::half> w(70001, mpopt::half(0.5f)), gw(70001);
    lion.add_group({.weight_decay = 0.1}).add(w, gw, "w");
    check_steady_state_allocates_nothing(lion, {&gw}, 1);
    mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, user_rules::sgd, test_backend> sgd;
    std::vector<mpopt::bfloat16> p(70001, mpopt::bfloat16(0.5f)), gp(70001);
    sgd.add_group({.nesterov = true}).add(p, gp, "p");
    check_steady_state_allocates_nothing(sgd, {&gp}, 1);
    mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, user_rules::lars, test_backend> lars;
    std::vector<float> q(70001, 0.5f), gq(70001);
    lars.add_group({}).add(q, gq, "q");
    check_steady_state_allocates_nothing(lars, {&gq}, 1);
  }

  TEST_CASE("without clipping or overflow skip (no gradient pass: the update sums the norm) fp32 Adam and bf16 "
            "LAMB allocate nothing after the first step") {
    const mpopt::optimizer_options unchecked{.clip_grad = 0, .skip_nonfinite = false};
    mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::adam, test_backend> adam{unchecked};
    std::vector<float> w(70001, 0.5f), gw(70001);
    adam.add_group({}).add(w, gw, "w");
    check_steady_state_allocates_nothing(adam, {&gw}, 1);
    mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::lamb, test_backend> lamb{unchecked};
    std::vector<mpopt::bfloat16> p(70001, mpopt::bfloat16(0.5f)), gp(70001);
    lamb.add_group({.weight_decay = 0.01}).add(p, gp, "p");
    check_steady_state_allocates_nothing(lamb, {&gp}, 1);
  }

  TEST_CASE("fp32 Adam with gradient accumulation allocates nothing after the first step") {
    mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::adam, test_backend> opt{{.accumulation_steps = 3}};
    std::vector<float> w(5000, 1.0f), gw(5000);
    opt.add_group({}).add(w, gw, "w");
    check_steady_state_allocates_nothing(opt, {&gw}, 3);
  }

  TEST_CASE("a learning-rate schedule allocates nothing after the first step (OneCycle: rates and betas)") {
    mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam, test_backend> opt;
    std::vector<mpopt::half> w(5000, mpopt::half(0.5f)), gw(5000), b(7, mpopt::half(0.0f)), gb(7);
    opt.add_group({.lr = 1e-3}).add(w, gw, "w");
    opt.add_group({.lr = 1e-2}).add(b, gb, "b");
    opt.set_schedule(mpopt::one_cycle{.cycle_min_lr = 1e-4, .cycle_max_lr = 1e-3, .cycle_first_step_size = 3});
    check_steady_state_allocates_nothing(opt, {&gw, &gb}, 1);
    CHECK(opt.group(1).lr() != 1e-2);  // the schedule set it
  }
}
