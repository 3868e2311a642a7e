// The optimizer on the device backend over its device communicator against the same optimizer on
// the host backend over MPI, fed the same gradients, under mpirun. ZeRO-2 fp16 Adam with dynamic
// scaling and an overflow on one rank (no clipping: every sum the step makes is then the same on
// both, so the states must agree bit for bit), the same in bf16 with stochastic rounding, ZeRO-1
// Adam with clipping, replicated bf16 LAMB and 1-bit LAMB into its compression stage (per-chunk norm
// sums add in another order on the device: within 1e-5), zero2 with an expert group over its own
// communicator, and a checkpoint saved by the device optimizer and loaded by both. With
// MPOPT_TEST_MUON (where a CBLAS is found): Muon under the layer-wise partition, each matrix whole
// on one rank (without clipping, bit for bit off the GPU; on a GPU cuBLAS sums in another order).
//
// Built by nvcc with MPOPT_TEST_NCCL (nccl_optimizer.cu): mpopt::cuda on a GPU per rank over
// mpopt::nccl; without a GPU on every rank it prints why and exits 77 on every rank (skipped).
// Built by g++ with Thrust's OpenMP system: mpopt::cuda over mpopt::mpi, which runs here.
//
// A standalone program (not doctest): every rank must run every collective in the same order.
#include <mpopt/cuda.hpp>
#include <mpopt/host.hpp>
#include <mpopt/mpi.hpp>
#include <mpopt/mpopt.hpp>
#ifdef MPOPT_TEST_NCCL
#include <mpopt/nccl.hpp>

#include "cuda_ranks.hpp"
#endif
#ifdef MPOPT_TEST_MUON
#include <mpopt/cuda_matrix.hpp>
#include <mpopt/muon.hpp>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "counter_hash.hpp"
#include "mpi_checks.hpp"

namespace {

using namespace mpi_checks;

#ifdef MPOPT_TEST_NCCL
using device_comm = mpopt::nccl;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// Host or device memory, either way (unified addressing).
template <class T>
std::vector<T> fetch(std::span<const T> s) {
  std::vector<T> out(s.size());
  if (!s.empty()) check_cuda(cudaMemcpy(out.data(), s.data(), s.size_bytes(), cudaMemcpyDefault), "cudaMemcpy");
  return out;
}
template <class T>
void put(std::span<T> dst, const std::vector<T>& src) {
  if (!src.empty()) check_cuda(cudaMemcpy(dst.data(), src.data(), dst.size_bytes(), cudaMemcpyDefault), "cudaMemcpy");
}
#else
using device_comm = mpopt::mpi;  // Thrust's OpenMP system: the device is the host

template <class T>
std::vector<T> fetch(std::span<const T> s) {
  return {s.begin(), s.end()};
}
template <class T>
void put(std::span<T> dst, const std::vector<T>& src) {
  std::copy(src.begin(), src.end(), dst.begin());
}
#endif

const std::vector<mpopt::tensor_spec> specs = {{"w", 4097}, {"b", 1}, {"e", 1000}};
/// A matrix rule's tensors: tall, wide, 3-D, across the layer-wise ranks.
const std::vector<mpopt::tensor_spec> matrices = {
    {"q", 64 * 48, {64, 48}}, {"k", 5 * 17, {5, 17}}, {"c", 60, {3, 4, 5}}, {"o", 9 * 7, {9, 7}}};

/// Group 0, the flat group of `tensors`; finalized unless more groups follow.
template <class Opt>
void setup(Opt& opt, const typename Opt::group_options& g, bool finalize = true,
           const std::vector<mpopt::tensor_spec>& tensors = specs) {
  auto& group = opt.add_flat_group(g, {tensors.begin(), tensors.end()});
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    std::vector<typename Opt::param_type> p(tensors[t].size);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = typename Opt::param_type(float(unit(key(1, t, 0, i))));
    put(group.param(t), p);
  }
  if (finalize) opt.finalize();
}

/// This rank's gradients of step s; `overflow` puts an infinity in one element on the last rank.
template <class Opt>
void feed(Opt& opt, int s, double magnitude, bool overflow, const std::vector<mpopt::tensor_spec>& tensors = specs) {
  using G = typename Opt::grad_type;
  auto& group = opt.group(0);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    std::vector<G> g(tensors[t].size);
    for (std::size_t i = 0; i < g.size(); ++i)
      g[i] = G(float(magnitude * unit(key(2 + std::uint64_t(world_rank), std::uint64_t(s), t, i))));
    if (overflow && t == 0 && world_rank == world_size - 1) g[g.size() / 2] = G(std::numeric_limits<float>::infinity());
    put(group.grad(t), g);
  }
}

/// Both optimizers' masters and parameters agree within `tolerance` (relative; 0: bit for bit). A
/// 16-bit parameter rounded from masters that differ in their last bits may differ by one unit.
template <class A, class B>
void compare(const std::string& name, A& device, B& host, double tolerance,
             const std::vector<mpopt::tensor_spec>& tensors = specs) {
  using P = typename A::param_type;
  const double param_ulp = std::is_same_v<P, float> ? 0 : std::is_same_v<P, mpopt::half> ? 0x1p-10 : 0x1p-7;
  const auto close = [](double x, double y, double tol) {
    return tol == 0 ? std::memcmp(&x, &y, sizeof x) == 0 : std::abs(x - y) <= tol * (std::abs(y) + 1e-3);
  };
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const auto dm = fetch(device.master(t)), hm = fetch(host.master(t));
    const auto dp = fetch<P>(device.group(0).param(t));
    const auto hp = fetch<typename B::param_type>(host.group(0).param(t));
    const double param_tolerance = tolerance == 0 ? 0 : std::max(tolerance, param_ulp);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < dm.size() && i < hm.size(); ++i) bad += !close(dm[i], hm[i], tolerance);
    for (std::size_t i = 0; i < dp.size() && i < hp.size(); ++i)
      bad += !close(double(float(dp[i])), double(float(hp[i])), param_tolerance);
    expect(dm.size() == hm.size() && dp.size() == hp.size() && bad == 0,
           name + ": tensor " + tensors[t].name + ": " + std::to_string(bad) + " elements differ");
  }
}

/// Steps both optimizers `steps` times on the same gradients and compares statuses and states.
template <class Precision, class Scaler, class Partition, class Rule>
void case_of(const std::string& name, const typename Rule::options& g, mpopt::optimizer_options o, int steps,
             int overflow_step, double tolerance, const std::vector<mpopt::tensor_spec>& tensors = specs) {
  run(name, [&] {
    mpopt::optimizer<Precision, Scaler, Partition, Rule, mpopt::cuda, device_comm> device(device_comm(MPI_COMM_WORLD), o);
    mpopt::optimizer<Precision, Scaler, Partition, Rule, mpopt::host, mpopt::mpi> host(mpopt::mpi(MPI_COMM_WORLD), o);
    setup(device, g, true, tensors);
    setup(host, g, true, tensors);
    // The device backend agrees on the overflow in device memory as a count of chunks (a double),
    // the host backend as a byte; 1-bit LAMB decides on the host on both.
    constexpr bool device_decides = !std::is_same_v<Rule, mpopt::onebit_lamb>;
    const std::uint64_t flag_bytes = device_decides && world_size > 1 ? sizeof(double) - 1 : 0;
    for (int s = 0; s < steps; ++s) {
      feed(device, s, 0.5, s == overflow_step, tensors);
      feed(host, s, 0.5, s == overflow_step, tensors);
      const auto a = device.step(), b = host.step();
      expect(a.result == b.result && a.scale_after == b.scale_after && a.step == b.step,
             name + ": step " + std::to_string(s) + ": " + std::string(a.reason()) + " vs " + std::string(b.reason()));
      const bool norms = std::isfinite(b.grad_norm) ? std::abs(a.grad_norm - b.grad_norm) <= 1e-5 * b.grad_norm
                                                    : !std::isfinite(a.grad_norm);
      expect(norms, name + ": step " + std::to_string(s) + ": norms " + std::to_string(a.grad_norm) + " vs " +
                        std::to_string(b.grad_norm));
      expect(a.comm_bytes == b.comm_bytes + flag_bytes, name + ": the bytes handed to the communicators");
    }
    compare(name, device, host, tolerance, tensors);
#ifdef MPOPT_TEST_NCCL
    const auto report = device.memory_report();
    bool staged = false;
    for (const auto& b : report.buffers) staged |= b.name == "communicator workspace" && b.bytes > 0;
    expect(staged, name + ": the host agreements went through the communicator's device scratch");
#endif
  });
}

/// An expert group (DeepSpeed's E+D layout: rank r holds set r % E of the experts, E = 2 where the
/// world is even) beside the dense group, under zero2: its gradients reduced and its state sharded
/// over the ranks holding the same experts, on the device over its own device communicator (on the
/// optimizer's stream) as on the host over MPI.
void experts() {
  run("zero2 fp16 Adam with an expert group", [&] {
    using P = mpopt::half;
    const int sets = world_size % 2 == 0 ? 2 : 1, set = world_rank % sets;
    MPI_Comm replicas = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, set, world_rank, &replicas);
    const mpopt::optimizer_options o{.bucket_elements = 300};
    mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam, mpopt::cuda, device_comm> device(
        device_comm(MPI_COMM_WORLD), o);
    mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam, mpopt::host, mpopt::mpi> host(
        mpopt::mpi(MPI_COMM_WORLD), o);
    const mpopt::adam::options g;
    const std::vector<std::size_t> sizes = {513, 7};
    std::vector<mpopt::cuda::buffer<P>> dp, dg;  // the device optimizer's expert tensors
    std::vector<std::vector<P>> hp, hg;          // the host optimizer's
    setup(device, g, false);
    setup(host, g, false);
    dp.reserve(sizes.size());
    dg.reserve(sizes.size());
    hp.reserve(sizes.size());
    hg.reserve(sizes.size());
#ifdef MPOPT_TEST_NCCL
    auto& dx = device.add_expert_group(g, device_comm(replicas, device.communicator().stream()));
#else
    auto& dx = device.add_expert_group(g, device_comm(replicas));
#endif
    auto& hx = host.add_expert_group(g, mpopt::mpi(replicas));
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      std::vector<P> init(sizes[t]);
      for (std::size_t i = 0; i < init.size(); ++i) init[i] = P(float(unit(key(3, std::uint64_t(set), t, i))));
      dp.emplace_back(sizes[t]);
      dg.emplace_back(sizes[t]);
      put(std::span<P>(dp.back().data(), sizes[t]), init);
      hp.push_back(init);
      hg.emplace_back(sizes[t]);
      const std::string name = "expert" + std::to_string(set) + "." + std::to_string(t);
      dx.add(mpopt::view<P>{dp.back().data(), sizes[t], mpopt::memory_space::device},
             mpopt::view<P>{dg.back().data(), sizes[t], mpopt::memory_space::device}, name);
      hx.add(hp.back(), hg.back(), name);
    }
    device.finalize();
    host.finalize();
    for (int s = 0; s < 4; ++s) {
      feed(device, s, 0.5, s == 2);
      feed(host, s, 0.5, s == 2);
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        std::vector<P> grad(sizes[t]);
        for (std::size_t i = 0; i < grad.size(); ++i)
          grad[i] = P(float(0.5 * unit(key(5 + std::uint64_t(world_rank), std::uint64_t(s), t, i))));
        put(std::span<P>(dg[t].data(), sizes[t]), grad);
        std::copy(grad.begin(), grad.end(), hg[t].begin());
      }
      const auto a = device.step(), b = host.step();
      expect(a.result == b.result && a.scale_after == b.scale_after,
             "experts: step " + std::to_string(s) + ": " + std::string(a.reason()) + " vs " + std::string(b.reason()));
      expect(std::abs(a.grad_norm - b.grad_norm) <= 1e-5 * b.grad_norm || !std::isfinite(b.grad_norm),
             "experts: step " + std::to_string(s) + ": norms " + std::to_string(a.grad_norm) + " vs " +
                 std::to_string(b.grad_norm));
    }
    compare("experts: the dense group", device, host, 1e-5);
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      const auto dm = fetch(device.master(specs.size() + t)), hm = fetch(host.master(specs.size() + t));
      const auto params = fetch<P>(std::span<const P>(dp[t].data(), sizes[t]));
      std::size_t bad = dm.size() == hm.size() ? 0 : 1;
      for (std::size_t i = 0; i < dm.size() && i < hm.size(); ++i)
        bad += std::abs(dm[i] - hm[i]) > 1e-5 * (std::abs(hm[i]) + 1e-3);
      for (std::size_t i = 0; i < params.size(); ++i)
        bad += std::abs(float(params[i]) - float(hp[t][i])) > 0x1p-10 * (std::abs(float(hp[t][i])) + 1e-3);
      expect(bad == 0, "experts: expert tensor " + std::to_string(t) + ": " + std::to_string(bad) + " elements differ");
    }
    MPI_Comm_free(&replicas);
  });
}

void checkpoint() {
  using P = mpopt::fp16;
  using S = mpopt::dynamic_scale;
  run("checkpoint", [&] {
    mpopt::adam::options g;
    mpopt::optimizer<P, S, mpopt::zero2, mpopt::adam, mpopt::cuda, device_comm> device(device_comm(MPI_COMM_WORLD));
    setup(device, g);
    for (int s = 0; s < 3; ++s) {
      feed(device, s, 0.5, false);
      device.step();
    }
    const shared_dir dir("cross_backend_");
    const std::filesystem::path file = dir / "state";
    device.save(file);  // whole tensors gathered into host memory over NCCL

    mpopt::optimizer<P, S, mpopt::zero2, mpopt::adam, mpopt::host, mpopt::mpi> host(mpopt::mpi(MPI_COMM_WORLD));
    setup(host, g);
    host.load(file);
    compare("checkpoint: loaded on the host", device, host, 0);
    mpopt::optimizer<P, S, mpopt::zero2, mpopt::adam, mpopt::cuda, device_comm> again(device_comm(MPI_COMM_WORLD));
    setup(again, g);
    again.load(file);
    feed(again, 3, 0.5, false);
    feed(host, 3, 0.5, false);
    again.step();
    host.step();
    compare("checkpoint: loaded over NCCL, one more step", again, host, 0);
  });
}

}  // namespace

int main(int argc, char** argv) {
  start(argc, argv, "cross_backend");

#ifdef MPOPT_TEST_NCCL
  const cuda_ranks gpus = cuda_devices_on_every_rank();
  if (gpus.devices == 0) {
    if (world_rank == 0) std::printf("%s; the optimizer over NCCL needs a GPU per rank\n", gpus.why.c_str());
    return finish(77);
  }
  run("device", [&] { check_cuda(cudaSetDevice(world_rank % gpus.devices), "cudaSetDevice"); });
#endif

  mpopt::adam::options adam;
  mpopt::lamb::options lamb;
  mpopt::onebit_lamb::options onebit;
  onebit.freeze_step = 3;
  onebit.coeff_beta = 0.5;
  case_of<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam>("zero2 fp16 Adam, no clipping", adam,
                                                                         {.clip_grad = 0}, 5, 2, 0);
  case_of<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero1, mpopt::adam>("zero1 fp16 Adam, clipped", adam, {}, 4, 1, 1e-5);
  case_of<mpopt::bf16_stochastic, mpopt::no_scaling, mpopt::zero2, mpopt::adam>(
      "zero2 bf16 Adam, stochastic rounding, no clipping", adam, {.clip_grad = 0, .rounding_seed = 77}, 5, -1, 0);
  case_of<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::lamb>("replicated bf16 LAMB", lamb, {}, 4, 2, 1e-5);
  case_of<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::onebit_lamb>("1-bit LAMB", onebit, {}, 6, -1, 1e-5);
#ifdef MPOPT_TEST_MUON
  mpopt::muon::options muon;
  muon.ns_precision = mpopt::muon::iteration_precision::bf16;
  case_of<mpopt::bf16, mpopt::no_scaling, mpopt::layerwise, mpopt::muon>(
      "layerwise bf16 Muon, no clipping", muon, {.clip_grad = 0}, 4, -1, MPOPT_DEVICE_IS_GPU ? 1e-5 : 0, matrices);
#endif
  experts();
  checkpoint();

  return finish();
}
