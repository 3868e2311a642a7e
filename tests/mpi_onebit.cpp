// 1-bit LAMB on W MPI ranks: warm-up equals replicated LAMB; the compression stage follows the
// float64 reference of W ranks (onebit_reference.hpp: local momenta, the compressed all-reduce with
// its error feedback, frozen variance, factors); checkpoints carry the error buffers and resume bit
// for bit; the momentum all-reduce hands the communicator at most 1/16 of an fp32 all-reduce's
// bytes; an overflow on one rank skips the step everywhere without touching the errors; the
// preflight catches a communicator that misdelivers.
#include <doctest/doctest.h>

#include "mpi_onebit_model.hpp"
#include "onebit_reference.hpp"

namespace {

mpopt::onebit_lamb::options onebit_options(std::uint64_t freeze, double wd = 0.01) {
  mpopt::onebit_lamb::options o;
  o.lr = 2e-3;
  o.weight_decay = wd;
  o.freeze_step = freeze;
  o.beta2 = 0.9;  // the fresh variance drifts within a short test
  return o;
}
ref::onebit_hyper to_ref(const mpopt::onebit_lamb::options& o) {
  return {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay,
          .min_coeff = o.min_coeff, .max_coeff = o.max_coeff, .freeze_step = o.freeze_step, .coeff_beta = o.coeff_beta,
          .factor_max = o.factor_max, .factor_min = o.factor_min, .factor_threshold = o.factor_threshold};
}

template <class P>
using onebit_opt = mpopt::optimizer<P, mpopt::no_scaling, mpopt::replicated, mpopt::onebit_lamb, test_backend, mpopt::mpi>;

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE_TEMPLATE(
      "1-bit LAMB on W ranks: warm-up equals replicated LAMB bit for bit; the compression stage follows the float64 "
      "reference of W ranks (masters, momentum, fresh variance, coefficients); params agree on every rank; a tensor "
      "whose gradient is always zero (momentum scaling 1, its averages excluded) changes nothing else; with it, "
      "compression per tensor and an exp_avg_mask, without, over every tensor at once",
      P, mpopt::fp32, mpopt::bf16) {
   for (bool silent : {false, true}) {
    CAPTURE(silent);
    const bool per_tensor = silent;
    using lamb_opt = mpopt::optimizer<P, mpopt::no_scaling, mpopt::replicated, mpopt::lamb, test_backend, mpopt::mpi>;
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    const std::uint64_t freeze = 5;
    const auto o = compressing(onebit_options(freeze), per_tensor);
    // No clipping: a clip coefficient from fp32 norm sums would differ from the reference's by ~1e-6
    // relative, and the error feedback would carry that into signs near zero round after round.
    const mpopt::optimizer_options no_clip{.clip_grad = 0};
    model<onebit_opt<P>> one(o, mpopt::mpi{MPI_COMM_WORLD}, no_clip);
    mpopt::lamb::options lo;
    lo.lr = o.lr;
    lo.beta2 = o.beta2;
    lo.weight_decay = o.weight_decay;
    lo.bias_correction = false;
    model<lamb_opt> plain(lo, mpopt::mpi{MPI_COMM_WORLD}, no_clip);
    auto hyper = to_ref(o);
    hyper.per_tensor = per_tensor;
    ref::onebit_model ref(std::size_t(w), hyper, one.initial());
    ref.clip_grad = 0;
    keep_alike(one.opt, ref, per_tensor);
    double worst_p = 0, worst_m = 0, worst_c = 0;
    std::size_t compared = 0, ties = 0;
    std::vector<std::vector<double>> path;
    for (std::size_t n : onebit_sizes) path.emplace_back(n, 0.0);
    for (int s = 0; s < 18; ++s) {
      CAPTURE(s);
      std::vector<grads_t> seen;
      for (int r = 0; r < w; ++r) seen.push_back(one.write(local_gradient(s, r, silent)));  // what rank r reads
      one.write(local_gradient(s, rank, silent));
      const auto st = one.opt.step();
      CHECK(st.applied);
      CHECK(st.compression_step == (std::uint64_t(s) >= freeze ? freeze + 1 : 0));
      const auto before = ref.p;
      ref.step(seen);
      for (std::size_t i = 0; i < path.size(); ++i)
        for (std::size_t k = 0; k < path[i].size(); ++k) path[i][k] += std::abs(ref.p[i][k] - before[i][k]);
      if (std::uint64_t(s) < freeze) {
        plain.write(local_gradient(s, rank, silent));
        const auto sp = plain.opt.step();
        CHECK(st.grad_norm == sp.grad_norm);
        CHECK(one.state_bits().size() > 0);
        for (std::size_t i = 0; i < onebit_sizes.size(); ++i)
          CHECK(std::equal(one.p[i].begin(), one.p[i].end(), plain.p[i].begin(), [](auto a, auto b) { return bits(a) == bits(b); }));
        CHECK(std::equal(one.opt.lamb_coeffs().begin(), one.opt.lamb_coeffs().end(), plain.opt.lamb_coeffs().begin()));
      }
      CHECK(std::abs(st.grad_norm - ref.grad_norm) <= 1e-5 * ref.grad_norm);
      // Against the reference, leaving out elements whose sign the reference decided within float
      // rounding of zero (there the fp32 library may rightly decide the other way).
      for (std::size_t i = 0; i < onebit_sizes.size(); ++i) {
        const auto ms = one.opt.master(i), m = one.opt.moment(0, i), fresh = one.opt.moment(2, i);
        for (std::size_t k = 0, at = flat_index(i); k < onebit_sizes[i]; ++k, ++at) {
          if (ref.tied(i, k)) {  // counted where the average is used
            ties += ref.kept.keeps(at, i, ref.v[i][k]);
            continue;
          }
          ++compared;
          const double tol_p = (s + 1) * 0x1p-23 * std::abs(ref.p[i][k]) + 1e-4 * path[i][k];
          worst_p = std::max(worst_p, std::abs(ms[k] - ref.p[i][k]) / (tol_p + 1e-30));
          // momentum: relative, with a floor for values that cancelled to ~0 (float rounding of
          // terms ~0.1: gradients are ~0.01..0.1)
          worst_m = std::max(worst_m, std::abs(m[k] - ref.m[i][k]) / (1e-5 * std::abs(ref.m[i][k]) + 5e-8));
          worst_m = std::max(worst_m, std::abs(fresh[k] - ref.v_fresh[i][k]) / (1e-3 * ref.v_fresh[i][k] + 1e-16));
        }
        worst_c = std::max(worst_c, std::abs(one.opt.lamb_coeffs()[i] - ref.coeffs[i]) / (1e-4 * ref.coeffs[i] + 1e-12));
      }
    }
    CHECK(ties * 1000 <= ref.sim.padded + 1000);
    CHECK(compared > 0);
    CHECK_MESSAGE(worst_p <= 1.0, "masters off the reference: worst error / tolerance = " << worst_p);
    CHECK_MESSAGE(worst_m <= 1.0, "moments off the reference: worst error / tolerance = " << worst_m);
    CHECK_MESSAGE(worst_c <= 1.0, "coefficients off the reference: worst error / tolerance = " << worst_c);
    if (rank == 0)
      MESSAGE("W " << w << ": worst error / tolerance: masters " << worst_p << ", moments " << worst_m
                   << ", coefficients " << worst_c << "; " << ties << " tied signs left out");
    // The momentum, and with it every parameter, is the same on every rank.
    std::vector<std::uint32_t> mine;
    for (const auto& t : one.p)
      for (auto x : t) mine.push_back(bits(x));
    std::vector<std::uint32_t> first = mine;
    MPI_Bcast(first.data(), int(first.size()), MPI_UINT32_T, 0, MPI_COMM_WORLD);
    CHECK(first == mine);
    if (silent) {  // DeepSpeed would divide by the zero momentum's norm; the checkpoint shows the 1
      const shared_dir dir;
      one.opt.save(dir / "silent.safetensors");
      std::vector<float> scaling(onebit_sizes.size());
      mpopt::detail::state_reader(dir / "silent.safetensors").read("scaling_coeff", std::span<float>(scaling));
      CHECK(scaling[1] == 1.0f);
      CHECK(scaling[0] != 1.0f);
      for (const auto& t : one.p) CHECK(std::all_of(t.begin(), t.end(), [](auto x) { return std::isfinite(float(x)); }));
    }
   }
  }

  TEST_CASE(
      "in the compression stage the momentum all-reduce hands the communicator at most 1/16 of the bytes of an fp32 "
      "all-reduce of it; step_status reports the ratio and the step compression started") {
    check_compressed_traffic<mpopt::onebit_lamb>(onebit_options(3));
  }

  TEST_CASE_TEMPLATE(
      "a checkpoint saved in the compression stage resumes bit for bit at the same world size (error buffers "
      "included); another world size above 1 needs reset_compression_errors; one rank loads it",
      P, mpopt::bf16 HOST_ONLY(mpopt::fp32)) {
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    const shared_dir dir;
    const auto path = dir / "onebit.safetensors";
    const auto o = onebit_options(3);
    model<onebit_opt<P>> a(o, mpopt::mpi{MPI_COMM_WORLD});
    for (int s = 0; s < 6; ++s) {
      a.write(local_gradient(s, rank));
      a.opt.step();
    }
    std::vector<std::vector<float>> saved_masters;
    for (std::size_t i = 0; i < onebit_sizes.size(); ++i)
      saved_masters.emplace_back(a.opt.master(i).begin(), a.opt.master(i).end());
    model<onebit_opt<P>> b(onebit_options(99, 0.0), mpopt::mpi{MPI_COMM_WORLD});
    check_resume(a, b, path, 6, 10);
    check_other_world<onebit_opt<P>>(path, o, 10);
    // One rank has no compressed communication: nothing of the errors is needed.
    MPI_Comm self;
    MPI_Comm_split(MPI_COMM_WORLD, rank, 0, &self);
    {
      model<onebit_opt<P>> solo(o, mpopt::mpi{self});
      solo.opt.load(path);
      for (std::size_t i = 0; i < onebit_sizes.size(); ++i)
        CHECK(std::equal(saved_masters[i].begin(), saved_masters[i].end(), solo.opt.master(i).begin()));
      solo.write(local_gradient(6, rank));
      CHECK(solo.opt.step().applied);
    }
    MPI_Comm_free(&self);
  }

  TEST_CASE(
      "fp16 with the dynamic scaler: an overflow on one rank in the compression stage skips the step on every rank; "
      "parameters, moments and error buffers stay bit-identical") {
    check_overflow_skips<mpopt::onebit_lamb>(onebit_options(2));
  }

  TEST_CASE("the preflight: a communicator that delivers all-to-all blocks to the wrong ranks fails construction on "
            "every rank") {
    using opt_t = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::onebit_lamb, test_backend,
                                   misdelivering_mpi>;
    const int w = world_size();
    std::string message;
    try {
      opt_t opt{misdelivering_mpi{MPI_COMM_WORLD}};
    } catch (const mpopt::error& e) {
      message = e.what();
    }
    if (w > 1) CHECK(message.find("1-bit LAMB preflight") != std::string::npos);
    else CHECK(message.empty());  // one rank's single block cannot go astray
  }
}
