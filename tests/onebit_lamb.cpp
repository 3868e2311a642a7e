// 1-bit LAMB (mpopt::onebit_lamb) in one process: warm-up is LAMB without bias correction (against
// the float64 LAMB reference, and bit for bit against mpopt::lamb); the compression stage, which on
// one rank averages nothing, against the float64 1-bit LAMB reference (onebit_reference.hpp);
// checkpoints, overflow, options. Multi-rank behaviour (the compressed all-reduce) is in
// mpi_onebit.cpp.
#include <doctest/doctest.h>

#include <filesystem>

#include "harness.hpp"
#include "onebit_reference.hpp"
#include "temp_dir.hpp"

using namespace harness;

namespace {

mpopt::onebit_lamb::options onebit_options(double lr, double wd, std::uint64_t freeze) {
  mpopt::onebit_lamb::options o;
  o.lr = lr;
  o.weight_decay = wd;
  o.freeze_step = freeze;
  return o;
}

template <class Opt>
struct tensors {
  using P = typename Opt::param_type;
  using G = typename Opt::grad_type;
  std::vector<std::vector<P>> p;
  std::vector<std::vector<G>> g;

  tensors(Opt& opt, const std::vector<std::size_t>& sizes, const typename Opt::group_options& o, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal(0.0, 0.5);
    auto& group = opt.add_group(o);
    for (std::size_t n : sizes) {
      p.emplace_back(n);
      g.emplace_back(n);
      for (auto& x : p.back()) x = from_double<P>(normal(rng));
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) group.add(p[i], g[i], std::string("t") + std::to_string(i));
  }
  /// Writes truth * scale rounded to the gradient type; returns what the optimizer will read.
  std::vector<ref::tensor> write(const std::vector<ref::tensor>& truth, double scale = 1.0) {
    std::vector<ref::tensor> seen(truth.size());
    for (std::size_t i = 0; i < truth.size(); ++i)
      for (std::size_t k = 0; k < truth[i].size(); ++k) {
        g[i][k] = from_double<G>(truth[i][k] * scale);
        seen[i].push_back(double(float(g[i][k])) / scale);
      }
    return seen;
  }
  std::vector<ref::tensor> initial() const {
    std::vector<ref::tensor> out;
    for (const auto& t : p) {
      out.emplace_back();
      for (auto x : t) out.back().push_back(double(float(x)));
    }
    return out;
  }
};

/// Every master, moment (including the fresh variance), parameter and coefficient, as bits.
template <class Opt>
std::vector<std::uint32_t> state_bits(const Opt& opt, const tensors<Opt>& t) {
  std::vector<std::uint32_t> out;
  for (std::size_t i = 0; i < t.p.size(); ++i) {
    for (auto x : t.p[i]) out.push_back(bits(x));
    for (float x : opt.master(i)) out.push_back(bits(x));
    for (std::size_t k = 0; k < 3; ++k)
      for (float x : opt.moment(k, i)) out.push_back(bits(x));
  }
  for (double c : opt.lamb_coeffs()) out.push_back(std::uint32_t(std::bit_cast<std::uint64_t>(c) >> 20));
  return out;
}

}  // namespace

#define ONEBIT_WARMUP_CFGS                                                                              \
  cfg<mpopt::fp32, mpopt::no_scaling, 0, layout::unfused>, cfg<mpopt::fp32, mpopt::no_scaling, 0, layout::flat>, \
      cfg<mpopt::bf16, mpopt::no_scaling, 0, layout::unfused>, cfg<mpopt::bf16, mpopt::no_scaling, 0, layout::flat>, \
      cfg<mpopt::fp16, mpopt::dynamic_scale, 0, layout::unfused>, cfg<mpopt::fp16, mpopt::dynamic_scale, 0, layout::flat>

TEST_SUITE("onebit_lamb") {
  TEST_CASE_TEMPLATE("warm-up follows the float64 LAMB reference without bias correction for 24 steps", C,
                     ONEBIT_WARMUP_CFGS) {
    using opt_t = mpopt::optimizer<typename C::precision, typename C::scaler, mpopt::replicated, mpopt::onebit_lamb, test_backend>;
    const std::string what = describe<C>();
    CAPTURE(what);
    auto g0 = onebit_options(1e-3, 0.01, 1000), g1 = onebit_options(3e-3, 0.0, 1000);
    g1.beta1 = 0.8;
    g1.beta2 = 0.99;
    g1.min_coeff = 0.3;  // ratios here are ~0.1..1: both ends of the clamp bind
    g1.max_coeff = 0.4;
    const auto st = run_against_reference<opt_t>(C::lay, default_scaler_options<typename C::scaler>(), g0, g1, 0x0B17);
    CHECK(st.at_min_coeff > 0);
    CHECK(st.at_max_coeff > 0);
  }

  TEST_CASE_TEMPLATE("warm-up equals mpopt::lamb (bias_correction off) bit for bit, through the freeze step", P,
                     mpopt::fp32, mpopt::bf16) {
    using one_t = mpopt::optimizer<P, mpopt::no_scaling, mpopt::replicated, mpopt::onebit_lamb, test_backend>;
    using lamb_t = mpopt::optimizer<P, mpopt::no_scaling, mpopt::replicated, mpopt::lamb, test_backend>;
    const std::vector<std::size_t> sizes{1, 7, 70001, 300};
    one_t one;
    lamb_t plain;
    mpopt::lamb::options lo{.lr = 1e-3, .weight_decay = 0.01, .bias_correction = false};
    tensors<one_t> a(one, sizes, onebit_options(1e-3, 0.01, 6), 7);
    tensors<lamb_t> b(plain, sizes, lo, 7);
    std::mt19937_64 rng(11);
    for (int s = 0; s < 6; ++s) {
      CAPTURE(s);
      const auto truth = random_grads(sizes, rng, s % 2 ? 3.0 : 0.5);
      a.write(truth);
      b.write(truth);
      const auto sa = one.step(), sb = plain.step();
      CHECK(sa.applied);
      CHECK(sa.grad_norm == sb.grad_norm);
      CHECK(sa.compression_step == 0);
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        CHECK(std::equal(a.p[i].begin(), a.p[i].end(), b.p[i].begin(), [](auto x, auto y) { return bits(x) == bits(y); }));
        for (std::size_t k = 0; k < 2; ++k) {
          const auto ma = one.moment(k, i), mb = plain.moment(k, i);
          CHECK(std::equal(ma.begin(), ma.end(), mb.begin()));
        }
      }
      CHECK(std::equal(one.lamb_coeffs().begin(), one.lamb_coeffs().end(), plain.lamb_coeffs().begin()));
    }
    // The last warm-up step froze the variance: the fresh one starts as its copy.
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const auto v = one.moment(1, i), fresh = one.moment(2, i);
      CHECK(std::equal(v.begin(), v.end(), fresh.begin()));
    }
  }

  TEST_CASE_TEMPLATE(
      "the compression stage on one rank follows the float64 1-bit LAMB reference: masters, momentum, fresh "
      "variance and coefficients (frozen coefficient times the clamped factor)",
      P, mpopt::fp32, mpopt::bf16) {
    using opt_t = mpopt::optimizer<P, mpopt::no_scaling, mpopt::replicated, mpopt::onebit_lamb, test_backend>;
    for (double wd : {0.0, 0.05}) {
      CAPTURE(wd);
      const std::vector<std::size_t> sizes{1, 13, 70001, 2000};
      const std::uint64_t freeze = 6;
      auto o = onebit_options(2e-3, wd, freeze);
      o.beta2 = 0.5;  // a fresh variance that drifts within the test's steps
      o.factor_threshold = 0.2;
      opt_t opt{{.clip_grad = 1.0}};
      tensors<opt_t> t(opt, sizes, o, 99);
      ref::onebit_hyper h{.lr = o.lr, .beta2 = 0.5, .weight_decay = wd, .freeze_step = freeze, .factor_threshold = 0.2};
      ref::onebit_model model(1, h, t.initial());
      std::vector<ref::tensor> path;  // per element, the sum of |update| over the steps so far
      for (std::size_t n : sizes) path.emplace_back(n, 0.0);
      std::mt19937_64 rng(5);
      double worst_p = 0, worst_m = 0, worst_c = 0;
      int step_up = 0, step_down = 0, at_max = 0, at_min = 0;  // the factor's clamps that bound
      for (int s = 0; s < 26; ++s) {
        CAPTURE(s);
        // Warm-up on one gradient distribution, then a shift: the fresh variance drifts from the frozen one.
        // After warm-up, tensor 1's and 2's gradients grow and tensor 3's shrink: their fresh
        // variances drift away from the frozen ones, so the factors fall and rise against their clamps.
        auto truth = random_grads(sizes, rng, s % 3 == 1 ? 3.0 : 0.5);
        for (auto& x : truth[1]) x *= s >= 8 ? 20.0 : 1.0;
        for (auto& x : truth[2]) x *= s >= 8 ? 5.0 : 1.0;
        for (auto& x : truth[3]) x *= s >= 8 ? 0.01 : 1.0;
        const auto seen = t.write(truth);
        const auto st = opt.step();
        const auto before = model.p;
        const auto last = model.last_factor;
        model.step({seen});
        for (std::size_t i = 0; i < sizes.size() && s + 1 > int(freeze); ++i) {
          const double f = model.last_factor[i];
          step_up += f == last[i] * (1 + h.factor_threshold);
          step_down += f == last[i] * (1 - h.factor_threshold);
          at_max += f == h.factor_max;
          at_min += f == h.factor_min;
        }
        for (std::size_t i = 0; i < sizes.size(); ++i)
          for (std::size_t k = 0; k < sizes[i]; ++k) path[i][k] += std::abs(model.p[i][k] - before[i][k]);
        REQUIRE(st.applied);
        CHECK(st.compression_step == (std::uint64_t(s) + 1 > freeze ? freeze + 1 : 0));
        CHECK(close(st.grad_norm, model.grad_norm, 1e-5));
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          const auto ms = opt.master(i), m = opt.moment(0, i), fresh = opt.moment(2, i);
          for (std::size_t k = 0; k < sizes[i]; ++k) {
            // masters: float rounding of p at every step, plus each update's relative error (1e-5:
            // the coefficients, checked to 1e-5 below, plus the rounding of u) times its size
            const double tol = (s + 1) * 0x1p-23 * std::abs(model.p[i][k]) + 2e-5 * path[i][k];
            worst_p = std::max(worst_p, std::abs(ms[k] - model.p[i][k]) / (tol + 1e-30));
            const double mref = model.m[i][k];
            worst_m = std::max(worst_m, std::abs(m[k] - mref) / (1e-5 * std::abs(mref) + 1e-7 * model.grad_norm + 1e-12));
            if (s + 1 > int(freeze))
              worst_m = std::max(worst_m, std::abs(fresh[k] - model.v_fresh[i][k]) / (1e-4 * model.v_fresh[i][k] + 1e-14));
          }
          worst_c = std::max(worst_c, std::abs(opt.lamb_coeffs()[i] - model.coeffs[i]) / (1e-5 * model.coeffs[i] + 1e-12));
        }
      }
      CHECK_MESSAGE(worst_p <= 1.0, "masters off the reference: worst error / tolerance = " << worst_p);
      CHECK_MESSAGE(worst_m <= 1.0, "moments off the reference: worst error / tolerance = " << worst_m);
      CHECK_MESSAGE(worst_c <= 1.0, "coefficients off the reference: worst error / tolerance = " << worst_c);
      // Every clamp of the factor bound at some step: the comparison covers them all.
      CHECK(step_up > 0);
      CHECK(step_down > 0);
      CHECK(at_max > 0);
      CHECK(at_min > 0);
      MESSAGE("worst error / tolerance: masters " << worst_p << ", moments " << worst_m << ", coefficients " << worst_c
                                                  << "; factor steps clamped up " << step_up << ", down " << step_down
                                                  << ", at max " << at_max << ", at min " << at_min);
    }
  }

  TEST_CASE_TEMPLATE("a checkpoint taken in warm-up or in the compression stage resumes bit for bit", P, mpopt::fp32,
                     mpopt::bf16) {
    using opt_t = mpopt::optimizer<P, mpopt::no_scaling, mpopt::replicated, mpopt::onebit_lamb, test_backend>;
    const std::vector<std::size_t> sizes{3, 5000, 17};
    const temp_dir dir("mpopt_onebit_");
    for (int saved_at : {2, 6}) {  // freeze_step 4: warm-up, compression
      CAPTURE(saved_at);
      opt_t a, b;
      tensors<opt_t> ta(a, sizes, onebit_options(1e-3, 0.01, 4), 3);
      tensors<opt_t> tb(b, sizes, onebit_options(5e-2, 0.0, 99), 4);  // other values: load replaces them
      std::mt19937_64 rng(8);
      std::vector<std::vector<ref::tensor>> data;
      for (int s = 0; s < 12; ++s) data.push_back(random_grads(sizes, rng, 1.0));
      for (int s = 0; s < saved_at; ++s) {
        ta.write(data[std::size_t(s)]);
        a.step();
      }
      a.save(dir.path / "onebit.safetensors");
      b.load(dir.path / "onebit.safetensors");
      CHECK(state_bits(b, tb) == state_bits(a, ta));
      for (int s = saved_at; s < 12; ++s) {
        CAPTURE(s);
        ta.write(data[std::size_t(s)]);
        tb.write(data[std::size_t(s)]);
        const auto sa = a.step(), sb = b.step();
        CHECK(sa.compression_step == sb.compression_step);
        CHECK(sa.grad_norm == sb.grad_norm);
        CHECK(state_bits(b, tb) == state_bits(a, ta));
      }
    }
  }

  TEST_CASE("fp16 with the dynamic scaler: an overflow in the compression stage skips the step and changes nothing") {
    using opt_t = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::onebit_lamb, test_backend>;
    const std::vector<std::size_t> sizes{100, 33};
    opt_t opt{{}, {.init_scale = 1024, .hysteresis = 1}};
    tensors<opt_t> t(opt, sizes, onebit_options(1e-3, 0.0, 3), 1);
    std::mt19937_64 rng(2);
    for (int s = 0; s < 5; ++s) {
      t.write(random_grads(sizes, rng, 0.5), opt.loss_scale());
      CHECK(opt.step().applied);
    }
    const auto before = state_bits(opt, t);
    const double scale = opt.loss_scale();
    auto g = random_grads(sizes, rng, 0.5);
    g[1][7] = 1e5 / scale;  // overflows fp16 once scaled
    t.write(g, scale);
    const auto st = opt.step();
    CHECK(st.result == mpopt::step_result::skipped_nonfinite);
    CHECK(st.compression_step == 4);
    CHECK(opt.loss_scale() == scale / 2);
    CHECK(state_bits(opt, t) == before);
    t.write(random_grads(sizes, rng, 0.5), opt.loss_scale());
    CHECK(opt.step().applied);
  }

  TEST_CASE("bad 1-bit LAMB options throw mpopt::error naming the field; groups must share freeze_step") {
    using opt_t = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::onebit_lamb, test_backend>;
    auto message = [](auto&& f) {
      try {
        f();
      } catch (const mpopt::error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    auto bad = [&](auto change) {
      opt_t opt;
      auto o = onebit_options(1e-3, 0.0, 10);
      change(o);
      return message([&] { opt.add_group(o); });
    };
    CHECK(bad([](auto& o) { o.freeze_step = 0; }).find("group 0.freeze_step must be >= 1") != std::string::npos);
    CHECK(bad([](auto& o) { o.coeff_beta = 1.0; }).find("group 0.coeff_beta must be in [0, 1)") != std::string::npos);
    CHECK(bad([](auto& o) { o.factor_min = 5.0; }).find("group 0.factor_min (5) must be <= factor_max (4)") != std::string::npos);
    CHECK(bad([](auto& o) { o.factor_threshold = 1.0; }).find("group 0.factor_threshold must be in [0, 1), got 1") != std::string::npos);
    CHECK(bad([](auto& o) { o.factor_min = 0.0; }).find("group 0.factor_min must be > 0") != std::string::npos);
    opt_t opt;
    std::vector<mpopt::bfloat16> p1(4), g1(4), p2(4), g2(4);
    opt.add_group(onebit_options(1e-3, 0.0, 10)).add(p1, g1);
    opt.add_group(onebit_options(1e-3, 0.0, 11)).add(p2, g2);
    CHECK(message([&] { opt.step(); }).find("group 1.freeze_step (11) differs from group 0's (10)") != std::string::npos);
    CHECK(opt.tensor_count() == 0);  // nothing was set up
    opt_t one;
    one.add_group(onebit_options(1e-3, 0.0, 10)).add(p1, g1);
    one.finalize();
    CHECK(message([&] { (void)one.moment(3, 0); }).ends_with("moment 3: onebit_lamb keeps moments 0 to 2"));
  }
}
