// mpopt device benchmark: the time of one optimizer step() on the device backend (mpopt::cuda)
// against a device-to-device copy of the bytes the update cannot avoid and against the
// minimal-traffic kernel (one pass over one flat range moving only those bytes, in whole vectors),
// measured in the same process (protocol and fields: bench/README.md).
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
// Per case: one untimed step, copy and minimal-traffic run, then R rounds of (copy, minimal-traffic
// kernel, step), each timed alone; step() returns with its kernels finished, the others are waited
// for.
#include <mpopt/cuda.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <thrust/copy.h>
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

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

/// The minimal-traffic kernel's own buffers, n elements each (fp32 keeps its master in `param`).
template <class Precision>
struct limit_state {
  using P = typename Precision::param_type;
  using G = typename Precision::grad_type;
  device::buffer<P> param;
  device::buffer<G> grad;
  device::buffer<float> master, m, v;
  explicit limit_state(std::size_t n) : param(n), grad(n), master(Precision::has_master ? n : 0), m(n), v(n) {}
};

/// Pass `Pass` of the minimal-traffic kernel on vector q (elements 4q .. 4q + 3): the loads and
/// stores the update cannot avoid (minimal_bytes_per_param), whole aligned vectors, one FMA each.
/// Adam (pass 1): read g, master, m, v; write master, m, v (and the 16-bit param). LAMB: pass 1
/// reads g, master, m, v and writes m, v; pass 2 reads master, m, v and writes master (and param).
/// k is a runtime zero: the state keeps its values.
template <class Precision, bool Lamb, int Pass>
struct limit_kernel {
  using L = mpopt::detail::quad_lanes<true>;
  typename Precision::param_type* param;
  const typename Precision::grad_type* grad;
  float* master;  // == param for fp32
  float* m;
  float* v;
  float k;

  MPOPT_HOST_DEVICE void operator()(std::size_t q) const {
    const std::size_t j = 4 * q;
    const mpopt::detail::full_t all{};
    const mpopt::detail::quad kv(k);
    const mpopt::detail::quad w = L::load(master + j, all);
    if constexpr (Pass == 1) {
      const mpopt::detail::quad g = L::load(grad + j, all);
      L::store(m + j, fma(kv, Lamb ? g + w : g, L::load(m + j, all)), all);
      L::store(v + j, fma(kv, g, L::load(v + j, all)), all);
      if constexpr (!Lamb) store_master(j, fma(kv, g, w));
    } else {
      store_master(j, fma(kv, L::load(m + j, all) + L::load(v + j, all), w));
    }
  }
  MPOPT_HOST_DEVICE void store_master(std::size_t j, mpopt::detail::quad w) const {
    L::store(master + j, w, mpopt::detail::full_t{});
    if constexpr (Precision::has_master) L::store(param + j, w, mpopt::detail::full_t{});
  }
};

/// One run of the minimal-traffic kernel over n elements (a multiple of 4), finished on return.
template <class Precision, class Rule>
void limit_step(const device& backend, limit_state<Precision>& s, std::size_t n, float k) {
  constexpr bool lamb = std::is_same_v<Rule, mpopt::lamb>;
  float* master = Precision::has_master ? s.master.data() : reinterpret_cast<float*>(s.param.data());
  const auto run = [&]<int Pass>() {
    const limit_kernel<Precision, lamb, Pass> kernel{s.param.data(), s.grad.data(), master, s.m.data(), s.v.data(), k};
#if MPOPT_DEVICE_IS_GPU
    thrust::for_each_n(thrust::cuda::par_nosync.on(backend.stream()), thrust::counting_iterator<std::size_t>(0), n / 4,
                       kernel);
#else
    thrust::for_each_n(thrust::device, thrust::counting_iterator<std::size_t>(0), n / 4, kernel);
#endif
  };
  run.template operator()<1>();
  if constexpr (lamb) run.template operator()<2>();
  backend.synchronize();
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

  const std::size_t limit_n = (n + 3) / 4 * 4;
  limit_state<Precision> limit(limit_n);
  fill_device(opt.backend(), limit.grad.data(), limit_n, gsigma, 3);
  const float zero = runtime_zero;
  limit_step<Precision, Rule>(opt.backend(), limit, limit_n, zero);

  std::vector<double> t_copy, t_limit, t_step;
  for (int r = 0; r < cfg.repeat; ++r) {
    timed(t_copy, [&] { device_copy(opt.backend(), copy_dst.data(), copy_src.data(), words); });
    timed(t_limit, [&] { limit_step<Precision, Rule>(opt.backend(), limit, limit_n, zero); });
    timed(t_step, checked_step);
  }
  const std::size_t before = opt.backend().launches();
  checked_step();
  const std::size_t kernels = opt.backend().launches() - before;
  const stats step = gbps(t_step, total), copy = gbps(t_copy, 16.0 * double(words)), limit_gbps = gbps(t_limit, total),
              limit_ratio = paired_ratio(t_limit, t_step);
  std::printf(
      "{\"bench\":\"device_step\",\"device\":\"%s\",\"precision\":\"%.*s\",\"rule\":\"%.*s\",\"layout\":\"%.*s\",\"clip_grad\":%g,"
      "\"params\":%zu,\"threads\":%d,\"bytes_per_param\":%zu,\"kernels_per_step\":%zu,\"gbps\":%.2f,"
      "\"copy_gbps\":%.2f,\"ratio\":%.3f,\"gbps_min\":%.2f,\"gbps_max\":%.2f,\"limit_gbps\":%.2f,\"limit_ratio\":%.3f,"
      "\"limit_ratio_min\":%.3f,\"limit_ratio_max\":%.3f}\n",
      MPOPT_DEVICE_IS_GPU ? "gpu" : "thrust-omp", int(precision.size()), precision.data(), int(rule.size()),
      rule.data(), int(layout.size()), layout.data(), settings.optimizer.clip_grad, n, max_threads(), bpp, kernels,
      step.median, copy.median, step.median / copy.median, step.min, step.max, limit_gbps.median, limit_ratio.median,
      limit_ratio.min, limit_ratio.max);
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
