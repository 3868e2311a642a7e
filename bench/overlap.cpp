// mpopt benchmark: how much communication optimizer_options::overlap_comm hides behind a simulated
// forward and backward, under mpirun (protocol, cases and fields: bench/README.md, "overlap").
//
//   mpirun -np 2 overlap [--params N] [--repeat R] [--filter SUBSTR] [--quick] [--layers L]
//                        [--layers-per-bucket K] [--compute-ratio X] [--passes F] [--buckets-in-flight B]
//
// A model of L equal layers, one tensor each, in one flat group of bf16 parameters with fp32 masters
// (Adam). One iteration: a forward (layer 0 first: compute on the layer's parameters, after
// wait_params(layer) when overlap is on under zero1/zero2), a backward (layer L-1 first: compute,
// write the gradient, grad_ready(layer)), then step(). Cases: partition zero2, zero1, replicated
// ("bf16/adam/<partition>" for --filter). Each round times, alternated, after a barrier, 3 of each
// (the time of one is reported):
//   t_off      iterations with overlap_comm off (after an untimed one, as for t_on);
//   t_on       iterations with overlap_comm and leave_param_gather_in_flight on, after an untimed one
//              that leaves its all-gather in flight, as in a training loop; what the last leaves in
//              flight is finished untimed;
//   t_comm     the optimizer's collectives alone: the same mpopt::mpi calls on the same buckets and
//              per-rank counts, back to back from one staging buffer, no compute;
//   t_compute  the forward and backward compute alone.
// Each is the slowest rank's. hidden = (t_off - t_on) / t_comm per round: median, min, max.
// The models with overlap off and on must end bit for bit alike, or the run fails (exit status 1).
// One JSON line per case on stdout (rank 0); progress, errors and a summary table on stderr.
#define OMPI_SKIP_MPICXX 1  // Open MPI's deprecated C++ bindings: the C API only
#include <mpi.h>

#include <mpopt/mpi.hpp>

#include "common.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace bench;
using precision = mpopt::bf16;
using P = precision::param_type;
using G = precision::grad_type;
using communicate = precision::communicate_type;

struct model_config {
  std::size_t layers = 24;
  std::size_t layers_per_bucket = 2;
  double compute_ratio = 1.0;  // forward + backward compute against t_comm, when passes is -1
  int passes = -1;             // compute rounds per element in the forward (backward: 2x); -1: calibrated
  int in_flight = 2;           // optimizer_options::buckets_in_flight
};

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int w = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}
/// The slowest rank's times: an iteration is as slow as its slowest rank.
void max_over_ranks(std::span<double> t) {
  MPI_Allreduce(MPI_IN_PLACE, t.data(), int(t.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
}

// ---------------------------------------------------------------- the simulated layers

// Each layer's compute runs over tiles of 256 elements that stay in L1 through its rounds, so it
// costs the core time but little memory traffic beyond reading the parameters and writing the
// gradients; elements and tiles are independent, so any thread count gives the same bits.
constexpr std::size_t tile = 256;

std::size_t tiles_of(std::size_t n) { return (n + tile - 1) / tile; }

/// f(j) for j < m, as a loop of fixed length for a whole tile, so that it vectorizes at -O2 too.
template <class F>
void for_tile(std::size_t m, F&& f) {
  if (m == tile)
    for (std::size_t j = 0; j < tile; ++j) f(j);
  else
    for (std::size_t j = 0; j < m; ++j) f(j);
}

/// y after `rounds` rounds of y = y/2 + x, from y = x (a tail tile's x is padded with zeros).
void rounds(const float* x, float* y, int rounds) {
  std::copy(x, x + tile, y);
  for (int r = 0; r < rounds; ++r)
    for (std::size_t j = 0; j < tile; ++j) y[j] = 0.5f * y[j] + x[j];
}

/// Forward: per tile of the layer's parameters w, `passes` rounds from x = w; the tile's mean of y
/// is its activation.
void forward_layer(std::span<const P> w, float* act, int passes) {
  const std::ptrdiff_t tiles = std::ptrdiff_t(tiles_of(w.size()));
  BENCH_OMP(omp parallel for schedule(static))
  for (std::ptrdiff_t t = 0; t < tiles; ++t) {
    const std::size_t at = std::size_t(t) * tile, m = std::min(tile, w.size() - at);
    alignas(64) float x[tile] = {}, y[tile];
    for_tile(m, [&](std::size_t j) { x[j] = float(w[at + j]); });
    rounds(x, y, passes);
    float s[8] = {};  // eight partial sums: the adds vectorize without reordering
    for (std::size_t j = 0; j < tile; j += 8)
      for (std::size_t k = 0; k < 8; ++k) s[k] += y[j + k];
    act[t] = (((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))) / float(tile);
  }
}

/// Backward: 2 * passes rounds from x = w + act - c (the tile's activation); the gradient is 1e-3 y.
/// It depends on what the forward read, so a forward that read a layer before its all-gather
/// landed changes every later bit.
void backward_layer(std::span<const P> w, const float* act, std::span<G> g, int passes, float c) {
  const std::ptrdiff_t tiles = std::ptrdiff_t(tiles_of(w.size()));
  BENCH_OMP(omp parallel for schedule(static))
  for (std::ptrdiff_t t = 0; t < tiles; ++t) {
    const std::size_t at = std::size_t(t) * tile, m = std::min(tile, w.size() - at);
    const float a = act[t] - c;
    alignas(64) float x[tile] = {}, y[tile];
    for_tile(m, [&](std::size_t j) { x[j] = float(w[at + j]) + a; });
    rounds(x, y, 2 * passes);
    for_tile(m, [&](std::size_t j) { g[at + j] = G(1e-3f * y[j]); });
  }
}

// ---------------------------------------------------------------- the model

template <class Partition>
struct model {
  using opt_t = mpopt::optimizer<precision, mpopt::no_scaling, Partition, mpopt::adam, mpopt::host, mpopt::mpi>;
  static constexpr bool sharded = Partition::sharded;

  opt_t opt;
  bool overlap;
  std::vector<std::span<P>> params;
  std::vector<std::span<G>> grads;
  std::vector<std::size_t> offsets;  // of each layer's activations (one per tile)
  int iterations = 0;

  model(const std::vector<std::size_t>& sizes, mpopt::optimizer_options o, bool overlap_comm)
      : opt(mpopt::mpi{MPI_COMM_WORLD}, with_overlap(o, overlap_comm)), overlap(overlap_comm) {
    const case_settings<mpopt::no_scaling, mpopt::adam> settings(true);
    std::vector<mpopt::tensor_spec> specs;
    for (std::size_t l = 0; l < sizes.size(); ++l) specs.push_back({"layer" + std::to_string(l), sizes[l]});
    auto& g = opt.add_flat_group(settings.rule, std::span<const mpopt::tensor_spec>(specs));
    std::size_t at = 0;
    for (std::size_t l = 0; l < sizes.size(); ++l) {
      params.push_back(g.param(l));
      grads.push_back(g.grad(l));
      offsets.push_back(at);
      at += tiles_of(sizes[l]);
      fill_normal(params[l].data(), sizes[l], param_sigma, l + 1);  // the same on every rank and model
    }
    opt.finalize();
  }

  /// Forward, backward and step; `act` holds every layer's activations.
  void iteration(float* act, int passes) {
    const std::size_t layers = params.size();
    for (std::size_t l = 0; l < layers; ++l) {
      if (overlap && sharded) opt.wait_params(l);  // the previous step's all-gather of this layer
      forward_layer(params[l], act + offsets[l], passes);
    }
    // Ranks' gradients differ, so that the reductions add something.
    const float c = 0.01f * float((iterations + world_rank()) % 5 - 2);
    for (std::size_t l = layers; l-- > 0;) {
      backward_layer(params[l], act + offsets[l], grads[l], passes, c);
      opt.grad_ready(l);
    }
    const auto st = opt.step();
    if (!st.applied) mpopt::detail::fail("step ", iterations, " not applied (", st.reason(), ")");
    ++iterations;
  }
  /// Nothing left in flight: the parameters are all current.
  void settle() {
    if (overlap && sharded) opt.wait_params();
  }

 private:
  static mpopt::optimizer_options with_overlap(mpopt::optimizer_options o, bool on) {
    o.overlap_comm = on;
    o.leave_param_gather_in_flight = on;  // the forward waits for each layer (iteration)
    return o;
  }
};

/// The forward and backward compute alone, on m's buffers (the next iteration rewrites them).
template <class M>
void compute_alone(M& m, float* act, int passes) {
  for (std::size_t l = 0; l < m.params.size(); ++l) forward_layer(m.params[l], act + m.offsets[l], passes);
  for (std::size_t l = m.params.size(); l-- > 0;)
    backward_layer(m.params[l], act + m.offsets[l], m.grads[l], passes, 0.0f);
}

/// How many elements of a and b differ, bit for bit.
template <class T>
std::size_t differing(std::span<const T> a, std::span<const T> b) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return n;
}
/// Elements of parameters, masters and moments (this rank's) that differ between the two models.
template <class M>
std::size_t differences(M& off, M& on) {
  off.settle();
  on.settle();
  std::size_t n = 0;
  for (std::size_t l = 0; l < off.params.size(); ++l) {
    n += differing<P>(off.params[l], on.params[l]);
    n += differing<float>(off.opt.master(l), on.opt.master(l));
    for (std::size_t k = 0; k < 2; ++k) n += differing<float>(off.opt.moment(k, l), on.opt.moment(k, l));
  }
  return n;
}

// ---------------------------------------------------------------- communication alone

/// The collectives of one iteration as the optimizer makes them, without compute, packing or the
/// scalar all-reduces (norm, overflow flag; they follow the last bucket and cannot be hidden):
/// zero1/zero2 reduce-scatter every bucket in the communication type (last bucket first, as
/// backward completes them) and all-gather every bucket's parameters; replicated all-reduces every
/// bucket. Bucket sizes and per-rank counts come from the layout code the optimizer runs.
struct comm_alone {
  mpopt::mpi comm{MPI_COMM_WORLD};
  bool sharded;
  std::vector<mpopt::detail::bucket> buckets;
  std::vector<communicate> packed, piece;
  std::vector<P> gathered;
  double bytes = 0;  // this rank's bytes handed to the collectives

  comm_alone(const std::vector<std::size_t>& sizes, std::size_t bucket_elements, bool sharded_)
      : sharded(sharded_) {
    const int w = comm.size(), r = comm.rank();
    const std::vector<std::uint32_t> one_group(sizes.size(), 0);
    const mpopt::detail::flat_layout layout(one_group, sizes, 1, sharded ? w : 1, sharded ? r : 0, sharded);
    buckets = layout.buckets(bucket_elements);
    std::size_t widest = 0, mine = 0;
    for (const auto& k : buckets) {
      widest = std::max(widest, k.size());
      if (sharded) mine = std::max(mine, k.my_count(r));
      bytes += double(k.size()) * (sizeof(communicate) + (sharded ? sizeof(P) : 0));
    }
    packed.assign(widest, communicate(1.0f));
    piece.assign(mine, communicate(0.0f));
    gathered.assign(widest, P(0.0f));
  }

  /// The blocking calls (what step() makes with overlap off), or (`started`) their nonblocking twins,
  /// each waited for at once: what overlap_comm starts, costed without anything to overlap.
  void run(bool started = false) {
    constexpr auto sum = mpopt::reduce_op::sum;
    for (auto k = buckets.rbegin(); k != buckets.rend(); ++k) {
      const std::span<communicate> send(packed.data(), k->size());
      const std::span<const std::size_t> counts(k->counts);
      if (!sharded) {
        if (started) comm.start_all_reduce(send, sum).wait();
        else comm.all_reduce(send, sum);
        continue;
      }
      const std::span<communicate> mine(piece.data(), k->my_count(comm.rank()));
      if (started) comm.start_reduce_scatter(std::span<const communicate>(send), mine, counts, sum).wait();
      else comm.reduce_scatter(std::span<const communicate>(send), mine, counts, sum);
    }
    if (sharded)
      for (const auto& k : buckets) {
        const std::span<P> data(gathered.data(), k.size());
        if (started) comm.start_all_gather(data, std::span<const std::size_t>(k.counts)).wait();
        else comm.all_gather(data, std::span<const std::size_t>(k.counts));
      }
  }
};

// ---------------------------------------------------------------- one case

struct summary_row {
  std::string name;
  double t_off, t_on, t_comm, t_compute, nonblocking;
  stats hidden;
};

/// Seconds f() takes on this rank.
template <class F>
double time_of(F&& f) {
  const auto t0 = clock_type::now();
  f();
  return seconds_since(t0);
}
/// The same, the ranks leaving a barrier together first.
template <class F>
double timed(F&& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  return time_of(f);
}

/// Compute rounds per element (forward; the backward makes twice as many) such that forward and
/// backward together take compute_ratio * t_comm, or as close as the rounds' floor allows (0: the
/// parameters read and the gradients written, nothing else). The compute alone at 0 and 8 rounds
/// gives its fixed part and its part per round; each time is the slowest rank's, the median of 5.
template <class M>
int calibrated_passes(const model_config& mc, M& m, float* act, comm_alone& comm) {
  if (mc.passes >= 0) return mc.passes;
  std::vector<double> t[3];
  for (int r = 0; r < 5; ++r) {
    double now[3] = {timed([&] { comm.run(); }), timed([&] { compute_alone(m, act, 0); }),
                     timed([&] { compute_alone(m, act, 8); })};
    max_over_ranks(now);
    for (std::size_t i = 0; i < 3; ++i) t[i].push_back(now[i]);
  }
  const double comm_s = summarize(t[0]).median, fixed = summarize(t[1]).median;
  const double per_pass = std::max((summarize(t[2]).median - fixed) / 8, 1e-12);
  return int(std::clamp(std::round((mc.compute_ratio * comm_s - fixed) / per_pass), 0.0, 1e6));
}

template <class Partition>
bool run_case(const config& cfg, const model_config& mc, std::string_view partition, std::vector<summary_row>& rows) {
  const std::string name = std::string("bf16/adam/").append(partition);
  if (!cfg.wants(name)) return true;
  const bool lead = world_rank() == 0;
  if (lead) std::fprintf(stderr, "overlap: %s ...\n", name.c_str());

  const auto sizes = unfused_sizes(cfg.params, mc.layers);
  // k whole layers per bucket: the layout cuts between tensors, each padded to 16 elements.
  const std::size_t padded = (*std::max_element(sizes.begin(), sizes.end()) + 15) / 16 * 16;
  mpopt::optimizer_options o = case_settings<mpopt::no_scaling, mpopt::adam>(true).optimizer;
  o.bucket_elements = std::min(mc.layers_per_bucket * padded, std::size_t{1} << 30);
  o.buckets_in_flight = mc.in_flight;

  model<Partition> off(sizes, o, false), on(sizes, o, true);
  comm_alone comm(sizes, o.bucket_elements, Partition::sharded);
  std::vector<float> act(tiles_of(cfg.params) + sizes.size());  // every layer's tiles

  // Warm-up: state first-touched, one untimed iteration of each, then the compute's cost.
  off.iteration(act.data(), 1);
  on.iteration(act.data(), 1);
  on.settle();
  comm.run();
  const int passes = calibrated_passes(mc, off, act.data(), comm);

  std::vector<double> t_off, t_on, t_comm, t_compute, hidden, speedup, compute_vs_comm, nonblocking;
  // Each measurement times `per_round` iterations (or runs of the communication or compute alone) and
  // reports the time of one, which evens out a single iteration's jitter.
  constexpr int per_round = 3;
  auto repeated = [&](auto&& f) {
    return [&] {
      for (int i = 0; i < per_round; ++i) f();
    };
  };
  for (int r = 0; r < cfg.repeat; ++r) {
    // The timed iterations follow an untimed one of the same model with no barrier between them, so
    // that overlap's all-gather is in flight as the timed forward starts, as in a training loop.
    double t[5];
    MPI_Barrier(MPI_COMM_WORLD);
    off.iteration(act.data(), passes);
    t[0] = time_of(repeated([&] { off.iteration(act.data(), passes); })) / per_round;
    MPI_Barrier(MPI_COMM_WORLD);
    on.iteration(act.data(), passes);
    t[1] = time_of(repeated([&] { on.iteration(act.data(), passes); })) / per_round;
    on.settle();  // untimed: the next measurements see no collective in flight
    t[2] = timed(repeated([&] { comm.run(); })) / per_round;
    t[3] = timed(repeated([&] { compute_alone(off, act.data(), passes); })) / per_round;
    t[4] = timed(repeated([&] { comm.run(true); })) / per_round;
    max_over_ranks(t);
    t_off.push_back(t[0]), t_on.push_back(t[1]), t_comm.push_back(t[2]), t_compute.push_back(t[3]);
    nonblocking.push_back(t[4] / t[2]);
    hidden.push_back((t[0] - t[1]) / t[2]);
    speedup.push_back(t[0] / t[1]);
    compute_vs_comm.push_back(t[3] / t[2]);
  }

  // The measurement is only worth something if overlap changed nothing but the schedule.
  unsigned long long diff = differences(off, on);
  MPI_Allreduce(MPI_IN_PLACE, &diff, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (diff != 0) {
    if (lead)
      std::fprintf(stderr,
                   "overlap: %s: FAILED: after %d iterations, %llu elements of the parameters, masters or moments "
                   "differ between overlap_comm off and on (they must be bit for bit alike)\n",
                   name.c_str(), off.iterations, diff);
    return false;
  }

  const stats h = summarize(hidden), s = summarize(speedup), off_s = summarize(t_off), on_s = summarize(t_on),
              comm_s = summarize(t_comm), compute_s = summarize(t_compute), cvc = summarize(compute_vs_comm),
              nb = summarize(nonblocking);
  if (lead) {
    std::printf(
        "{\"bench\":\"overlap\",\"partition\":\"%.*s\",\"precision\":\"bf16\",\"rule\":\"adam\",\"params\":%zu,"
        "\"layers\":%zu,\"buckets\":%zu,\"bucket_elements\":%zu,\"buckets_in_flight\":%d,\"ranks\":%d,\"threads\":%d,"
        "\"rounds\":%d,\"passes_forward\":%d,\"passes_backward\":%d,\"hidden\":%.3f,\"hidden_min\":%.3f,"
        "\"hidden_max\":%.3f,\"hidden_of_medians\":%.3f,\"speedup\":%.3f,\"speedup_min\":%.3f,"
        "\"speedup_max\":%.3f,\"compute_vs_comm\":%.3f,\"comm_share\":%.3f,\"t_off_s\":%.5f,\"t_on_s\":%.5f,"
        "\"t_comm_s\":%.5f,\"t_compute_s\":%.5f,\"comm_gbps\":%.2f,\"nonblocking_vs_blocking\":%.3f,"
        "\"identical\":true,\"iterations\":%d}\n",
        int(partition.size()), partition.data(), cfg.params, mc.layers, comm.buckets.size(), o.bucket_elements,
        mc.in_flight, world_size(), max_threads(), cfg.repeat, passes, 2 * passes, h.median, h.min, h.max,
        (off_s.median - on_s.median) / comm_s.median, s.median, s.min, s.max, cvc.median,
        comm_s.median / off_s.median, off_s.median, on_s.median, comm_s.median, compute_s.median,
        comm.bytes / comm_s.median / 1e9, nb.median, off.iterations);
    std::fflush(stdout);
  }
  rows.push_back({std::string(partition), off_s.median, on_s.median, comm_s.median, compute_s.median, nb.median, h});
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  model_config mc;
  command_line cl;
  cl.defaults.params = std::size_t{1} << 24;
  cl.quick_params = std::size_t{1} << 16;
  cl.quick_repeat = 2;
  cl.cases = "\"precision/rule/partition\" (bf16/adam/zero2, bf16/adam/zero1, bf16/adam/replicated)";
  cl.extra = {
      {"--layers", "L", "layers, one tensor each, of equal size (default 24)",
       [&](const std::string& v) { mc.layers = std::stoull(v); }},
      {"--layers-per-bucket", "K", "whole layers per bucket, which sets bucket_elements (default 2)",
       [&](const std::string& v) { mc.layers_per_bucket = std::stoull(v); }},
      {"--compute-ratio", "X", "forward + backward compute time / t_comm, calibrated per case (default 1)",
       [&](const std::string& v) { mc.compute_ratio = std::stod(v); }},
      {"--passes", "F", "compute rounds per element, forward F and backward 2F (default: calibrated)",
       [&](const std::string& v) { mc.passes = std::stoi(v); }},
      {"--buckets-in-flight", "B", "optimizer_options::buckets_in_flight (default 2)",
       [&](const std::string& v) { mc.in_flight = std::stoi(v); }},
  };
  const config cfg = parse(argc, argv, cl);
  if (mc.layers < 1 || mc.layers > cfg.params || mc.layers_per_bucket < 1 || !(mc.compute_ratio > 0) ||
      mc.passes < -1 || mc.in_flight < 1)
    usage(argv[0], 2, cl);

  MPI_Init(&argc, &argv);
  if (world_size() < 2) {
    std::fprintf(stderr, "overlap: run it on 2 or more ranks (mpirun -np 2 %s): one rank communicates nothing\n",
                 argv[0]);
    MPI_Finalize();
    return 2;
  }

  bool ok = true;
  std::vector<summary_row> rows;
  try {
    ok = run_case<mpopt::zero2>(cfg, mc, "zero2", rows) && ok;
    ok = run_case<mpopt::zero1>(cfg, mc, "zero1", rows) && ok;
    ok = run_case<mpopt::replicated>(cfg, mc, "replicated", rows) && ok;
  } catch (const mpopt::error& e) {
    // A collective failed or a step was not applied: the ranks no longer agree on what comes next.
    std::fprintf(stderr, "overlap: rank %d: mpopt::error: %s\n", world_rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (world_rank() == 0 && !rows.empty()) {
    std::fprintf(stderr, "\n%d ranks x %d threads, %zu params, %zu layers; medians of %d rounds, the slowest rank's\n",
                 world_size(), max_threads(), cfg.params, mc.layers, cfg.repeat);
    std::fprintf(stderr, "%-11s %9s %9s %10s %13s %13s   %s\n", "partition", "t_off ms", "t_on ms", "t_comm ms",
                 "(nonblocking)", "t_compute ms", "hidden median [min, max]");
    for (const auto& r : rows)
      std::fprintf(stderr, "%-11s %9.2f %9.2f %10.2f %12.2fx %13.2f   %.2f [%.2f, %.2f]\n", r.name.c_str(),
                   1e3 * r.t_off, 1e3 * r.t_on, 1e3 * r.t_comm, r.nonblocking, 1e3 * r.t_compute, r.hidden.median,
                   r.hidden.min, r.hidden.max);
  }
  MPI_Finalize();
  return ok ? 0 : 1;
}
