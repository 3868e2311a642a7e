// mpopt device benchmark: the time of one optimizer step() on the device backend (mpopt::cuda)
// against a device-to-device copy of the bytes the update cannot avoid, measured in the same process
// (protocol and fields: bench/README.md).
//
//   device_step [--params N] [--repeat R] [--filter SUBSTR] [--quick]
//
// Built twice from this source: by nvcc for the GPU (device_step.cu; without a GPU it says so and
// exits 77), and by g++ on Thrust's OpenMP system, where the device is the host's cores and the
// copy is thrust::copy. The second shows the benchmark works and what the device backend's code
// reaches on a CPU, nothing about a GPU.
//
// Cases: those of bench/common.hpp (for_each_case), clipped and "/noclip".
//   fused:   one flat group (add_flat_group) holding one tensor of N parameters, in device memory;
//   unfused: the same N split into 1000 device buffers registered with add() (the chunked path).
// Per case: one untimed step and copy, then R rounds of (copy, step), each timed alone; step()
// returns with its kernels finished, the copy is waited for.
#include <mpopt/cuda.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <thrust/copy.h>

#include "common.hpp"

namespace {

using namespace bench;
using device = mpopt::cuda;

/// n words from src to dst in device memory, finished when it returns.
void device_copy(const device& backend, std::uint64_t* dst, const std::uint64_t* src, std::size_t n) {
#if MPOPT_DEVICE_IS_GPU
  mpopt::detail::cuda_check(cudaMemcpyAsync(dst, src, n * 8, cudaMemcpyDeviceToDevice, backend.stream()), "cudaMemcpyAsync");
  backend.synchronize();
#else
  thrust::copy(thrust::device, src, src + n, dst);
  (void)backend;
#endif
}

/// n values ~ N(0, sigma), made on the host and copied to device memory.
template <class T>
void fill_device(const device& backend, T* dst, std::size_t n, float sigma, std::uint64_t seed) {
  std::vector<T> host(n);
  fill_normal(host.data(), n, sigma, seed);
  backend.to_device(dst, host.data(), n);
  backend.synchronize();
}

template <class Precision, class Scaler, class Rule>
void run_case(const config& cfg, std::string_view precision, std::string_view rule, bool fused, bool clipped,
              device::buffer<std::uint64_t>& copy_src, device::buffer<std::uint64_t>& copy_dst) {
  using P = typename Precision::param_type;
  using G = typename Precision::grad_type;
  const std::string_view layout = fused ? "fused" : "unfused";
  const std::string name = case_name(precision, rule, fused, clipped);
  if (!cfg.wants(name)) return;
  std::fprintf(stderr, "device_step: %s ...\n", name.c_str());

  const std::size_t n = cfg.params;
  const case_settings<Scaler, Rule> settings(clipped);
  mpopt::optimizer<Precision, Scaler, mpopt::replicated, Rule, device> opt(settings.optimizer, settings.scaler);
  const auto& ro = settings.rule;

  std::vector<device::buffer<P>> user_params;
  std::vector<device::buffer<G>> user_grads;
  std::vector<mpopt::view<P>> params;
  std::vector<mpopt::view<G>> grads;
  if (fused) {
    auto& g = opt.add_flat_group(ro, {{"flat", n}});
    params.push_back({g.param(0).data(), n, mpopt::memory_space::device});
    grads.push_back({g.grad(0).data(), n, mpopt::memory_space::device});
  } else {
    auto& g = opt.add_group(ro);
    for (std::size_t sz : unfused_sizes(n, device_unfused_tensors)) {
      user_params.emplace_back(sz);
      user_grads.emplace_back(sz);
      params.push_back({user_params.back().data(), sz, mpopt::memory_space::device});
      grads.push_back({user_grads.back().data(), sz, mpopt::memory_space::device});
      g.add(params.back(), grads.back(), "t" + std::to_string(params.size()));
    }
  }
  const float gsigma = grad_sigma * float(opt.loss_scale());
  for (std::size_t t = 0; t < params.size(); ++t) {
    fill_device(opt.backend(), params[t].data, params[t].size, param_sigma, 2 * t + 1);
    fill_device(opt.backend(), grads[t].data, grads[t].size, gsigma, 2 * t + 2);
  }

  auto checked_step = [&] {
    if (const auto st = opt.step(); !st.applied) {
      std::fprintf(stderr, "device_step: %s: step not applied (%s)\n", name.c_str(), std::string(st.reason()).c_str());
      std::exit(1);
    }
  };
  constexpr std::size_t bpp = minimal_bytes_per_param<Precision, Rule>();
  const double total = double(bpp) * double(n);
  const std::size_t words = (bpp * n / 2 + 7) / 8;  // read once and written once: `total` moved
  checked_step();
  device_copy(opt.backend(), copy_dst.data(), copy_src.data(), words);

  std::vector<double> t_copy, t_step;
  for (int r = 0; r < cfg.repeat; ++r) {
    auto t0 = clock_type::now();
    device_copy(opt.backend(), copy_dst.data(), copy_src.data(), words);
    t_copy.push_back(seconds_since(t0));
    t0 = clock_type::now();
    checked_step();
    t_step.push_back(seconds_since(t0));
  }
  const std::size_t before = opt.backend().launches();
  checked_step();
  const std::size_t kernels = opt.backend().launches() - before;
  const stats step = gbps(t_step, total), copy = gbps(t_copy, 16.0 * double(words));
  std::printf(
      "{\"bench\":\"device_step\",\"device\":\"%s\",\"precision\":\"%.*s\",\"rule\":\"%.*s\",\"layout\":\"%.*s\",\"clip_grad\":%g,"
      "\"params\":%zu,\"threads\":%d,\"bytes_per_param\":%zu,\"kernels_per_step\":%zu,\"gbps\":%.2f,"
      "\"copy_gbps\":%.2f,\"ratio\":%.3f,\"gbps_min\":%.2f,\"gbps_max\":%.2f}\n",
      MPOPT_DEVICE_IS_GPU ? "gpu" : "thrust-omp", int(precision.size()), precision.data(), int(rule.size()),
      rule.data(), int(layout.size()), layout.data(), settings.optimizer.clip_grad, n, max_threads(), bpp, kernels, step.median, copy.median, step.median / copy.median, step.min, step.max);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const config cfg = parse(argc, argv);
#if MPOPT_DEVICE_IS_GPU
  if (no_gpu(argv[0])) return 77;
#endif
  // Copy buffers large enough for every case (half of 44 B/param copied).
  const std::size_t words = (cfg.params * largest_bytes_per_param / 2 + 7) / 8;
  device::buffer<std::uint64_t> src(words), dst(words);
  return run_every_case("device_step", [&]<class P, class S, class R>(std::string_view precision,
                                                                      std::string_view rule, bool fused,
                                                                      bool clipped) {
    run_case<P, S, R>(cfg, precision, rule, fused, clipped, src, dst);
  });
}
