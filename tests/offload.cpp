// ZeRO-Offload (offload.hpp) under mpirun: the optimizer on mpopt::offload<mpopt::host> (the model's
// tensors in device memory; masters, moments, buckets and passes on the host) against the same
// optimizer on the host backend, over MPI, fed the same gradients. The state side is the host
// backend itself, so every sum is made in the same order and the states must agree bit for bit:
// every precision, scaler, partition and rule, with overlap_comm, accumulation and grad_ready in
// backward's order. Also the bytes each step moves over the bus, the memory report's pinned
// buffers (what finalize allocates; steps allocate nothing), zero_grad, per-tensor wait_params and
// checkpoints. Then offload over a communicator of device memory (nccl on a GPU; here MPI over the
// OMP build's device memory, which is the host's): buckets reduced on the tensors' side, only each
// rank's pieces over the bus, still bit for bit.
//
// Built by g++ with Thrust's OpenMP system (the device is the host: what CI runs), and by nvcc
// (offload.cu) with the tensors in a GPU's memory; that build exits 77 on every rank without a GPU.
//
// A standalone program (not doctest): every rank must run every collective in the same order.
#include <mpopt/host.hpp>
#include <mpopt/mpi.hpp>
#include <mpopt/mpopt.hpp>
#include <mpopt/offload.hpp>
#ifdef MPOPT_TEST_GPU
#include <mpopt/nccl.hpp>

#include "cuda_ranks.hpp"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "counter_hash.hpp"
#ifndef MPOPT_TEST_GPU
#include "counting_new.hpp"
#endif
#include "mpi_checks.hpp"

namespace {

using namespace mpi_checks;
using offload = mpopt::offload<mpopt::host>;

#ifdef MPOPT_TEST_GPU
/// A communicator of device memory: NCCL.
using device_comm = mpopt::nccl;
#else
/// MPI, declared a communicator of device memory: in the OMP build the device's memory is the
/// host's, so this is offload over a device communicator (as over nccl) where CI can run it.
struct device_comm : mpopt::mpi {
  static constexpr mpopt::memory_space space = mpopt::memory_space::device;
  using mpopt::mpi::mpi;
};
#endif
static_assert(mpopt::detail::collectives_on_tensor_side<offload, device_comm>);
static_assert(!mpopt::detail::collectives_on_tensor_side<offload, mpopt::mpi>);
// offload models mpopt::backend_policy for every precision, its tensors' side's bucket passes
// included (collective_side), and every rule's driver runs over it, for every partition it serves.
static_assert(mpopt::backend_policy<offload, mpopt::fp32> && mpopt::backend_policy<offload, mpopt::fp16> &&
              mpopt::backend_policy<offload, mpopt::bf16_stochastic>);
static_assert(mpopt::detail::compression_passes<offload, mpopt::fp16>);
static_assert(mpopt::detail::runs_on_stream_of<offload, device_comm>);
template <class Precision, class Partition, class Rule, class Comm = mpopt::mpi>
using offload_pipeline = mpopt::detail::step_pipeline<Precision, mpopt::no_scaling, Partition, Rule, offload, Comm>;
template <class Pipeline>
constexpr bool offload_drives = mpopt::detail::rule_driver<typename Pipeline::driver_type, typename Pipeline::rule_context_type>;
static_assert(offload_drives<offload_pipeline<mpopt::fp32, mpopt::replicated, mpopt::adam>> &&
              offload_drives<offload_pipeline<mpopt::fp16, mpopt::zero1, mpopt::lamb, device_comm>> &&
              offload_drives<offload_pipeline<mpopt::bf16, mpopt::zero2, mpopt::lamb, device_comm>> &&
              offload_drives<offload_pipeline<mpopt::fp16, mpopt::replicated, mpopt::onebit_lamb>> &&
              offload_drives<offload_pipeline<mpopt::fp16, mpopt::replicated, mpopt::onebit_adam>> &&
              offload_drives<offload_pipeline<mpopt::fp16, mpopt::replicated, mpopt::zero_one_adam>>);

/// Host or device memory, either way.
template <class T>
std::vector<T> copy_out(std::span<const T> s) {
  std::vector<T> out(s.size());
#ifdef MPOPT_TEST_GPU
  if (!s.empty() && cudaMemcpy(out.data(), s.data(), s.size_bytes(), cudaMemcpyDefault) != cudaSuccess)
    throw std::runtime_error("cudaMemcpy");
#else
  std::copy(s.begin(), s.end(), out.begin());
#endif
  return out;
}
template <class T>
void copy_in(std::span<T> dst, const std::vector<T>& src) {
#ifdef MPOPT_TEST_GPU
  if (!src.empty() && cudaMemcpy(dst.data(), src.data(), dst.size_bytes(), cudaMemcpyDefault) != cudaSuccess)
    throw std::runtime_error("cudaMemcpy");
#else
  std::copy(src.begin(), src.end(), dst.begin());
#endif
}

/// A flat group of three tensors (odd sizes, one of a single element), then a group holding one
/// tensor of the caller's own memory.
const std::vector<mpopt::tensor_spec> flat_specs = {{"w", 4097}, {"b", 1}, {"e", 1000}};
constexpr std::size_t own_size = 333;
constexpr std::size_t tensors = 4, elements = 4097 + 1 + 1000 + own_size;

/// An optimizer and the memory of its caller-owned tensor (device memory under offload).
template <class Precision, class Scaler, class Partition, class Rule, class Backend, class Comm = mpopt::mpi>
struct trainee {
  using opt_type = mpopt::optimizer<Precision, Scaler, Partition, Rule, Backend, Comm>;
  using P = typename Precision::param_type;
  using G = typename Precision::grad_type;
  template <class T>
  using memory = mpopt::detail::tensor_buffer_t<Backend, T>;
  static constexpr mpopt::memory_space space = mpopt::detail::tensor_space_of<Backend>();

  opt_type opt;
  memory<P> own_param = memory<P>::zeroed(own_size);
  memory<G> own_grad = memory<G>::zeroed(own_size);

  trainee(const typename Rule::options& g, mpopt::optimizer_options o, bool finalize = true)
      : opt(o, {}, Comm(MPI_COMM_WORLD)) {
    auto& flat = opt.add_flat_group(g, {flat_specs.begin(), flat_specs.end()});
    for (std::size_t t = 0; t < flat_specs.size(); ++t) copy_in(flat.param(t), initial(t, flat_specs[t].size));
    copy_in(std::span<P>(own_param.data(), own_size), initial(flat_specs.size(), own_size));
    opt.add_group(g).add(mpopt::view<P>{own_param.data(), own_size, space}, mpopt::view<G>{own_grad.data(), own_size, space},
                         "own");
    if (finalize) opt.finalize();
  }
  static std::vector<P> initial(std::size_t t, std::size_t n) {
    std::vector<P> p(n);
    for (std::size_t i = 0; i < n; ++i) p[i] = P(float(unit(key(1, t, 0, i))));
    return p;
  }
  std::span<P> param(std::size_t t) {
    return t < flat_specs.size() ? opt.group(0).param(t) : std::span<P>(own_param.data(), own_size);
  }
  std::span<G> grad(std::size_t t) { return t < flat_specs.size() ? opt.group(0).grad(t) : std::span<G>(own_grad.data(), own_size); }

  /// This rank's gradients of micro-step s (an infinity on the last rank where `overflow`), each
  /// reported as backward would finish it, last tensor first, if `report`.
  void backward(int s, bool overflow, bool report) {
    for (std::size_t t = tensors; t-- > 0;) {
      const std::size_t n = grad(t).size();
      std::vector<G> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = G(float(0.5 * unit(key(2 + std::uint64_t(world_rank), std::uint64_t(s), t, i))));
      if (overflow && t == 0 && world_rank == world_size - 1) g[n / 2] = G(std::numeric_limits<float>::infinity());
      copy_in(grad(t), g);
      if (report) opt.grad_ready(t);
    }
  }
};

/// The same bits: statuses' norms, and every tensor's parameters, masters and moments.
template <class A, class B>
void compare(const std::string& name, A& a, B& b) {
  using P = typename A::P;
  for (std::size_t t = 0; t < tensors; ++t) {
    std::size_t bad = 0;
    const auto ap = copy_out<P>(a.param(t)), bp = copy_out<P>(b.param(t));
    bad += ap.size() != bp.size() || std::memcmp(ap.data(), bp.data(), ap.size() * sizeof(P)) != 0;
    const auto am = copy_out(a.opt.master(t)), bm = copy_out(b.opt.master(t));
    bad += am != bm;
    for (std::size_t k = 0; k < A::opt_type::rule::state.size(); ++k) bad += copy_out(a.opt.moment(k, t)) != copy_out(b.opt.moment(k, t));
    expect(bad == 0, name + ": tensor " + std::to_string(t) + ": parameters, masters or moments differ");
  }
}

/// Steps both optimizers `steps` times on the same gradients (micro-steps of `o.accumulation_steps`,
/// an overflow in step `overflow_step`, each tensor reported as backward finishes it if `report`),
/// checks every status alike, calls stepped(off's status, micro-step) after each, and compares them.
template <class A, class B, class F>
void in_lockstep(const std::string& name, A& off, B& host, const mpopt::optimizer_options& o, int steps,
                 int overflow_step, bool report, const F& stepped) {
  for (int s = 0; s < steps; ++s) {
    for (int m = 0; m < o.accumulation_steps; ++m) {
      const int micro = s * o.accumulation_steps + m;
      off.backward(micro, s == overflow_step, report);
      host.backward(micro, s == overflow_step, report);
      const auto a = off.opt.step(), b = host.opt.step();
      expect(a.result == b.result && a.scale_after == b.scale_after && a.step == b.step &&
                 std::memcmp(&a.grad_norm, &b.grad_norm, sizeof(double)) == 0 && a.comm_bytes == b.comm_bytes,
             name + ": step " + std::to_string(s) + "." + std::to_string(m) + ": " + std::string(a.reason()) + " vs " +
                 std::string(b.reason()));
      stepped(a, m);
    }
    off.opt.wait_params();
    host.opt.wait_params();
  }
  compare(name, off, host);
}

/// Steps an offloaded and a host optimizer `steps` times on the same gradients (micro-steps of
/// `o.accumulation_steps`), compares them, and checks the bytes over the bus: each micro-step's
/// gradients to the host once, each step's parameters back once.
template <class Precision, class Scaler, class Partition, class Rule>
void case_of(const std::string& name, const typename Rule::options& g, mpopt::optimizer_options o, int steps,
             int overflow_step, bool report) {
  run(name, [&] {
    trainee<Precision, Scaler, Partition, Rule, offload> off(g, o);
    trainee<Precision, Scaler, Partition, Rule, mpopt::host> host(g, o);
    using P = typename Precision::param_type;
    using G = typename Precision::grad_type;
    std::size_t pushed = 0;
    in_lockstep(name, off, host, o, steps, overflow_step, report, [&](const mpopt::step_status& a, int m) {
      // At one rank an unsharded step's update runs behind its decision, so a skipped step's
      // unchanged parameters go back too.
      const bool one_owner = world_size == 1 && !Partition::sharded;
      if (a.applied || (one_owner && m + 1 == o.accumulation_steps)) ++pushed;
    });
    const auto& bus = off.opt.backend();
    expect(bus.bytes_to_host() == std::size_t(steps * o.accumulation_steps) * elements * sizeof(G),
           name + ": " + std::to_string(bus.bytes_to_host()) + " bytes of gradients over the bus");
    expect(bus.bytes_to_device() == pushed * elements * sizeof(P),
           name + ": " + std::to_string(bus.bytes_to_device()) + " bytes of parameters over the bus");
  });
}

/// The sum of x over the ranks.
std::size_t over_ranks(std::size_t x) {
  unsigned long long sum = x;
  MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return std::size_t(sum);
}

/// Offload over a communicator of device memory against the host backend over MPI: bit for bit,
/// with only each rank's pieces over the bus: my reduced piece of every bucket to the host each
/// micro-step (my shard, padding included, in the communication type), or under zero1 where my
/// gradients take it, my gradients; my updated parameters back once per applied step.
template <class Precision, class Scaler, class Partition, class Rule>
void device_case_of(const std::string& name, const typename Rule::options& g, mpopt::optimizer_options o, int steps,
                    int overflow_step, bool report) {
  run("device communicator: " + name, [&] {
    trainee<Precision, Scaler, Partition, Rule, offload, device_comm> off(g, o);
    trainee<Precision, Scaler, Partition, Rule, mpopt::host> host(g, o);
    using opt_type = typename decltype(off)::opt_type;
    using P = typename Precision::param_type;
    using G = typename Precision::grad_type;
    std::size_t applied = 0;
    in_lockstep(name, off, host, o, steps, overflow_step, report,
                [&](const mpopt::step_status& a, int) { applied += a.applied; });
    const auto& bus = off.opt.backend();
    const std::size_t reductions = Partition::name == std::string_view("zero1") ? std::size_t(steps)
                                                                                : std::size_t(steps * o.accumulation_steps);
    if constexpr (std::is_same_v<typename opt_type::accumulate_type, G> && Partition::name == std::string_view("zero1")) {
      expect(over_ranks(bus.bytes_to_host()) == reductions * elements * sizeof(G),
             name + ": " + std::to_string(bus.bytes_to_host()) + " bytes of my gradients to the host");
    } else {
      std::size_t shard = 0;
      for (const auto& b : off.opt.memory_report().buffers)
        if (b.name == "gradient shard") shard = b.bytes / sizeof(typename opt_type::accumulate_type);
      expect(shard * std::size_t(world_size) >= elements && shard <= elements / std::size_t(world_size) + 64 * tensors &&
                 bus.bytes_to_host() == reductions * shard * sizeof(typename opt_type::communicate_type),
             name + ": " + std::to_string(bus.bytes_to_host()) + " bytes of reduced pieces to the host, shard of " +
                 std::to_string(shard));
    }
    expect(over_ranks(bus.bytes_to_device()) == applied * elements * sizeof(P),
           name + ": " + std::to_string(bus.bytes_to_device()) + " bytes of my parameters to the device");
  });
}

/// Checkpoints move between offload over a device communicator and the host backend.
void device_checkpoint() {
  run("device communicator: checkpoint", [&] {
    using off_t = trainee<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam, offload, device_comm>;
    using host_t = trainee<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam, mpopt::host>;
    off_t off({}, {});
    host_t host({}, {});
    for (int s = 0; s < 2; ++s) {
      off.backward(s, false, false);
      off.opt.step();
    }
    const shared_dir dir("offload_device_");
    const std::filesystem::path file = dir / "state";
    off.opt.save(file);
    host.opt.load(file);
    compare("device communicator: checkpoint loaded on the host", off, host);
    off_t again({}, {});
    again.opt.load(file);
    again.backward(2, false, true);
    host.backward(2, false, true);
    again.opt.step();
    host.opt.step();
    compare("device communicator: checkpoint loaded, one more step", again, host);
  });
}

/// Under zero2 with leave_param_gather_in_flight the gathers of step() are in flight when it
/// returns: wait_params(i) finishes tensor i's and copies it back alone; the others follow at
/// wait_params().
void wait_one() {
  run("wait_params(i)", [&] {
    const mpopt::optimizer_options o{.bucket_elements = 700, .overlap_comm = true, .leave_param_gather_in_flight = true};
    trainee<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam, offload> off({}, o);
    trainee<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam, mpopt::host> host({}, o);
    for (int s = 0; s < 2; ++s) {
      off.backward(s, false, true);
      host.backward(s, false, true);
      off.opt.step();
      host.opt.step();
      host.opt.wait_params();
      off.opt.wait_params(tensors - 1);
      const auto own = copy_out<mpopt::half>(off.param(tensors - 1)), expected = copy_out<mpopt::half>(host.param(tensors - 1));
      expect(std::memcmp(own.data(), expected.data(), own_size * sizeof(mpopt::half)) == 0,
             "wait_params(i): tensor i is updated on the device");
      expect(off.opt.backend().bytes_to_device() == (std::size_t(s) * elements + own_size) * sizeof(mpopt::half),
             "wait_params(i): only tensor i went back");
      off.opt.wait_params();
      expect(off.opt.backend().bytes_to_device() == std::size_t(s + 1) * elements * sizeof(mpopt::half),
             "wait_params(): the rest went back, tensor i not again");
    }
    compare("wait_params(i)", off, host);
  });
}

/// zero_grad clears the gradients where the model keeps them; the memory report lists the pinned
/// copies, and only under offload.
void zero_grad_and_memory() {
  run("zero_grad and the memory report", [&] {
    trainee<mpopt::bf16, mpopt::no_scaling, mpopt::zero1, mpopt::lamb, offload> off({}, {});
    trainee<mpopt::bf16, mpopt::no_scaling, mpopt::zero1, mpopt::lamb, mpopt::host> host({}, {});
    off.backward(0, false, false);
    off.opt.zero_grad();
    std::size_t nonzero = 0;
    for (std::size_t t = 0; t < tensors; ++t)
      for (const auto x : copy_out<mpopt::bfloat16>(off.grad(t))) nonzero += float(x) != 0.0f;
    expect(nonzero == 0, "zero_grad: " + std::to_string(nonzero) + " gradient elements are not zero");

    const auto pinned = [](const mpopt::memory_report& r, const std::string& name) {
      for (const auto& b : r.buffers)
        if (b.name == name && b.owned) return b.bytes;
      return std::size_t(0);
    };
    const auto r = off.opt.memory_report();
    expect(pinned(r, "pinned parameters") >= elements * sizeof(mpopt::bfloat16) &&
               pinned(r, "pinned gradients") >= elements * sizeof(mpopt::bfloat16),
           "memory report: the pinned copies are listed:\n" + r.to_string());
    expect(pinned(host.opt.memory_report(), "pinned parameters") == 0, "memory report: no pinned copies on the host backend");
  });
}

#ifndef MPOPT_TEST_GPU
/// finalize() allocates what memory_report() lists besides the flat group's tensors (the pinned
/// copies included), and steps allocate nothing. Host memory only: on a GPU the pinned copies and
/// the tensors are CUDA's allocations, not operator new's.
void allocations() {
  run("allocations", [&] {
    const mpopt::optimizer_options o{.bucket_elements = 700, .overlap_comm = true};
    trainee<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam, offload> off({}, o, false);
    const long long added = live_bytes_added_by([&] { off.opt.finalize(); });
    const auto r = off.opt.memory_report();
    long long listed = 0;
    for (const auto& b : r.buffers)
      if (b.owned && b.name.rfind("group 0 ", 0) != 0) listed += static_cast<long long>(b.bytes);
    expect(added == listed, "allocations: finalize() allocated " + std::to_string(added) + " bytes, the report lists " +
                                std::to_string(listed) + ":\n" + r.to_string());
    for (int s = 0; s < 3; ++s) {
      off.backward(s, false, true);
      const long long during = live_bytes_added_by([&] {
        off.opt.step();
        off.opt.wait_params();
      });
      expect(during == 0, "allocations: step " + std::to_string(s) + " allocated " + std::to_string(during) + " bytes");
    }
  });
}
#endif

/// A checkpoint saved by the offloaded optimizer loads into a host one and into another offloaded
/// one (whose device parameters it sets), which then step alike.
void host_checkpoint() {
  run("checkpoint", [&] {
    using off_t = trainee<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam, offload>;
    using host_t = trainee<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam, mpopt::host>;
    off_t off({}, {});
    for (int s = 0; s < 3; ++s) {
      off.backward(s, s == 1, false);
      off.opt.step();
    }
    const shared_dir dir("offload_");
    const std::filesystem::path file = dir / "state";
    off.opt.save(file);

    host_t host({}, {});
    host.opt.load(file);
    compare("checkpoint: loaded on the host", off, host);
    off_t again({}, {});
    again.opt.load(file);
    compare("checkpoint: loaded offloaded", again, host);
    again.backward(3, false, true);
    host.backward(3, false, true);
    again.opt.step();
    host.opt.step();
    compare("checkpoint: loaded offloaded, one more step", again, host);
  });
}

}  // namespace

int main(int argc, char** argv) {
  start(argc, argv, "offload");
  bool device_comm_runs = true;
#ifdef MPOPT_TEST_GPU
  const cuda_ranks gpus = cuda_devices_on_every_rank();
  if (gpus.devices == 0) {
    if (world_rank == 0) std::printf("%s; offload's tensors live on a GPU\n", gpus.why.c_str());
    return finish(77);
  }
  run("device", [&] {
    if (cudaSetDevice(world_rank % gpus.devices) != cudaSuccess) throw std::runtime_error("cudaSetDevice");
  });
  device_comm_runs = gpus.devices >= world_size;  // NCCL takes a GPU of its own per rank
  if (!device_comm_runs && world_rank == 0)
    std::printf("offload: %d GPU(s) for %d ranks: the nccl cases, one GPU per rank, are left out\n", gpus.devices,
                world_size);
  run("host memory is refused", [&] {
    mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam, offload, mpopt::mpi> opt(
        mpopt::mpi(MPI_COMM_WORLD));
    std::vector<mpopt::half> p(8), g(8);
    expect_error("a host tensor under offload", [&] { opt.add_group({}).add(p, g, "host"); });
  });
#endif

  mpopt::adam::options adam;
  mpopt::lamb::options lamb;
  mpopt::onebit_lamb::options onebit;
  onebit.freeze_step = 3;
  case_of<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam>(
      "zero2 fp16 Adam, overflow, clipped, overlap_comm, grad_ready", adam,
      {.clip_grad = 1.0, .bucket_elements = 700, .overlap_comm = true}, 5, 2, true);
  case_of<mpopt::fp16, mpopt::static_scale, mpopt::zero2, mpopt::adam>("zero2 fp16 Adam, static scale", adam, {}, 3, -1,
                                                                       false);
  case_of<mpopt::bf16, mpopt::no_scaling, mpopt::zero1, mpopt::lamb>("zero1 bf16 LAMB, accumulation 3", lamb,
                                                                     {.accumulation_steps = 3}, 3, -1, true);
  case_of<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::adam>(
      "replicated fp32 Adam (no masters: the host copies are the weights)", adam, {}, 4, -1, false);
  case_of<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam>(
      "replicated fp16 Adam, overflow, overlap_comm, accumulation 2", adam,
      {.accumulation_steps = 2, .overlap_comm = true}, 4, 1, true);
  case_of<mpopt::bf16_stochastic, mpopt::no_scaling, mpopt::zero2, mpopt::adam>(
      "zero2 bf16 Adam, stochastic rounding", adam, {.rounding_seed = 77}, 3, -1, false);
  case_of<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::onebit_lamb>("1-bit LAMB", onebit, {}, 6, -1,
                                                                                     false);
  if (device_comm_runs) {
    device_case_of<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam>(
        "zero2 fp16 Adam, overflow, clipped, overlap_comm, grad_ready", adam,
        {.clip_grad = 1.0, .bucket_elements = 700, .overlap_comm = true}, 5, 2, true);
    device_case_of<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::lamb>("zero2 fp16 LAMB, accumulation 2", lamb,
                                                                                {.accumulation_steps = 2}, 3, 1, false);
    device_case_of<mpopt::bf16, mpopt::no_scaling, mpopt::zero1, mpopt::lamb>(
        "zero1 bf16 LAMB, accumulation 3, overlap_comm", lamb,
        {.accumulation_steps = 3, .bucket_elements = 1500, .overlap_comm = true}, 3, -1, true);
    device_case_of<mpopt::fp32, mpopt::no_scaling, mpopt::zero1, mpopt::adam>(
        "zero1 fp32 Adam (the reduced shard in the gradients)", adam, {.bucket_elements = 900}, 3, -1, false);
    device_case_of<mpopt::bf16_stochastic, mpopt::no_scaling, mpopt::zero2, mpopt::adam>(
        "zero2 bf16 Adam, stochastic rounding", adam, {.rounding_seed = 77}, 3, -1, false);
    device_checkpoint();
  }
  wait_one();
  zero_grad_and_memory();
#ifndef MPOPT_TEST_GPU
  allocations();
#endif
  host_checkpoint();
  return finish();
}
