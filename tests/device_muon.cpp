// Muon's matrix stage on the device backend (<mpopt/cuda_matrix.hpp>): rules<muon, adam> on
// mpopt::cuda against the same optimizer on mpopt::host, step by step, under one clip, one overflow
// skip and one loss scale, over matrices tall, wide, square, 3-D, of one row, and one across chunks
// (over 64 Ki elements), beside Adam's vectors.
//
// In the Thrust-OMP build every bit is the host's: the element passes are the host's bodies, and
// the matrix stage runs the host's iteration on the device's memory (the host's). On a GPU the
// iteration's products are cuBLAS's, summed in another order: the element state (Muon's momentum,
// Adam's moments) and Adam's tensors are still the host's bits, and Muon's masters move as the host's
// do within the bounds tests/rules.cpp holds the host to against float64. Built by nvcc as
// device_muon.cu for the GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include <mpopt/adam.hpp>
#include <mpopt/cuda.hpp>
#include <mpopt/cuda_matrix.hpp>
#include <mpopt/host_passes.hpp>  // Muon's host passes (not compiled once in libmpopt)
#include <mpopt/muon.hpp>
#include <mpopt/optimizer.hpp>
#include <mpopt/rules.hpp>

#include "mirrored.hpp"
#include "newton_schulz_reference.hpp"

namespace device_muon {

using mpopt::adam;
using mpopt::muon;

struct tensor {
  std::size_t group;  // 0 and 2: Muon's; 1: Adam's
  std::string name;
  mpopt::tensor_shape shape;
  std::size_t size;
};
// (in group order: the optimizer numbers its tensors group by group)
const std::vector<tensor> tensors = {
    {0, "tall", {12, 5}, 60}, {0, "wide", {5, 12}, 60}, {0, "big", {260, 300}, 78000}, {1, "b1", {1}, 1},
    {1, "b7", {7}, 7},        {1, "b33", {33}, 33},     {2, "cube", {3, 4, 5}, 60},    {2, "square", {17, 17}, 289},
    {2, "row", {1, 9}, 9}};
bool is_muon(std::size_t group) { return group != 1; }

template <class Precision, class Scaler, class Backend>
using optimizer = mpopt::optimizer<Precision, Scaler, mpopt::replicated, mpopt::rules<muon, adam>, Backend>;

template <class Opt>
void add_groups(Opt& opt, muon::iteration_precision iteration, auto&& add) {
  muon::options m0, m2{.lr = 0.01, .nesterov = false};
  m2.adjust_lr_fn = muon::lr_adjustment::match_rms_adamw;
  m0.ns_precision = m2.ns_precision = iteration;
  typename Opt::param_group* groups[] = {
      &opt.add_group(m0), &opt.add_group(adam::options{.lr = 3e-3, .weight_decay = 0.01}), &opt.add_group(m2)};
  for (std::size_t t = 0; t < tensors.size(); ++t) add(*groups[tensors[t].group], t);
}

/// Five steps of both optimizers (clipped to `clip`; step `overflow`, if any, with an inf in an
/// Adam tensor), compared after each.
template <class Precision, class Scaler>
void same_steps(muon::iteration_precision iteration, double clip, typename Scaler::options so, int overflow = 0) {
  using param_t = typename Precision::param_type;
  using grad_t = typename Precision::grad_type;
  optimizer<Precision, Scaler, mpopt::host> h({.clip_grad = clip}, so);
  optimizer<Precision, Scaler, mpopt::cuda> d({.clip_grad = clip}, so);
  mpopt::cuda copier;
  std::vector<mirrored<param_t>> params;
  std::vector<mirrored<grad_t>> grads;
  std::vector<std::vector<float>> start;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  for (const tensor& e : tensors) {
    auto& p = params.emplace_back(e.size);
    grads.emplace_back(e.size);
    for (auto& v : p.host) v = param_t(0.1f * normal(gen));
    p.upload(copier);
    start.emplace_back(p.host.begin(), p.host.end());
  }
  add_groups(h, iteration,
             [&](auto& g, std::size_t t) { g.add(params[t].host, grads[t].host, tensors[t].name, tensors[t].shape); });
  add_groups(d, iteration, [&](auto& g, std::size_t t) {
    g.add(params[t].device_view(), grads[t].device_view(), tensors[t].name, tensors[t].shape);
  });

  for (int step = 1; step <= 5; ++step) {
    CAPTURE(step);
    REQUIRE(h.loss_scale() == d.loss_scale());
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      for (auto& v : grads[t].host) v = grad_t(float(h.loss_scale()) * 0.01f * normal(gen));
      if (step == overflow && tensors[t].name == "b7") grads[t].host[2] = grad_t(INFINITY);
      grads[t].upload(copier);
    }
    const auto hs = h.step(), ds = d.step();
    CHECK(hs.result == ds.result);
    CHECK(hs.applied == (step != overflow));
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      CAPTURE(tensors[t].name);
      const bool exact = !MPOPT_DEVICE_IS_GPU || !is_muon(tensors[t].group);
      const auto hm = h.master(t);
      const auto dm = d.master(t);
      if (exact) {
        CHECK(same_bits(params[t].download(copier), params[t].host));
        CHECK(same_bits(std::vector<float>(dm.begin(), dm.end()), std::vector<float>(hm.begin(), hm.end())));
      } else {  // each master's move from its start, against the host's
        std::vector<double> moved(hm.size());
        newton_schulz_reference::matrix want(hm.size());
        for (std::size_t k = 0; k < hm.size(); ++k) {
          moved[k] = double(dm[k]) - start[t][k];
          want[k] = double(hm[k]) - start[t][k];
        }
        CHECK(newton_schulz_reference::relative_error(moved, want) <
              (iteration == muon::iteration_precision::fp32 ? 1e-5 : 5e-3));
      }
      for (std::size_t k = 0; k < (is_muon(tensors[t].group) ? 1 : 2); ++k) {
        const auto a = h.moment(k, t);
        const auto b = d.moment(k, t);
        CHECK(same_bits(std::vector<float>(b.begin(), b.end()), std::vector<float>(a.begin(), a.end())));
      }
    }
  }
}

}  // namespace device_muon

TEST_CASE(
    "device Muon = host Muon beside Adam: fp32 and bf16 iterations, clipped; bf16 parameters; fp16 with a "
    "dynamic loss scale and a skipped step") {
  using namespace device_muon;
  using iteration = muon::iteration_precision;
  for (auto it : {iteration::fp32, iteration::bf16}) {
    CAPTURE(int(it));
    same_steps<mpopt::fp32, mpopt::no_scaling>(it, 0.05, {});
    same_steps<mpopt::bf16, mpopt::no_scaling>(it, 0.0, {});
  }
  same_steps<mpopt::fp16, mpopt::dynamic_scale>(iteration::fp32, 1.0, {.init_scale = 1024}, 3);
}
