// mpopt offload benchmark: what ZeRO-Offload (mpopt::offload<mpopt::host>) moves over the bus per
// step and parameter, and what its step costs against the host backend's step on the same
// parameters and against that step plus the bus copies done one after the other, alternated in
// one process (protocol: bench/README.md).
//
//   offload_step [--params N] [--repeat R] [--filter SUBSTR] [--quick]
//
// Built twice from this source: by nvcc (offload_step.cu), where the model's tensors are in a GPU's
// memory and the copies cross PCIe or NVLink-C2C (without a GPU it says so and exits 77), and by
// g++ on Thrust's OpenMP system, where "device" memory is host memory and a copy is a memcpy: there
// the byte counts are what they are on a GPU, the times only show the benchmark works.
//
// Cases: those of bench/common.hpp (for_each_case), fused (one flat group of N parameters) only.
// Per case: one untimed round, then R rounds of (host step, offload step, bus copies), each timed
// alone. Fields: to_host_per_param and to_device_per_param (from the backend's counters),
// host_ratio = t_host_step / t_offload_step, serial_ratio = (t_host_step + t_bus) / t_offload_step.
#include <mpopt/host.hpp>
#include <mpopt/offload.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "common.hpp"

namespace {

using namespace bench;
using offload = mpopt::offload<mpopt::host>;

/// bytes from src to dst (device memory, or the page-locked host copies), finished when it returns.
void bus_copy(void* dst, const void* src, std::size_t bytes) {
#if MPOPT_DEVICE_IS_GPU
  mpopt::detail::cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
#else
  std::memcpy(dst, src, bytes);
#endif
}

template <class Precision, class Scaler, class Rule>
void run_case(const config& cfg, std::string_view precision, std::string_view rule, bool fused, bool clipped) {
  using P = typename Precision::param_type;
  using G = typename Precision::grad_type;
  const std::string name = case_name(precision, rule, fused, clipped);
  if (!fused || !cfg.wants(name)) return;
  std::fprintf(stderr, "offload_step: %s ...\n", name.c_str());

  const std::size_t n = cfg.params;
  const case_settings<Scaler, Rule> settings(clipped);
  mpopt::optimizer<Precision, Scaler, mpopt::replicated, Rule, offload> off(settings.optimizer, settings.scaler);
  mpopt::optimizer<Precision, Scaler, mpopt::replicated, Rule, mpopt::host> host(settings.optimizer, settings.scaler);
  auto& og = off.add_flat_group(settings.rule, {{"flat", n}});
  auto& hg = host.add_flat_group(settings.rule, {{"flat", n}});
  {
    std::vector<P> p(n);
    std::vector<G> g(n);
    fill_normal(p.data(), n, param_sigma, 1);
    fill_normal(g.data(), n, grad_sigma * float(host.loss_scale()), 2);
    off.backend().to_device(og.param(0).data(), p.data(), n);
    off.backend().to_device(og.grad(0).data(), g.data(), n);
    std::memcpy(hg.param(0).data(), p.data(), n * sizeof(P));
    std::memcpy(hg.grad(0).data(), g.data(), n * sizeof(G));
  }
  // What the bus carries, copied alone: the gradients to page-locked memory, the parameters back.
  mpopt::detail::pinned_vector<G> grads_here(n);
  mpopt::detail::pinned_vector<P> params_here(n);
  auto bus = [&] {
    bus_copy(grads_here.data(), og.grad(0).data(), n * sizeof(G));
    bus_copy(og.param(0).data(), params_here.data(), n * sizeof(P));
  };
  auto checked = [&](auto& opt) {
    if (const auto st = opt.step(); !st.applied) {
      std::fprintf(stderr, "offload_step: %s: step not applied (%s)\n", name.c_str(), std::string(st.reason()).c_str());
      std::exit(1);
    }
  };
  checked(host);
  checked(off);
  bus();
  const std::size_t to_host = off.backend().bytes_to_host(), to_device = off.backend().bytes_to_device();
  std::vector<double> t_host, t_off, t_bus, host_ratio, serial_ratio;
  for (int r = 0; r < cfg.repeat; ++r) {
    auto t0 = clock_type::now();
    checked(host);
    t_host.push_back(seconds_since(t0));
    t0 = clock_type::now();
    checked(off);
    t_off.push_back(seconds_since(t0));
    t0 = clock_type::now();
    bus();
    t_bus.push_back(seconds_since(t0));
    host_ratio.push_back(t_host.back() / t_off.back());
    serial_ratio.push_back((t_host.back() + t_bus.back()) / t_off.back());
  }
  const double per_param = double(n) * double(cfg.repeat);
  const stats h = summarize(host_ratio), s = summarize(serial_ratio);
  std::printf(
      "{\"bench\":\"offload_step\",\"device\":\"%s\",\"precision\":\"%.*s\",\"rule\":\"%.*s\",\"layout\":\"fused\","
      "\"clip_grad\":%g,\"params\":%zu,\"threads\":%d,\"to_host_per_param\":%.3f,\"to_device_per_param\":%.3f,"
      "\"host_ratio\":%.3f,\"host_ratio_min\":%.3f,\"host_ratio_max\":%.3f,\"serial_ratio\":%.3f,"
      "\"serial_ratio_min\":%.3f,\"serial_ratio_max\":%.3f}\n",
      MPOPT_DEVICE_IS_GPU ? "gpu" : "thrust-omp", int(precision.size()), precision.data(), int(rule.size()), rule.data(),
      settings.optimizer.clip_grad, n, max_threads(), double(off.backend().bytes_to_host() - to_host) / per_param,
      double(off.backend().bytes_to_device() - to_device) / per_param, h.median, h.min, h.max, s.median, s.min, s.max);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const config cfg = parse(argc, argv);
#if MPOPT_DEVICE_IS_GPU
  if (no_gpu(argv[0])) return 77;
#endif
  return run_every_case("offload_step", [&]<class P, class S, class R>(std::string_view precision, std::string_view rule,
                                                                        bool fused, bool clipped) {
    run_case<P, S, R>(cfg, precision, rule, fused, clipped);
  });
}
