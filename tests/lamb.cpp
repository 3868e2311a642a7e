// LAMB against the float64 reference (tests/reference.hpp) for every valid combination of precision,
// loss scaler, rule variant and layout, plus the trust-ratio corner cases.
#include <doctest/doctest.h>

#include "harness.hpp"

using namespace harness;

namespace {

// Tolerance: the forward error bound of harness.hpp (see adam.cpp). For LAMB it also carries the
// per-tensor norms ||p|| and ||u|| (float sums, 1e-5 relative, plus the element errors) into the
// trust ratio, whose clamp is 1-Lipschitz; a tensor whose m cancels (small tensors) gets a wide bound.

template <int Variant>
struct lamb_groups {
  // Variant 0: default options (group 1 with a narrow clamp so both ends bind);
  // 1: eps inside the sqrt; 2: weight decay in group 0, no bias correction in group 1.
  static mpopt::lamb::options g0() {
    mpopt::lamb::options o;
    o.lr = 1e-3;
    o.eps_inside_sqrt = Variant == 1;
    o.weight_decay = Variant == 2 ? 0.01 : 0.0;
    return o;
  }
  static mpopt::lamb::options g1() {
    mpopt::lamb::options o;
    o.lr = 3e-3;
    o.beta1 = 0.8;
    o.beta2 = 0.99;
    o.eps = 1e-6;
    o.eps_inside_sqrt = Variant == 1;
    o.bias_correction = Variant != 2;
    if (Variant == 0) {  // ratios here are ~0.1..1: both ends of the clamp bind
      o.min_coeff = 0.3;
      o.max_coeff = 0.4;
    }
    return o;
  }
};

}  // namespace

#define LAMB_CFGS(V)                                                                                        \
  cfg<mpopt::fp32, mpopt::no_scaling, V, layout::unfused>, cfg<mpopt::fp32, mpopt::no_scaling, V, layout::flat>,       \
      cfg<mpopt::bf16, mpopt::no_scaling, V, layout::unfused>, cfg<mpopt::bf16, mpopt::no_scaling, V, layout::flat>,   \
      cfg<mpopt::fp16, mpopt::no_scaling, V, layout::unfused>, cfg<mpopt::fp16, mpopt::no_scaling, V, layout::flat>,   \
      cfg<mpopt::fp16, mpopt::static_scale, V, layout::unfused>,                                            \
      cfg<mpopt::fp16, mpopt::static_scale, V, layout::flat>,                                               \
      cfg<mpopt::fp16, mpopt::dynamic_scale, V, layout::unfused>,                                           \
      cfg<mpopt::fp16, mpopt::dynamic_scale, V, layout::flat>

TEST_SUITE("lamb") {
  TEST_CASE_TEMPLATE("masters, params, moments, trust ratios and status follow the float64 reference for 24 steps", C,
                     LAMB_CFGS(0), LAMB_CFGS(1), LAMB_CFGS(2)) {
    using opt_t = mpopt::optimizer<typename C::precision, typename C::scaler, mpopt::replicated, mpopt::lamb, test_backend>;
    const std::string what = describe<C>();
    CAPTURE(what);
    using G = lamb_groups<C::variant>;
    const auto st = run_against_reference<opt_t>(C::lay, default_scaler_options<typename C::scaler>(), G::g0(),
                                                 G::g1(), 0x1A3B0 + 29 * C::variant);
    if (C::variant == 0) {
      CHECK(st.at_min_coeff > 0);
      CHECK(st.at_max_coeff > 0);
    }
  }

  TEST_CASE("a tensor with zero weights or a zero update gets trust ratio 1; otherwise the clamp binds at both ends") {
    using opt_t = mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::lamb, test_backend>;
    rig<opt_t> r(layout::unfused, {.clip_grad = 0});
    r.add_group({.lr = 0.01, .min_coeff = 0.1, .max_coeff = 0.4}, {5, 2, 2, 2}, 0x2E0);
    const std::vector<std::vector<double>> p{{0, 0, 0, 0, 0}, {1, 2}, {1, 2}, {0.01, 0.02}};
    for (std::size_t i = 0; i < p.size(); ++i)
      for (std::size_t k = 0; k < p[i].size(); ++k) r.set_param(i, k, p[i][k]);
    // zero weights; zero gradient (so a zero update, no decay); ordinary; small weights
    const std::vector<ref::tensor> g{{0.1, -0.2, 0.3, 0.0, 1.0}, {0, 0}, {0.5, 0.5}, {0.5, 0.5}};
    const auto res = r.step(g);
    r.check(res);
    REQUIRE(res.lib.applied);
    const auto c = r.opt.lamb_coeffs();
    REQUIRE(c.size() == 4);
    CHECK(c[0] == 1.0);
    CHECK(c[1] == 1.0);
    // At t = 1, u = m/(sqrt(v)+eps) = 0.1*0.5/(sqrt(0.001)*0.5) = sqrt(10) per element, so
    // ||p||/||u|| = sqrt(5)/sqrt(20) = 0.5 (clamped to 0.4) and 0.0224/4.47 = 0.005 (clamped to 0.1).
    CHECK(close(c[2], 0.4, 1e-6));
    CHECK(close(c[3], 0.1, 1e-6));
    // Zero weights move by step_size * 1 * u with step_size = lr*sqrt(1-b2)/(1-b1).
    const double step_size = 0.01 * std::sqrt(0.001) / 0.1;
    CHECK(close(r.opt.master(0)[4], -step_size * std::sqrt(10.0), 1e-5));
    CHECK(r.opt.master(1)[0] == 1.0f);
    r.check(r.step(g));  // second step: the weights are no longer zero
  }
}
