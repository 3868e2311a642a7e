// What a step costs on the device backend: the kernels it launches and the times the host waits
// for the device, counted by mpopt::cuda, for each rule and precision; docs/gpu-and-offload.md's table of kernels and
// bytes per step is these numbers. Built with g++ and THRUST_DEVICE_SYSTEM_OMP (the device
// backend's source, run on the host).
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <ostream>
#include <string>
#include <ostream>
#include <vector>

#include <mpopt/cuda.hpp>
#include <mpopt/mpopt.hpp>

namespace {

/// What one step cost.
struct step_cost {
  std::size_t kernels, waits;
  bool operator==(const step_cost&) const = default;
  friend std::ostream& operator<<(std::ostream& o, const step_cost& c) {
    return o << "{" << c.kernels << " kernels, " << c.waits << " waits}";
  }
};

/// The cost of each of `steps` steps of a fused optimizer over `tensors`, after a first step (which
/// also initializes the state); step `overflow_at` sees an infinite gradient and is skipped.
template <class Precision, class Rule, class Scaler = mpopt::no_scaling, class Partition = mpopt::replicated>
std::vector<step_cost> cost_per_step(typename Rule::options o, int steps, int overflow_at = -1,
                                     mpopt::optimizer_options oo = {},
                                     std::vector<mpopt::tensor_spec> tensors = {{"w", 70001}, {"b", 17}}) {
  mpopt::optimizer<Precision, Scaler, Partition, Rule, mpopt::cuda> opt(oo);
  auto& g = opt.add_flat_group(o, tensors);
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

/// n tensors: one of two chunks, the others of sizes between 1 and 4099 (small: the kernels, not
/// the elements, are what is counted).
std::vector<mpopt::tensor_spec> many_tensors(std::size_t n) {
  std::vector<mpopt::tensor_spec> specs{{"t0", 70001}};
  for (std::size_t i = 1; i < n; ++i) specs.push_back({"t" + std::to_string(i), 1 + (i * 7919) % 4099});
  return specs;
}

}  // namespace

TEST_SUITE("device") {
  // Kernels as a GPU launches them: a pass's per-chunk sums, and what its last block runs after
  // them (pass_finish.hpp), are that pass's kernel.
  TEST_CASE("an Adam step is two kernels and one wait: overflow and norm, whose last block adds the chunks' sums "
            "and decides; the update; the host reads the decision after the update") {
    CHECK(cost_per_step<mpopt::fp16, mpopt::adam, mpopt::dynamic_scale>({}, 3) == repeat(3, {2, 1}));
    CHECK(cost_per_step<mpopt::bf16, mpopt::adam>({}, 3) == repeat(3, {2, 1}));
    CHECK(cost_per_step<mpopt::fp32, mpopt::adam>({}, 3) == repeat(3, {2, 1}));
  }

  TEST_CASE("a LAMB step is three kernels and one wait: norm and decision; the moments, whose last block makes "
            "the per-tensor sums and trust ratios; apply") {
    CHECK(cost_per_step<mpopt::fp16, mpopt::lamb, mpopt::dynamic_scale>({}, 3) == repeat(3, {3, 1}));
    CHECK(cost_per_step<mpopt::bf16, mpopt::lamb>({}, 3) == repeat(3, {3, 1}));
    CHECK(cost_per_step<mpopt::fp32, mpopt::lamb>({}, 3) == repeat(3, {3, 1}));
  }

  TEST_CASE("with nothing to know before the update (no clipping, no overflow skip) there is no gradient pass: the "
            "decision copied in, the update summing the gradient's squares as it reads them, one wait") {
    const mpopt::optimizer_options unchecked{.clip_grad = 0, .skip_nonfinite = false};
    CHECK(cost_per_step<mpopt::bf16, mpopt::adam>({}, 3, -1, unchecked) == repeat(3, {1, 1}));
    CHECK(cost_per_step<mpopt::fp32, mpopt::adam>({}, 3, -1, unchecked) == repeat(3, {1, 1}));
    // LAMB: moments (with the per-tensor sums and trust ratios), apply.
    CHECK(cost_per_step<mpopt::fp32, mpopt::lamb>({}, 3, -1, unchecked) == repeat(3, {2, 1}));
    // Under ZeRO: the bucket packed, the update, the all-gather's pack and unpack. Waits: the
    // packed bucket, the gathered bucket, the end of the step (the norms summed across ranks
    // after it need no other).
    CHECK(cost_per_step<mpopt::bf16, mpopt::adam, mpopt::no_scaling, mpopt::zero1>({}, 3, -1, unchecked) ==
          repeat(3, {4, 3}));
  }

  TEST_CASE("the kernels do not depend on the number of tensors: 1000 tensors cost what two do") {
    const auto tensors = many_tensors(1000);
    CHECK(cost_per_step<mpopt::fp16, mpopt::adam, mpopt::dynamic_scale>({}, 2, -1, {}, tensors) == repeat(2, {2, 1}));
    CHECK(cost_per_step<mpopt::bf16, mpopt::lamb>({}, 2, -1, {}, tensors) == repeat(2, {3, 1}));
    const mpopt::optimizer_options unchecked{.clip_grad = 0, .skip_nonfinite = false};
    CHECK(cost_per_step<mpopt::bf16, mpopt::adam>({}, 2, -1, unchecked, tensors) == repeat(2, {1, 1}));
  }

  TEST_CASE("a skipped step is decided on the device too: the same kernels (over empty chunks), one wait") {
    CHECK(cost_per_step<mpopt::fp16, mpopt::adam, mpopt::dynamic_scale>({}, 3, 1) == repeat(3, {2, 1}));
    CHECK(cost_per_step<mpopt::fp32, mpopt::lamb>({}, 3, 1) == repeat(3, {3, 1}));
  }

  TEST_CASE("under ZeRO the device decides too, and the host reads the decision before the update, whose "
            "collectives may fail after the commit") {
    // Adam: the bucket packed, overflow and norm with the decision | the update, the all-gather's
    // pack and unpack. Waits: the packed bucket, the decision | the gathered bucket, the end of the
    // step. A skipped step stops at the bar.
    CHECK(cost_per_step<mpopt::fp16, mpopt::adam, mpopt::dynamic_scale, mpopt::zero1>({}, 3, 1) ==
          std::vector<step_cost>{{5, 4}, {2, 2}, {5, 4}});
    // LAMB adds its moments, per-tensor sums and trust ratios (a shard's sums are partial: ranks
    // add them up between the three, and the host waits for them).
    CHECK(cost_per_step<mpopt::fp32, mpopt::lamb, mpopt::no_scaling, mpopt::zero2>({}, 3, 1) ==
          std::vector<step_cost>{{8, 5}, {2, 2}, {8, 5}});
  }

  TEST_CASE("1-bit LAMB on one rank decides on the host: LAMB's passes, one copy at the freeze step, then three; "
            "the momentum scaling once; excluding zero variance reads the variance at the first compressed step "
            "only") {
    mpopt::onebit_lamb::options o;
    o.freeze_step = 3;
    o.compression.exclude_zero_variance = false;
    // Steps 2..7 after the first: warm-up (2), the freeze step (3) copies the variance, the first
    // compressed step (4) measures the momentum scales (its trust ratios are the frozen ones, made
    // on the host), then compressed steps. Waits: the decision, then the frozen coefficient (warm-up)
    // or the compression factors, and the end of the step; the momentum scales once more.
    std::vector<step_cost> want = {{3, 3}, {4, 3}, {4, 4}, {3, 3}, {3, 3}, {3, 3}};
    CHECK(cost_per_step<mpopt::bf16, mpopt::onebit_lamb>(o, 6) == want);
    CHECK(cost_per_step<mpopt::fp32, mpopt::onebit_lamb>(o, 6) == want);
    // The exclusion's cold read: a wait, then the variance of each of the 3 chunks twice (its
    // tensor's mean, then the bits); no kernel.
    o.compression.exclude_zero_variance = true;
    want[2].waits += 1 + 2 * 3;
    CHECK(cost_per_step<mpopt::fp32, mpopt::onebit_lamb>(o, 6) == want);
  }
}
