// mpopt::muon through the optimizer on one rank, every step against the float64 Muon of
// muon_reference.hpp (written from torch.optim.Muon's documented algorithm): tall, wide, square and
// 3-D tensors (flattened to the first dimension by the rest), Nesterov on and off, both rate
// adjustments, the iteration in fp32 and bf16; in fp32, bf16, and fp16 under static and dynamic
// scaling, with clipping, and a skipped overflow that changes nothing. Then what it refuses, and
// its resume. Last, the steps tests/torch_muon.py compares with torch.optim.Muon (a test case
// skipped unless it is run with --no-skip, as that script does).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <mpopt/checkpoint.hpp>
#include <mpopt/detail/options/fields_json.hpp>
#include <mpopt/host_passes.hpp>  // Muon's host passes (not compiled once in libmpopt)
#include <mpopt/muon.hpp>
#include <mpopt/optimizer.hpp>

#include "error_of.hpp"
#include "muon_reference.hpp"

namespace {

using mpopt::muon;
using muon_reference::muon_settings;

struct matrix_shape {
  std::size_t rows;
  mpopt::tensor_shape shape;
  std::size_t size;
};

const std::vector<matrix_shape> shapes = {
    {12, {12, 5}, 60}, {5, {5, 12}, 60}, {8, {8, 8}, 64}, {3, {3, 4, 5}, 60}, {1, {1, 7}, 7}};

/// Steps of an optimizer over `shapes` and of the reference, with the same gradients: the masters'
/// movement and the buffers after each step. Step `overflow` (if any) has an inf gradient.
template <class Precision, class Scaler>
void check_steps(const muon_settings& s, double clip, typename Scaler::options so, int overflow = 0) {
  using param_t = typename Precision::param_type;
  using grad_t = typename Precision::grad_type;
  mpopt::optimizer<Precision, Scaler, mpopt::replicated, muon> opt({.clip_grad = clip}, so);
  muon::options o{.lr = s.lr, .weight_decay = s.weight_decay, .momentum = s.momentum, .nesterov = s.nesterov};
  o.adjust_lr_fn = s.adjustment;
  o.ns_precision = s.ns.precision;
  auto& group = opt.add_group(o);

  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::size_t n = shapes.size();
  std::vector<std::vector<param_t>> params(n);
  std::vector<std::vector<grad_t>> grads(n);
  std::vector<std::vector<double>> p_ref(n), b_ref(n), p0(n);
  for (std::size_t t = 0; t < n; ++t) {
    params[t].resize(shapes[t].size);
    grads[t].resize(shapes[t].size);
    for (auto& v : params[t]) v = param_t(0.1f * normal(gen));
    p0[t].assign(params[t].begin(), params[t].end());
    p_ref[t] = p0[t];
    b_ref[t].assign(shapes[t].size, 0.0);
    group.add(params[t], grads[t], "w" + std::to_string(t), shapes[t].shape);
  }

  for (int step = 1; step <= 5; ++step) {
    CAPTURE(step);
    const double scale = opt.loss_scale();
    std::vector<std::vector<double>> g(n);  // the true gradients, as the stored values give them
    double squares = 0;
    for (std::size_t t = 0; t < n; ++t) {
      for (auto& v : grads[t]) v = grad_t(float(scale) * 0.01f * normal(gen));
      if (step == overflow && t == 2) grads[t][3] = grad_t(INFINITY);
      for (auto v : grads[t]) g[t].push_back(double(float(v)) / scale);
      for (double v : g[t]) squares += v * v;
    }
    const auto status = opt.step();
    if (step == overflow) {
      CHECK(status.result == mpopt::step_result::skipped_nonfinite);
    } else {
      REQUIRE(status.applied);
      const double norm = std::sqrt(squares);
      const double coef = clip > 0 && clip / (norm + 1e-6) < 1 ? clip / (norm + 1e-6) : 1.0;
      for (std::size_t t = 0; t < n; ++t) {
        for (double& v : g[t]) v *= coef;
        muon_reference::reference_step(p_ref[t], b_ref[t], g[t], shapes[t].rows, shapes[t].size / std::max<std::size_t>(shapes[t].rows, 1), s);
      }
    }
    for (std::size_t t = 0; t < n; ++t) {
      CAPTURE(t);
      const auto master = opt.master(t);
      const auto moment = opt.moment(0, t);
      const std::vector<double> buffer(moment.begin(), moment.end());
      std::vector<double> moved(master.size()), want(master.size()), scaled(master.size());
      for (std::size_t k = 0; k < master.size(); ++k) {
        moved[k] = double(master[k]) - p0[t][k];
        want[k] = p_ref[t][k] - p0[t][k];
        scaled[k] = (1 - s.momentum) * b_ref[t][k];
      }
      // Bounds as muon_math.cpp's, whose formulas these are: float rounding in fp32; in bf16, an
      // iteration value near a bf16 midpoint may round the other way than the reference's.
      const double bound = s.ns.precision == mpopt::detail::newton_schulz_precision::fp32 ? 1e-5 : 5e-3;
      CHECK(newton_schulz_reference::relative_error(moved, want) < bound);
      CHECK(newton_schulz_reference::relative_error(buffer, scaled) < 1e-6);
    }
  }
}

}  // namespace

TEST_CASE("mpopt::muon follows the float64 Muon in fp32, bf16 and fp16: every step, every shape and setting") {
  using adjustment = muon::lr_adjustment;
  using precision = muon::iteration_precision;
  for (bool nesterov : {true, false})
    for (auto adjust : {adjustment::original, adjustment::match_rms_adamw})
      for (auto iteration : {precision::fp32, precision::bf16}) {
        CAPTURE(nesterov);
        CAPTURE(int(adjust));
        CAPTURE(int(iteration));
        muon_settings s;
        s.nesterov = nesterov;
        s.adjustment = adjust;
        s.ns.precision = iteration;
        SUBCASE("fp32, unclipped") { check_steps<mpopt::fp32, mpopt::no_scaling>(s, 0.0, {}); }
        SUBCASE("bf16, clipped") { check_steps<mpopt::bf16, mpopt::no_scaling>(s, 0.05, {}); }
        SUBCASE("fp16, static scale") { check_steps<mpopt::fp16, mpopt::static_scale>(s, 1.0, {.scale = 1024}); }
        SUBCASE("fp16, dynamic scale, an overflow skipped") {
          check_steps<mpopt::fp16, mpopt::dynamic_scale>(s, 1.0, {.init_scale = 4096, .hysteresis = 1}, 3);
        }
      }
}

TEST_CASE("mpopt::muon refuses a tensor that is no matrix, and options torch refuses") {
  std::vector<float> p(8, 0.5f), g(8, 0.1f), w(64, 0.5f), gw(64, 0.1f);
  {
    mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, muon> opt;
    opt.add_group({}).add(p, g, "bias", {8});
    CHECK(error_of([&] { opt.step(); }).find("muon works on matrices: tensor 'bias' has the shape [8]") !=
          std::string::npos);
    CHECK(p[0] == 0.5f);
  }
  {
    mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, muon> opt;
    opt.add_group({}).add(p, g, "unshaped");
    CHECK(error_of([&] { opt.finalize(); }).find("tensor 'unshaped' has no shape") != std::string::npos);
  }
  {
    muon::options o;
    o.ns_steps = 100;
    mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, muon> opt;
    CHECK(error_of([&] { opt.add_group(o); }).find("ns_steps") != std::string::npos);
  }
}

TEST_CASE("mpopt::muon resumes bitwise from a checkpoint, which keeps its momentum by torch's name") {
  using opt_t = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, muon>;
  struct model {
    std::vector<mpopt::bfloat16> w = std::vector<mpopt::bfloat16>(96), v = std::vector<mpopt::bfloat16>(60);
    std::vector<mpopt::bfloat16> gw = std::vector<mpopt::bfloat16>(96), gv = std::vector<mpopt::bfloat16>(60);
    opt_t opt;
    model() {
      muon::options o;
      o.lr = 0.02;
      o.ns_precision = muon::iteration_precision::bf16;
      auto& g = opt.add_group(o);
      for (std::size_t k = 0; k < w.size(); ++k) w[k] = mpopt::bfloat16(0.01f * float(k % 13) - 0.05f);
      for (std::size_t k = 0; k < v.size(); ++k) v[k] = mpopt::bfloat16(0.02f * float(k % 7) - 0.06f);
      g.add(w, gw, "w", {8, 12});
      g.add(v, gv, "v", {3, 4, 5});
    }
    void step(int s) {
      for (std::size_t k = 0; k < gw.size(); ++k) gw[k] = mpopt::bfloat16(std::sin(float(k * 7 + s)) * 0.01f);
      for (std::size_t k = 0; k < gv.size(); ++k) gv[k] = mpopt::bfloat16(std::cos(float(k * 5 + s)) * 0.01f);
      REQUIRE(opt.step().applied);
    }
  };
  model a;
  for (int s = 0; s < 3; ++s) a.step(s);
  std::vector<std::byte> saved;
  a.opt.save(saved);
  for (int s = 3; s < 6; ++s) a.step(s);

  model b;
  b.opt.load(saved);
  for (int s = 3; s < 6; ++s) b.step(s);
  for (std::size_t t = 0; t < 2; ++t) {
    const auto ma = a.opt.master(t), mb = b.opt.master(t);
    const auto ba = a.opt.moment(0, t), bb = b.opt.moment(0, t);
    CHECK(std::equal(ma.begin(), ma.end(), mb.begin(), mb.end()));
    CHECK(std::equal(ba.begin(), ba.end(), bb.begin(), bb.end()));
  }
  CHECK(std::string(reinterpret_cast<const char*>(saved.data()), saved.size()).find("momentum_buffer") !=
        std::string::npos);
}

// Steps of mpopt::muon (fp32 parameters, one group, no clipping) on matrices a JSON file gives:
// MPOPT_MUON_STEPS_IN: {"options": {muon_options' fields}, "shapes": [[rows, cols, ...], ...],
// "params": [[...], ...], "grads": [[[...], ...], ...] (per step, per tensor)}; MPOPT_MUON_STEPS_OUT
// gets {"params": [[[...], ...], ...]}: per step, every tensor's parameters after it.
TEST_CASE("muon_steps: the steps tests/torch_muon.py compares with torch.optim.Muon" * doctest::skip()) {
  const char* in_path = std::getenv("MPOPT_MUON_STEPS_IN");
  const char* out_path = std::getenv("MPOPT_MUON_STEPS_OUT");
  REQUIRE_MESSAGE((in_path && out_path), "set MPOPT_MUON_STEPS_IN and MPOPT_MUON_STEPS_OUT");
  const nlohmann::json in = nlohmann::json::parse(std::ifstream(in_path));
  mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, muon> opt({.clip_grad = 0});
  auto& group = opt.add_group(mpopt::detail::options_from_json<mpopt::muon_options>(in.at("options"), ""));
  std::vector<std::vector<float>> params, grads;
  for (std::size_t t = 0; t < in.at("shapes").size(); ++t) {
    params.push_back(in.at("params")[t].get<std::vector<float>>());
    grads.emplace_back(params.back().size());
  }
  for (std::size_t t = 0; t < params.size(); ++t)
    group.add(params[t], grads[t], "w" + std::to_string(t), in.at("shapes")[t].get<std::vector<std::int64_t>>());
  nlohmann::json out = {{"params", nlohmann::json::array()}};
  for (const auto& step : in.at("grads")) {
    for (std::size_t t = 0; t < grads.size(); ++t) {  // into the registered buffers, in place
      const auto g = step[t].get<std::vector<float>>();
      REQUIRE(g.size() == grads[t].size());
      std::copy(g.begin(), g.end(), grads[t].begin());
    }
    REQUIRE(opt.step().applied);
    out["params"].push_back(params);
  }
  std::ofstream(out_path) << out.dump();
}
