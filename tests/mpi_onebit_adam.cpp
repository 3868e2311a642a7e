// 1-bit Adam on W MPI ranks against the float64 reference of W ranks (onebit_reference.hpp:
// warm-up on averaged gradients, then local momenta through the compressed all-reduce with its
// error feedback, the variance frozen), step by step through warm-up, the freeze step and
// compression; checkpoints taken in each phase resume bit for bit; the thread count changes no bit;
// the compression stage hands the communicator at most 1/16 of an fp32 all-reduce's bytes; an
// overflow on one rank skips the step everywhere; bad options and groups are refused.
#include <doctest/doctest.h>


#include "error_of.hpp"
#include "mpi_onebit_model.hpp"
#include "onebit_reference.hpp"

namespace {

mpopt::onebit_adam::options onebit_adam_options(std::uint64_t freeze, double wd = 0.01) {
  mpopt::onebit_adam::options o;
  o.lr = 2e-3;
  o.weight_decay = wd;
  o.freeze_step = freeze;
  return o;
}

template <class P, class Scaler = mpopt::no_scaling, class Comm = mpopt::mpi>
using onebit_adam_opt = mpopt::optimizer<P, Scaler, mpopt::replicated, mpopt::onebit_adam, test_backend, Comm>;

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE_TEMPLATE(
      "1-bit Adam on W ranks follows the float64 reference of W ranks step by step through warm-up, the freeze step "
      "and the compression stage: each step, from the library's state (masters, moments, every rank's error buffers), "
      "one reference step gives the masters, momentum, variance (frozen) and errors; params agree on every rank. "
      "fp32 and fp16 compress per tensor, with a tensor of zero gradients (excluded) and an exp_avg_mask; bf16 over "
      "every tensor at once",
      P, mpopt::fp32, mpopt::bf16, mpopt::fp16) {
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    const std::uint64_t freeze = 5;
    const bool per_tensor = !std::is_same_v<P, mpopt::bf16>, silent = per_tensor;
    const auto o = compressing(onebit_adam_options(freeze), per_tensor);
    model<onebit_adam_opt<P>> one(o, mpopt::mpi{MPI_COMM_WORLD}, mpopt::optimizer_options{.clip_grad = 0});
    ref::onebit_adam_model ref(std::size_t(w),
                               {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps,
                                .weight_decay = o.weight_decay, .freeze_step = o.freeze_step, .per_tensor = per_tensor},
                               one.initial());
    keep_alike(one.opt, ref, per_tensor);
    const std::size_t padded = ref.sim.padded, chunk = ref.sim.chunk;
    double worst_p = 0, worst_m = 0, worst_v = 0, worst_e = 0;
    std::size_t ties = 0;
    std::vector<std::vector<float>> frozen;
    for (int s = 0; s < 16; ++s) {
      CAPTURE(s);
      for (std::size_t i = 0; i < onebit_sizes.size(); ++i) {
        const auto ms = one.opt.master(i), m = one.opt.moment(0, i), v = one.opt.moment(1, i);
        ref.p[i].assign(ms.begin(), ms.end());
        ref.m[i].assign(m.begin(), m.end());
        ref.v[i].assign(v.begin(), v.end());
      }
      start_from(ref.sim, one.opt);
      std::vector<grads_t> seen;
      for (int r = 0; r < w; ++r) seen.push_back(one.write(local_gradient(s, r, silent)));  // what rank r reads
      one.write(local_gradient(s, rank, silent));
      const auto before = ref.p, m_before = ref.m, v_before = ref.v;
      const auto st = one.opt.step();
      CHECK(st.applied);
      CHECK(st.compression_step == (std::uint64_t(s) >= freeze ? freeze + 1 : 0));
      ref.step(seen);
      // A sign decided within rounding of zero (left out) may move its server chunk's scale by ~1/chunk.
      std::vector<char> loose(w, 0);
      for (std::size_t k = 0; k < padded; ++k)
        if (ref.sim.tie[k]) loose[k / chunk] = 1;
      std::size_t at = 0;
      for (std::size_t i = 0; i < onebit_sizes.size(); ++i) {
        const auto ms = one.opt.master(i), m = one.opt.moment(0, i), v = one.opt.moment(1, i);
        if (std::uint64_t(s) + 1 == freeze) frozen.emplace_back(v.begin(), v.end());
        if (std::uint64_t(s) >= freeze) CHECK(std::equal(v.begin(), v.end(), frozen[i].begin()));
        for (std::size_t k = 0; k < onebit_sizes[i]; ++k, ++at) {
          if (ref.sim.tied_at(at)) {  // counted where the average is used
            ties += ref.kept.keeps(at, i, ref.v[i][k]);
            continue;
          }
          // Float rounding is relative to the terms summed, not to a result that cancelled: the
          // ranks' gradients (in the average) and the moments' two terms.
          double g = 0;
          for (int r = 0; r < w; ++r) g += std::abs(seen[std::size_t(r)][i][k]) / w;
          const double tol_m = (loose[ref.sim.place(at) / chunk] ? 1e-4 : 1e-6) * std::abs(ref.m[i][k]) +
                               1e-6 * (o.beta1 * std::abs(m_before[i][k]) + (1 - o.beta1) * g);
          const double tol_v = 1e-6 * (o.beta2 * v_before[i][k] + (1 - o.beta2) * g * g) + 1e-30;
          const double tol_p = 0x1p-22 * std::abs(ref.p[i][k]) + 1e-4 * std::abs(ref.p[i][k] - before[i][k]) +
                               o.lr * tol_m / (std::sqrt(ref.v[i][k]) + o.eps);
          worst_p = std::max(worst_p, std::abs(ms[k] - ref.p[i][k]) / (tol_p + 1e-30));
          worst_m = std::max(worst_m, std::abs(m[k] - ref.m[i][k]) / (tol_m + 1e-30));
          worst_v = std::max(worst_v, std::abs(v[k] - ref.v[i][k]) / tol_v);
        }
      }
      if (w > 1 && std::uint64_t(s) >= freeze) {  // this rank's errors after the step
        const auto we = one.opt.compression().worker_error();
        const auto se = one.opt.compression().server_error();
        const auto& rw = ref.sim.worker_error[std::size_t(rank)];
        const auto& rs = ref.sim.server_error[std::size_t(rank)];
        const double wscale = *std::max_element(rw.begin(), rw.end(), [](double a, double b) { return std::abs(a) < std::abs(b); });
        const double sscale = *std::max_element(rs.begin(), rs.end(), [](double a, double b) { return std::abs(a) < std::abs(b); });
        for (std::size_t k = 0; k < padded; ++k)
          if (!ref.sim.tie[k]) worst_e = std::max(worst_e, std::abs(we[k] - rw[k]) / (1e-6 * std::abs(wscale) + 1e-30));
        for (std::size_t k = 0; k < chunk; ++k) {
          const std::size_t g = std::size_t(rank) * chunk + k;
          const double rel = loose[std::size_t(rank)] ? 1e-4 : 1e-6;
          if (!ref.sim.tie[g]) worst_e = std::max(worst_e, std::abs(se[k] - rs[k]) / (rel * std::abs(sscale) + 1e-30));
        }
      }
    }
    CHECK(ties * 1000 <= padded + 1000);
    CHECK_MESSAGE(worst_p <= 1.0, "masters off the reference: worst error / tolerance = " << worst_p);
    CHECK_MESSAGE(worst_m <= 1.0, "momentum off the reference: worst error / tolerance = " << worst_m);
    CHECK_MESSAGE(worst_v <= 1.0, "variance off the reference: worst error / tolerance = " << worst_v);
    CHECK_MESSAGE(worst_e <= 1.0, "error buffers off the reference: worst error / tolerance = " << worst_e);
    if (rank == 0)
      MESSAGE("W " << w << " " << P::name << ": worst error / tolerance: masters " << worst_p << ", momentum " << worst_m
                   << ", variance " << worst_v << ", errors " << worst_e << "; " << ties << " tied signs left out");
    // The momentum, and with it every parameter, is the same on every rank.
    std::vector<std::uint32_t> mine;
    for (const auto& t : one.p)
      for (auto x : t) mine.push_back(bits(x));
    std::vector<std::uint32_t> first = mine;
    MPI_Bcast(first.data(), int(first.size()), MPI_UINT32_T, 0, MPI_COMM_WORLD);
    CHECK(first == mine);
  }

  TEST_CASE_TEMPLATE(
      "1-bit Adam: a checkpoint taken in warm-up, at the freeze step or in the compression stage resumes bit for bit "
      "at the same world size (error buffers included); another world size above 1 needs reset_compression_errors",
      P, mpopt::bf16 HOST_ONLY(mpopt::fp32)) {
    const int w = world_size();
    CAPTURE(w);
    const shared_dir dir;
    const auto o = onebit_adam_options(4);
    for (int at : {2, 4, 7}) {  // warm-up, the freeze step, compression
      CAPTURE(at);
      const auto path = dir / ("onebit_adam" + std::to_string(at) + ".safetensors");
      model<onebit_adam_opt<P>> a(o, mpopt::mpi{MPI_COMM_WORLD});
      train_steps(a, 0, at);
      model<onebit_adam_opt<P>> b(onebit_adam_options(4, 0.5), mpopt::mpi{MPI_COMM_WORLD});
      check_resume(a, b, path, at, 10);
      if (at == 7) check_other_world<onebit_adam_opt<P>>(path, o, 10);
    }
  }

  TEST_CASE("1-bit Adam gives the same bits with 1 and 3 threads, through warm-up and compression") {
    const threads_restored restore;
    std::vector<std::vector<std::uint32_t>> runs;
    for (int threads : {1, 3}) {
      force_threads(threads);
      model<onebit_adam_opt<mpopt::bf16>> m(onebit_adam_options(3), mpopt::mpi{MPI_COMM_WORLD});
      train_steps(m, 0, 8);
      runs.push_back(m.state_bits());
    }
    CHECK(runs[0] == runs[1]);
  }

  TEST_CASE(
      "1-bit Adam: in the compression stage a step hands the communicator at most 1/16 of the bytes of an fp32 "
      "all-reduce; step_status reports the ratio and the step compression started") {
    check_compressed_traffic<mpopt::onebit_adam>(onebit_adam_options(3));
  }

  TEST_CASE(
      "1-bit Adam: a tensor whose gradient stays 0 through warm-up (variance 0) blows up without "
      "exclude_zero_variance and keeps a zero momentum with it; set_exp_avg_mask refuses bad masks, changing nothing") {
    check_zero_variance_excluded<mpopt::onebit_adam>(onebit_adam_options(3), 8);
    check_mask_refusals<mpopt::onebit_adam>(onebit_adam_options(3));
  }

  TEST_CASE(
      "1-bit Adam in fp16 with the dynamic scaler: an overflow on one rank in the compression stage skips the step on "
      "every rank; parameters, moments and error buffers stay bit-identical") {
    check_overflow_skips<mpopt::onebit_adam>(onebit_adam_options(2));
  }

  TEST_CASE("1-bit Adam refuses bad options naming the field, groups that disagree on freeze_step, and a communicator "
            "that misdelivers") {
    using opt_t = onebit_adam_opt<mpopt::fp32>;
    auto refused = [](mpopt::onebit_adam::options o) {
      opt_t opt{mpopt::mpi{MPI_COMM_WORLD}};
      return error_of([&] { opt.add_group(o); });
    };
    auto o = onebit_adam_options(3);
    o.freeze_step = 0;
    CHECK(refused(o).find("freeze_step must be >= 1") != std::string::npos);
    o = onebit_adam_options(3);
    o.beta1 = 1.0;
    CHECK(refused(o).find("beta1") != std::string::npos);
    o = onebit_adam_options(3);
    o.eps = 0;
    CHECK(refused(o).find("eps") != std::string::npos);
    {
      opt_t opt{mpopt::mpi{MPI_COMM_WORLD}};
      std::vector<float> a(3), b(3), ga(3), gb(3);
      opt.add_group(onebit_adam_options(3)).add(a, ga, "a");
      opt.add_group(onebit_adam_options(4)).add(b, gb, "b");
      CHECK(error_of([&] { opt.finalize(); }).find("differs from group 0's") != std::string::npos);
    }
    std::string message = error_of([] { onebit_adam_opt<mpopt::fp32, mpopt::no_scaling, misdelivering_mpi> opt{misdelivering_mpi{MPI_COMM_WORLD}}; });
    if (world_size() > 1) CHECK(message.find("1-bit Adam preflight") != std::string::npos);
    else CHECK(message == "<no exception>");  // one rank's single block cannot go astray
  }
}
