// 0/1 Adam on W MPI ranks against the float64 reference of W ranks (onebit_reference.hpp, with
// DeepSpeed's stateful schedule): each step, from the library's state on every rank, through
// variance steps, compressed-gradient steps, the switch to phase 2, local steps and syncs; the
// schedule against DeepSpeed's documented examples; each kind of step's traffic; checkpoints taken
// in each phase resume bit for bit; the thread count changes no bit; an overflow on one rank skips
// a local step and a sync step everywhere; bad options and schedules are refused.
#include <doctest/doctest.h>


#include "error_of.hpp"
#include "mpi_onebit_model.hpp"
#include "onebit_reference.hpp"

namespace {

/// Phase 1 is t = 1..8: variance steps t = 1, 2, 3, 5, 7 (s = 2, 3, 4, 6, 8), compressed gradients
/// t = 4, 6, 8. Phase 2 from t = 9: syncs at t = 9, 10, 11, 15, 19 (s = 10, 11, 12, 16, 20).
mpopt::zero_one_adam::options zero_one_options() {
  mpopt::zero_one_adam::options o;
  o.lr = 2e-3;
  o.weight_decay = 0.01;
  o.var_freeze_step = 8;
  o.var_update_scaler = 2;
  o.local_step_scaler = 2;
  o.local_step_clipper = 4;
  return o;
}

template <class P, class Scaler = mpopt::no_scaling, class Comm = mpopt::mpi>
using zero_one_opt = mpopt::optimizer<P, Scaler, mpopt::replicated, mpopt::zero_one_adam, test_backend, Comm>;

double largest_magnitude(const std::vector<double>& x) {
  double most = 0;
  for (double e : x) most = std::max(most, std::abs(e));
  return most;
}

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE("0/1 Adam's schedule is DeepSpeed's: the documented examples, in its count s = t + 1") {
    using rule = mpopt::zero_one_adam;
    auto steps = [](const rule::options& o, std::uint64_t last_s, auto pick) {
      std::vector<std::uint64_t> out;
      for (std::uint64_t s = 2; s <= last_s; ++s)
        if (pick(o, s - 1)) out.push_back(s);
      return out;
    };
    auto variance = [](const rule::options& o, std::uint64_t t) { return t <= o.var_freeze_step && rule::variance_step(o, t); };
    auto one_bit = [](const rule::options& o, std::uint64_t t) { return t <= o.var_freeze_step && !rule::variance_step(o, t); };
    auto sync = [](const rule::options& o, std::uint64_t t) { return t > o.var_freeze_step && rule::sync_step(o, t); };
    rule::options o;  // kappa 2, V 10, local_step_scaler 2, H 4 (docs/design.md §3.9)
    o.var_update_scaler = 2, o.var_freeze_step = 10, o.local_step_scaler = 2, o.local_step_clipper = 4;
    CHECK(steps(o, 30, variance) == std::vector<std::uint64_t>{2, 3, 4, 6, 8});
    CHECK(steps(o, 30, one_bit) == std::vector<std::uint64_t>{5, 7, 9, 10, 11});
    CHECK(steps(o, 30, sync) == std::vector<std::uint64_t>{12, 13, 14, 16, 20, 24, 28});
    o.var_update_scaler = 1, o.var_freeze_step = 4, o.local_step_scaler = 1, o.local_step_clipper = 2;  // its unit test
    CHECK(steps(o, 12, variance) == std::vector<std::uint64_t>{2, 4});
    CHECK(steps(o, 12, one_bit) == std::vector<std::uint64_t>{3, 5});
    CHECK(steps(o, 12, sync) == std::vector<std::uint64_t>{6, 8, 10, 12});
    const rule::options d;  // the defaults: kappa 16
    std::vector<std::uint64_t> want;
    for (std::uint64_t s = 2; s <= 17; ++s) want.push_back(s);
    for (std::uint64_t s = 18; s <= 48; s += 2) want.push_back(s);
    for (std::uint64_t s = 52; s <= 60; s += 4) want.push_back(s);
    CHECK(steps(d, 60, variance) == want);
    CHECK(rule::local_gradients(d, 1) == false);
    CHECK(rule::local_gradients(d, d.var_freeze_step + 1) == true);
    // Far out the intervals stop doubling at local_step_clipper and nothing overflows.
    CHECK(rule::local_interval(d, ~std::uint64_t{0} - 1) == d.local_step_clipper);
    CHECK(rule::variance_step(d, ~std::uint64_t{0} - 1) == false);
  }

  TEST_CASE_TEMPLATE(
      "0/1 Adam on W ranks follows the float64 reference of W ranks step by step: from every rank's state (masters, "
      "momenta, accumulators, error buffers) one reference step gives each rank's masters, momentum, accumulator, "
      "variance and errors, through variance steps, compressed gradients, the phase switch, local steps and syncs. fp32 "
      "and fp16 compress per tensor, with a tensor of zero gradients (excluded) and an exp_avg_mask; bf16 over every "
      "tensor at once",
      P, mpopt::fp32, mpopt::bf16, mpopt::fp16) {
    const int w = world_size(), rank = world_rank();
    const std::size_t me = std::size_t(rank);
    CAPTURE(w);
    const bool per_tensor = !std::is_same_v<P, mpopt::bf16>, silent = per_tensor;
    const auto o = compressing(zero_one_options(), per_tensor);
    model<zero_one_opt<P>> one(o, mpopt::mpi{MPI_COMM_WORLD}, mpopt::optimizer_options{.clip_grad = 0});
    ref::zero_one_adam_model ref(std::size_t(w),
                                 {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps,
                                  .weight_decay = o.weight_decay, .var_freeze_step = o.var_freeze_step,
                                  .var_update_scaler = o.var_update_scaler, .local_step_scaler = o.local_step_scaler,
                                  .local_step_clipper = o.local_step_clipper, .per_tensor = per_tensor},
                                 one.initial());
    keep_alike(one.opt, ref, per_tensor);
    const std::size_t padded = ref.sim.padded, chunk = ref.sim.chunk;
    double worst_p = 0, worst_m = 0, worst_a = 0, worst_v = 0, worst_e = 0;
    std::size_t ties = 0, syncs = 0, compressed = 0;
    for (int s = 0; s < 22; ++s) {
      CAPTURE(s);
      const std::uint64_t t = std::uint64_t(s) + 1;
      for (std::size_t i = 0; i < onebit_sizes.size(); ++i) {
        const std::size_t n = onebit_sizes[i];
        const auto ps = from_every_rank(one.opt.master(i)), ms = from_every_rank(one.opt.moment(0, i)),
                   as = from_every_rank(one.opt.moment(2, i));
        for (std::size_t r = 0; r < std::size_t(w); ++r) {
          ref.p[r][i] = part(ps, r, n);
          ref.m[r][i] = part(ms, r, n);
          ref.a[r][i] = part(as, r, n);
        }
        ref.v[i].assign(one.opt.moment(1, i).begin(), one.opt.moment(1, i).end());
      }
      start_from(ref.sim, one.opt);
      std::vector<grads_t> seen;
      for (int r = 0; r < w; ++r) seen.push_back(one.write(local_gradient(s, r, silent)));  // what rank r reads
      one.write(local_gradient(s, rank, silent));
      const auto before = ref.p[me], m_before = ref.m[me], a_before = ref.a[me], v_before = ref.v;
      const auto st = one.opt.step();
      CHECK(st.applied);
      CHECK(st.compression_step == (t >= 4 ? 4u : 0u));  // the first compressed gradient
      ref.step(seen);
      syncs += t > o.var_freeze_step && ref.exchanged;
      compressed += t <= o.var_freeze_step && ref.exchanged;
      std::vector<char> loose(w, 0);  // a tie may move its server chunk's scale by ~1/chunk
      for (std::size_t k = 0; k < padded; ++k)
        if (ref.sim.tie[k]) loose[k / chunk] = 1;
      std::size_t at = 0;
      for (std::size_t i = 0; i < onebit_sizes.size(); ++i) {
        const auto ms = one.opt.master(i), m = one.opt.moment(0, i), v = one.opt.moment(1, i), a = one.opt.moment(2, i);
        const double a_scale = largest_magnitude(ref.a[me][i]) + largest_magnitude(a_before[i]);
        for (std::size_t k = 0; k < onebit_sizes[i]; ++k, ++at) {
          if (ref.sim.tied_at(at)) {  // counted where the average is used
            ties += ref.kept.keeps(at, i, ref.v[i][k]);
            continue;
          }
          const bool loose_at = loose[ref.sim.place(at) / chunk];
          // Float rounding relative to the terms summed, not to a result that cancelled.
          double g = 0;
          for (int r = 0; r < w; ++r) g += std::abs(seen[std::size_t(r)][i][k]) / w;
          const double sqrt_v = std::sqrt(ref.v[i][k]);
          const double tol_m = (loose_at ? 1e-4 : 1e-6) * std::abs(ref.m[me][i][k]) +
                               1e-6 * (o.beta1 * std::abs(m_before[i][k]) + (1 - o.beta1) * g);
          const double tol_v = 1e-6 * (o.beta2 * v_before[i][k] + (1 - o.beta2) * g * g) + 1e-30;
          // the accumulator, scaled by sqrt(v) on syncs, and the parameters, which take it back
          const double tol_a = 1e-6 * a_scale * (1 + sqrt_v) + o.lr * tol_m / (sqrt_v + o.eps);
          const double tol_p = 0x1p-22 * (std::abs(ref.p[me][i][k]) + std::abs(before[i][k])) +
                               1e-4 * std::abs(ref.p[me][i][k] - before[i][k]) + o.lr * tol_m / (sqrt_v + o.eps) +
                               (loose_at ? 1e-4 : 1e-6) * a_scale * (1 + 1 / (sqrt_v + o.eps));
          worst_p = std::max(worst_p, std::abs(ms[k] - ref.p[me][i][k]) / (tol_p + 1e-30));
          worst_m = std::max(worst_m, std::abs(m[k] - ref.m[me][i][k]) / (tol_m + 1e-30));
          worst_a = std::max(worst_a, std::abs(a[k] - ref.a[me][i][k]) / (tol_a + 1e-30));
          worst_v = std::max(worst_v, std::abs(v[k] - ref.v[i][k]) / tol_v);
        }
      }
      if (w > 1 && ref.exchanged) {  // this rank's errors after the exchange
        const auto we = one.opt.compression().worker_error();
        const auto se = one.opt.compression().server_error();
        const auto& rw = ref.sim.worker_error[me];
        const auto& rs = ref.sim.server_error[me];
        const double wscale = largest_magnitude(rw), sscale = largest_magnitude(rs);
        for (std::size_t k = 0; k < padded; ++k)
          if (!ref.sim.tie[k]) worst_e = std::max(worst_e, std::abs(we[k] - rw[k]) / (1e-6 * wscale + 1e-30));
        for (std::size_t k = 0; k < chunk; ++k) {
          const double rel = loose[me] ? 1e-4 : 1e-6;
          if (!ref.sim.tie[me * chunk + k]) worst_e = std::max(worst_e, std::abs(se[k] - rs[k]) / (rel * sscale + 1e-30));
        }
      }
    }
    if (w > 1) {
      CHECK(compressed == 3);
      CHECK(syncs == 5);
    }
    CHECK(ties * 1000 <= padded + 1000);
    CHECK_MESSAGE(worst_p <= 1.0, "masters off the reference: worst error / tolerance = " << worst_p);
    CHECK_MESSAGE(worst_m <= 1.0, "momentum off the reference: worst error / tolerance = " << worst_m);
    CHECK_MESSAGE(worst_a <= 1.0, "accumulator off the reference: worst error / tolerance = " << worst_a);
    CHECK_MESSAGE(worst_v <= 1.0, "variance off the reference: worst error / tolerance = " << worst_v);
    CHECK_MESSAGE(worst_e <= 1.0, "error buffers off the reference: worst error / tolerance = " << worst_e);
    if (rank == 0)
      MESSAGE("W " << w << " " << P::name << ": worst error / tolerance: masters " << worst_p << ", momentum " << worst_m
                   << ", accumulator " << worst_a << ", variance " << worst_v << ", errors " << worst_e << "; " << ties
                   << " tied signs left out");
  }

  TEST_CASE(
      "0/1 Adam's traffic per step: a variance step all-reduces the fp32 gradients, a compressed-gradient step and a "
      "sync step hand the communicator at most 1/16 of that, a local step only the overflow flag and the norm") {
    using opt_t = zero_one_opt<mpopt::bf16, mpopt::no_scaling, counting_mpi>;
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    const auto o = zero_one_options();
    model<opt_t> m(o, counting_mpi{MPI_COMM_WORLD});
    m.opt.finalize();
    std::size_t params = 0;
    for (std::size_t n : onebit_sizes) params += n;
    const double fp32_allreduce = 4.0 * double(params);
    for (int s = 0; s < 20; ++s) {
      CAPTURE(s);
      const std::uint64_t t = std::uint64_t(s) + 1;
      m.write(local_gradient(s, rank));
      auto& comm = m.opt.communicator();
      const std::size_t before = comm.bytes;
      const auto st = m.opt.step();
      const std::size_t bytes = comm.bytes - before;
      CHECK(st.comm_bytes == bytes);
      if (w == 1) continue;
      const std::size_t flag_and_norm = 1 + 8;
      if (t <= o.var_freeze_step && mpopt::zero_one_adam::variance_step(o, t)) CHECK(double(bytes) >= fp32_allreduce);
      else if (t <= o.var_freeze_step || mpopt::zero_one_adam::sync_step(o, t))
        CHECK(bytes == m.opt.compression().bytes_per_exchange() + flag_and_norm);
      else CHECK(bytes == flag_and_norm);
    }
  }

  TEST_CASE_TEMPLATE(
      "0/1 Adam: a checkpoint taken in phase 1 (after a variance step, after a compressed gradient), at the phase "
      "switch, or in phase 2 (after a sync, between syncs: every rank's own parameters and state) resumes bit for bit "
      "at the same world size; another world size above 1 needs reset_compression_errors",
      P, mpopt::bf16 HOST_ONLY(mpopt::fp32)) {
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    const shared_dir dir;
    auto other = zero_one_options();
    other.lr = 0.5;  // the file's options win
    for (int at : {2, 4, 8, 11, 13}) {
      CAPTURE(at);
      const auto path = dir / ("zero_one_adam" + std::to_string(at) + ".safetensors");
      model<zero_one_opt<P>> a(zero_one_options(), mpopt::mpi{MPI_COMM_WORLD});
      for (int s = 0; s < at; ++s) {
        a.write(local_gradient(s, rank));
        CHECK(a.opt.step().applied);
      }
      model<zero_one_opt<P>> b(other, mpopt::mpi{MPI_COMM_WORLD});
      check_resume(a, b, path, at, 22);
      // Every rank's own copy is in the file: another world size needs the reset, and takes rank 0's.
      if (at == 13) check_other_world<zero_one_opt<P>>(path, zero_one_options(), 13);
    }
  }

  TEST_CASE("0/1 Adam gives the same bits with 1 and 3 threads, through both phases") {
    const threads_restored restore;
    std::vector<std::vector<std::uint32_t>> runs;
    for (int threads : {1, 3}) {
      force_threads(threads);
      model<zero_one_opt<mpopt::bf16>> m(zero_one_options(), mpopt::mpi{MPI_COMM_WORLD});
      train_steps(m, 0, 16);
      runs.push_back(m.state_bits());
    }
    CHECK(runs[0] == runs[1]);
  }

  TEST_CASE(
      "0/1 Adam: a tensor whose gradient stays 0 (variance 0) blows up in the compressed steps without "
      "exclude_zero_variance and keeps a zero momentum with it; set_exp_avg_mask refuses bad masks, changing nothing") {
    check_zero_variance_excluded<mpopt::zero_one_adam>(zero_one_options(), 12);
    check_mask_refusals<mpopt::zero_one_adam>(zero_one_options());
  }

  TEST_CASE(
      "0/1 Adam in fp16 with the dynamic scaler: an overflow on one rank skips a compressed-gradient step, a local step "
      "and a sync step on every rank, with parameters, moments, accumulators and errors bit-identical") {
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    model<zero_one_opt<mpopt::fp16, mpopt::dynamic_scale>> m(
        zero_one_options(), mpopt::mpi{MPI_COMM_WORLD}, mpopt::optimizer_options{},
        mpopt::dynamic_scale_options{.init_scale = 1024, .hysteresis = 1});
    int s = 0;
    // Before t = 4 (a compressed gradient), t = 12 (local) and t = 15 (a sync), an overflow first.
    for (std::uint64_t next : {4u, 12u, 15u}) {
      CAPTURE(next);
      for (; std::uint64_t(m.opt.group(0).step()) + 1 < next; ++s) {
        m.write(local_gradient(s, rank));
        CHECK(m.opt.step().applied);
      }
      const auto before = m.state_bits();
      const double scale = m.opt.loss_scale();
      auto g = local_gradient(s, rank);
      if (rank == w - 1) g[2][12345] = 1e5 / scale;  // overflows fp16 on this rank only
      m.write(g);
      const auto st = m.opt.step();
      CHECK(st.result == mpopt::step_result::skipped_nonfinite);
      CHECK(m.opt.loss_scale() == scale / 2);
      CHECK(m.state_bits() == before);
    }
    m.write(local_gradient(s, rank));
    CHECK(m.opt.step().applied);
  }

  TEST_CASE("0/1 Adam refuses bad options naming the field, groups whose schedules differ, and a communicator that "
            "misdelivers") {
    using opt_t = zero_one_opt<mpopt::fp32>;
    auto refused = [](mpopt::zero_one_adam::options o) {
      opt_t opt{mpopt::mpi{MPI_COMM_WORLD}};
      return error_of([&] { opt.add_group(o); });
    };
    for (auto field : {&mpopt::zero_one_adam::options::var_update_scaler, &mpopt::zero_one_adam::options::local_step_scaler,
                       &mpopt::zero_one_adam::options::local_step_clipper}) {
      auto o = zero_one_options();
      o.*field = 0;
      CHECK(refused(o).find(" must be in [1, 9007199254740992], got 0") != std::string::npos);
      o.*field = (std::uint64_t(1) << 53) + 1;  // a step count, as checkpoints keep them
      CHECK(refused(o).find(" must be in [1, 9007199254740992], got 9007199254740993") != std::string::npos);
    }
    auto o = zero_one_options();
    o.beta2 = -0.1;
    CHECK(refused(o).find("beta2") != std::string::npos);
    {
      opt_t opt{mpopt::mpi{MPI_COMM_WORLD}};
      std::vector<float> a(3), b(3), ga(3), gb(3);
      auto later = zero_one_options();
      later.local_step_clipper = 8;
      opt.add_group(zero_one_options()).add(a, ga, "a");
      opt.add_group(later).add(b, gb, "b");
      CHECK(error_of([&] { opt.finalize(); }).find("schedule") != std::string::npos);
    }
    const std::string message =
        error_of([] { zero_one_opt<mpopt::fp32, mpopt::no_scaling, misdelivering_mpi> opt{misdelivering_mpi{MPI_COMM_WORLD}}; });
    if (world_size() > 1) CHECK(message.find("0/1 Adam preflight") != std::string::npos);
    else CHECK(message == "<no exception>");
  }
}
