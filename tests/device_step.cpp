// What a step costs on the device backend: the kernels it launches, counted by mpopt::cuda, for
// each rule and precision; README's table of kernels and bytes per step is these numbers. Built
// with g++ and THRUST_DEVICE_SYSTEM_OMP (the device backend's source, run on the host).
#include <doctest/doctest.h>

#include <cstddef>
#include <string>
#include <vector>

#include <mpopt/cuda.hpp>
#include <mpopt/mpopt.hpp>

namespace {

/// Kernels launched by each of `steps` steps of a two-tensor fused optimizer, after a first step
/// (which also initializes the state).
template <class Precision, class Rule, class Scaler = mpopt::no_scaling>
std::vector<std::size_t> launches_per_step(typename Rule::options o, int steps) {
  mpopt::optimizer<Precision, Scaler, mpopt::replicated, Rule, mpopt::cuda> opt;
  auto& g = opt.add_flat_group(o, {{"w", 70001}, {"b", 17}});
  using grad_t = typename Precision::grad_type;
  for (std::size_t t = 0; t < g.size(); ++t)
    for (std::size_t i = 0; i < g.grad(t).size(); ++i) g.grad(t)[i] = grad_t(float(i % 7) * 1e-3f - 2e-3f);
  std::vector<std::size_t> per_step;
  REQUIRE(opt.step().applied);
  for (int s = 0; s < steps; ++s) {
    const std::size_t before = opt.backend().launches();
    REQUIRE(opt.step().applied);
    per_step.push_back(opt.backend().launches() - before);
  }
  return per_step;
}

}  // namespace

TEST_SUITE("device") {
  TEST_CASE("an Adam step is three kernels: overflow and norm (and its per-chunk totals), then the update") {
    CHECK(launches_per_step<mpopt::fp16, mpopt::adam, mpopt::dynamic_scale>({}, 3) == std::vector<std::size_t>(3, 3));
    CHECK(launches_per_step<mpopt::bf16, mpopt::adam>({}, 3) == std::vector<std::size_t>(3, 3));
    CHECK(launches_per_step<mpopt::fp32, mpopt::adam>({}, 3) == std::vector<std::size_t>(3, 3));
  }

  TEST_CASE("a LAMB step is seven kernels: norm, moments (each with totals), per-tensor sums, trust ratios, apply") {
    CHECK(launches_per_step<mpopt::fp16, mpopt::lamb, mpopt::dynamic_scale>({}, 3) == std::vector<std::size_t>(3, 7));
    CHECK(launches_per_step<mpopt::bf16, mpopt::lamb>({}, 3) == std::vector<std::size_t>(3, 7));
    CHECK(launches_per_step<mpopt::fp32, mpopt::lamb>({}, 3) == std::vector<std::size_t>(3, 7));
  }

  TEST_CASE("1-bit LAMB on one rank: LAMB's seven, one copy at the freeze step, then five; the momentum scaling once") {
    mpopt::onebit_lamb::options o;
    o.freeze_step = 3;
    // Steps 2..7 after the first: warm-up (2), the freeze step (3) copies the variance, the first
    // compressed step (4) measures the momentum scales (its trust ratios are the frozen ones, made
    // on the host), then compressed steps.
    const std::vector<std::size_t> want = {7, 8, 7, 5, 5, 5};
    CHECK(launches_per_step<mpopt::bf16, mpopt::onebit_lamb>(o, 6) == want);
    CHECK(launches_per_step<mpopt::fp32, mpopt::onebit_lamb>(o, 6) == want);
  }
}
