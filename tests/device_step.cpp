// What a step costs on the device backend: the kernels it launches and the times the host waits
// for the device, counted by mpopt::cuda, for each rule and precision; docs/gpu-and-offload.md's table of kernels and
// bytes per step is these numbers. Built with g++ and THRUST_DEVICE_SYSTEM_OMP (the device
// backend's source, run on the host).
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include <mpopt/cuda.hpp>
#include <mpopt/mpopt.hpp>

namespace {

/// What one step cost.
struct step_cost {
  std::size_t kernels, waits;
  bool operator==(const step_cost&) const = default;
};

/// The cost of each of `steps` steps of a two-tensor fused optimizer, after a first step (which also
/// initializes the state); step `overflow_at` sees an infinite gradient and is skipped.
template <class Precision, class Rule, class Scaler = mpopt::no_scaling, class Partition = mpopt::replicated>
std::vector<step_cost> cost_per_step(typename Rule::options o, int steps, int overflow_at = -1,
                                     mpopt::optimizer_options oo = {}) {
  mpopt::optimizer<Precision, Scaler, Partition, Rule, mpopt::cuda> opt(oo);
  auto& g = opt.add_flat_group(o, {{"w", 70001}, {"b", 17}});
  using grad_t = typename Precision::grad_type;
  for (std::size_t t = 0; t < g.size(); ++t)
    for (std::size_t i = 0; i < g.grad(t).size(); ++i) g.grad(t)[i] = grad_t(float(i % 7) * 1e-3f - 2e-3f);
  std::vector<step_cost> per_step;
  REQUIRE(opt.step().applied);
  for (int s = 0; s < steps; ++s) {
    g.grad(0)[5] = grad_t(s == overflow_at ? INFINITY : 3e-3f);
    const std::size_t kernels = opt.backend().launches(), waits = opt.backend().waits();
    REQUIRE(opt.step().applied == (s != overflow_at));
    per_step.push_back({opt.backend().launches() - kernels, opt.backend().waits() - waits});
  }
  return per_step;
}

std::vector<step_cost> repeat(int steps, step_cost c) { return std::vector<step_cost>(std::size_t(steps), c); }

}  // namespace

TEST_SUITE("device") {
  TEST_CASE("an Adam step is six kernels and one wait: overflow and norm (with per-chunk totals), the two sums, "
            "the decision, the update; the host reads the decision after the update") {
    CHECK(cost_per_step<mpopt::fp16, mpopt::adam, mpopt::dynamic_scale>({}, 3) == repeat(3, {6, 1}));
    CHECK(cost_per_step<mpopt::bf16, mpopt::adam>({}, 3) == repeat(3, {6, 1}));
    CHECK(cost_per_step<mpopt::fp32, mpopt::adam>({}, 3) == repeat(3, {6, 1}));
  }

  TEST_CASE("a LAMB step is ten kernels and one wait: norm, sums, decision, moments (with totals), per-tensor "
            "sums, trust ratios, apply") {
    CHECK(cost_per_step<mpopt::fp16, mpopt::lamb, mpopt::dynamic_scale>({}, 3) == repeat(3, {10, 1}));
    CHECK(cost_per_step<mpopt::bf16, mpopt::lamb>({}, 3) == repeat(3, {10, 1}));
    CHECK(cost_per_step<mpopt::fp32, mpopt::lamb>({}, 3) == repeat(3, {10, 1}));
  }

  TEST_CASE("with nothing to know before the update (no clipping, no overflow skip) there is no gradient pass: the "
            "decision copied in, the update summing the gradient's squares as it reads them, one wait") {
    const mpopt::optimizer_options unchecked{.clip_grad = 0, .skip_nonfinite = false};
    CHECK(cost_per_step<mpopt::bf16, mpopt::adam>({}, 3, -1, unchecked) == repeat(3, {2, 1}));
    CHECK(cost_per_step<mpopt::fp32, mpopt::adam>({}, 3, -1, unchecked) == repeat(3, {2, 1}));
    // LAMB: the decision, moments (with totals), per-tensor sums, trust ratios, apply.
    CHECK(cost_per_step<mpopt::fp32, mpopt::lamb>({}, 3, -1, unchecked) == repeat(3, {5, 1}));
    // Under ZeRO: the bucket packed, the decision, the update, the all-gather's pack and unpack.
    // Waits: the packed bucket, the gathered bucket, the end of the step (the norms summed across
    // ranks after it need no other).
    CHECK(cost_per_step<mpopt::bf16, mpopt::adam, mpopt::no_scaling, mpopt::zero1>({}, 3, -1, unchecked) ==
          repeat(3, {5, 3}));
  }

  TEST_CASE("a skipped step is decided on the device too: the same kernels (over empty chunks), one wait") {
    CHECK(cost_per_step<mpopt::fp16, mpopt::adam, mpopt::dynamic_scale>({}, 3, 1) == repeat(3, {6, 1}));
    CHECK(cost_per_step<mpopt::fp32, mpopt::lamb>({}, 3, 1) == repeat(3, {10, 1}));
  }

  TEST_CASE("under ZeRO the device decides too, and the host reads the decision before the update, whose "
            "collectives may fail after the commit") {
    // Adam: the bucket packed, overflow and norm (2), the sums (2), the decision | the update, the
    // all-gather's pack and unpack. Waits: the packed bucket, the decision | the gathered bucket,
    // the end of the step. A skipped step stops at the bar.
    CHECK(cost_per_step<mpopt::fp16, mpopt::adam, mpopt::dynamic_scale, mpopt::zero1>({}, 3, 1) ==
          std::vector<step_cost>{{9, 4}, {6, 2}, {9, 4}});
    // LAMB adds its moments (2), per-tensor sums and trust ratios, and waits for the per-tensor
    // norms, which ranks add up.
    CHECK(cost_per_step<mpopt::fp32, mpopt::lamb, mpopt::no_scaling, mpopt::zero2>({}, 3, 1) ==
          std::vector<step_cost>{{13, 5}, {6, 2}, {13, 5}});
  }

  TEST_CASE("1-bit LAMB on one rank decides on the host: LAMB's passes, one copy at the freeze step, then five; "
            "the momentum scaling once; excluding zero variance reads the variance at the first compressed step "
            "only") {
    mpopt::onebit_lamb::options o;
    o.freeze_step = 3;
    o.compression.exclude_zero_variance = false;
    // Steps 2..7 after the first: warm-up (2), the freeze step (3) copies the variance, the first
    // compressed step (4) measures the momentum scales (its trust ratios are the frozen ones, made
    // on the host), then compressed steps. Waits: the decision, then the frozen coefficient (warm-up)
    // or the compression factors, and the end of the step; the momentum scales once more.
    std::vector<step_cost> want = {{7, 3}, {8, 3}, {7, 4}, {5, 3}, {5, 3}, {5, 3}};
    CHECK(cost_per_step<mpopt::bf16, mpopt::onebit_lamb>(o, 6) == want);
    CHECK(cost_per_step<mpopt::fp32, mpopt::onebit_lamb>(o, 6) == want);
    // The exclusion's cold read: a wait, then the variance of each of the 3 chunks twice (its
    // tensor's mean, then the bits); no kernel.
    o.compression.exclude_zero_variance = true;
    want[2].waits += 1 + 2 * 3;
    CHECK(cost_per_step<mpopt::fp32, mpopt::onebit_lamb>(o, 6) == want);
  }
}
