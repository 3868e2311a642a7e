// Adam / AdamW against the float64 reference (tests/reference.hpp) for every valid combination of
// precision, loss scaler, rule variant and layout.
#include <doctest/doctest.h>

#include "harness.hpp"

using namespace harness;

namespace {

// Tolerance (harness.hpp, `tolerance` and `bounds`). The library computes in float32; the reference
// in float64. Rather than one constant for all elements, the harness propagates a first-order forward
// error bound of a float32 evaluation of the contract next to the reference, element by element:
// every operation may round by u = 2^-24, the master is stored in float, and the global norm (a float
// sum per block) may be off by 1e-5 relative (checked directly on grad_norm, clip_coef and
// grad_norm_clipped: a float sum of n squares rounds like sqrt(n)*u, ~4e-6 for blocks of thousands).
// The bound is amplified by the exact sensitivities of Adam: where eps dominates sqrt(v), where m
// cancels to ~0, or where L2 decay cancels the gradient (g + wd*p ~ 0 leaves an absolute error of
// u*|wd*p| that u = m/(sqrt(v)+eps) magnifies up to 1/eps), the bound is wide; everywhere else it is
// a few u relative per step (24 steps of float master storage alone: 24u = 1.4e-6 relative).
// Masters, both moments and trust ratios must lie within 2x that bound (the factor covers second-order
// terms; the library's worst element reaches ~0.5 of it, i.e. ~the bound itself, where the float
// master's own rounding dominates). A constant tolerance would either hide real errors in
// well-conditioned elements or fail on the few ill-conditioned ones: with a constant rtol 4e-6 plus
// lr*2e-5, the L2 variant fails on an element whose g + wd*p cancels to 2e-8 at step 1 (error 1.4e-7,
// legitimate). Scaling the (1-beta1)*g term of the reference by 1 + 1e-5 makes every case fail.

template <int Variant>
struct adam_groups {
  // Variant 0: AdamW; 1: L2 decay (decoupled_weight_decay = false); 2: AdamW without bias correction.
  // Group 0 decays, group 1 does not and has its own lr, betas and eps.
  static mpopt::adam::options g0() {
    mpopt::adam::options o;
    o.lr = 1e-3;
    o.weight_decay = Variant == 1 ? 0.01 : 0.1;
    o.decoupled_weight_decay = Variant != 1;
    o.bias_correction = Variant != 2;
    return o;
  }
  static mpopt::adam::options g1() {
    mpopt::adam::options o;
    o.lr = 3e-3;
    o.beta1 = 0.8;
    o.beta2 = 0.99;
    o.eps = 1e-6;
    o.weight_decay = 0.0;
    o.decoupled_weight_decay = Variant != 1;
    o.bias_correction = Variant != 2;
    return o;
  }
};

}  // namespace

#define ADAM_CFGS(V)                                                                                        \
  cfg<mpopt::fp32, mpopt::no_scaling, V, layout::unfused>, cfg<mpopt::fp32, mpopt::no_scaling, V, layout::flat>,       \
      cfg<mpopt::bf16, mpopt::no_scaling, V, layout::unfused>, cfg<mpopt::bf16, mpopt::no_scaling, V, layout::flat>,   \
      cfg<mpopt::fp16, mpopt::no_scaling, V, layout::unfused>, cfg<mpopt::fp16, mpopt::no_scaling, V, layout::flat>,   \
      cfg<mpopt::fp16, mpopt::static_scale, V, layout::unfused>,                                            \
      cfg<mpopt::fp16, mpopt::static_scale, V, layout::flat>,                                               \
      cfg<mpopt::fp16, mpopt::dynamic_scale, V, layout::unfused>,                                           \
      cfg<mpopt::fp16, mpopt::dynamic_scale, V, layout::flat>

TEST_SUITE("adam") {
  TEST_CASE_TEMPLATE("masters, params, moments and status follow the float64 reference for 24 steps", C,
                     ADAM_CFGS(0), ADAM_CFGS(1), ADAM_CFGS(2)) {
    using opt_t = mpopt::optimizer<typename C::precision, typename C::scaler, mpopt::replicated, mpopt::adam, test_backend>;
    const std::string what = describe<C>();
    CAPTURE(what);
    using G = adam_groups<C::variant>;
    run_against_reference<opt_t>(C::lay, default_scaler_options<typename C::scaler>(), G::g0(), G::g1(),
                                 0xADA0 + 17 * C::variant);
  }

  TEST_CASE("the first applied step uses t = 1: a single element moves by lr * (1 + wd*p) in AdamW") {
    // m/bc1 = g and sqrt(v/bc2) = |g| at t = 1, so u = sign(g) + wd*p exactly (up to eps).
    using opt_t = mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::adam, test_backend>;
    opt_t opt({.clip_grad = 0});
    std::vector<float> p{0.5f}, g{0.25f};
    opt.add_group({.lr = 0.01, .weight_decay = 0.1}).add(p, g);
    const auto st = opt.step();
    CHECK(st.step == 1);
    CHECK(close(p[0], 0.5 - 0.01 * (0.25 / (0.25 + 1e-8) + 0.1 * 0.5), 1e-6));
  }
}
