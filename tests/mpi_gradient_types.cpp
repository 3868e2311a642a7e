// Gradients summed and sent in 16 bits (mixed_precision<T, Accumulate, Communicate>) and the gradient
// pre-divide factor, over MPI under replicated, zero1 and zero2: the collectives carry the chosen
// type, each element once; sums that are exact in 16 bits give the fp32 path's bits; inexact bf16 sums
// stay within their rounding bound of a single fp32 process; a pre-divide keeps an fp16 sum from
// overflowing.
#include <doctest/doctest.h>

#include "mpi_harness.hpp"

namespace {

using half_sums = mpopt::mixed_precision<mpopt::half, mpopt::half, mpopt::half>;
using half_sent = mpopt::mixed_precision<mpopt::half, float, mpopt::half>;
using half_kept = mpopt::mixed_precision<mpopt::half, mpopt::half, float>;
using bf16_sums = mpopt::mixed_precision<mpopt::bfloat16, mpopt::bfloat16, mpopt::bfloat16>;
using bf16_sent = mpopt::mixed_precision<mpopt::bfloat16, float, mpopt::bfloat16>;

/// Records the element type and length of every floating-point sum (fp32 or 16-bit: the gradients;
/// norms travel as double) a communicator is asked for.
struct recording_mpi : mpopt::mpi {
  using mpopt::mpi::mpi;
  static constexpr std::string_view name = "recording_mpi";
  struct sum {
    std::string_view type;
    std::size_t elements;
  };
  std::vector<sum> sums;

  using mpopt::mpi::all_reduce;
  using mpopt::mpi::reduce_scatter;
  template <class T>
  void all_reduce(std::span<T> data, mpopt::reduce_op op) {
    note<T>(op, data.size());
    mpopt::mpi::all_reduce(data, op);
  }
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts, mpopt::reduce_op op) {
    note<T>(op, in.size());
    mpopt::mpi::reduce_scatter(in, out, counts, op);
  }

 private:
  template <class T>
  void note(mpopt::reduce_op op, std::size_t n) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, mpopt::half> || std::is_same_v<T, mpopt::bfloat16>)
      if (op == mpopt::reduce_op::sum) sums.push_back({mpopt::type_name<T>, n});
  }
};
static_assert(mpopt::communicator<recording_mpi>);

mpopt::optimizer_options small_buckets(mpopt::optimizer_options o = {}) {
  o.bucket_elements = 3000;
  return o;
}

template <class Partition>
std::string partition_name() {
  return std::string(Partition::name);
}

}  // namespace

TEST_SUITE("mpi") {
  // (The device build: every pairing of sum and sent type in fp16; bf16's, in the bf16 case below.)
  TEST_CASE_TEMPLATE("gradients travel in the communication type, every element once per reduction", P, mpopt::fp16,
                     half_sums, half_sent, half_kept HOST_ONLY(bf16_sums, bf16_sent)) {
    using C = typename P::communicate_type;
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    const shape sh = random_shape(0x7E + w);
    std::size_t p = 0;
    for (std::size_t n : sh.all()) p += n;
    // Padding: every tensor starts on 16 elements, every group splits into W shards of 16 multiples.
    const std::size_t padding = 16 * (sh.all().size() + 2 * std::size_t(w));
    const dataset ds{0x7E, sh.all(), true};
    auto run = [&]<class Partition>(Partition) {
      using D = mpopt::optimizer<P, mpopt::no_scaling, Partition, mpopt::adam, test_backend, recording_mpi>;
      CAPTURE(partition_name<Partition>());
      net<D> n(layout::unfused, sh, 1, recording_mpi{MPI_COMM_WORLD}, small_buckets({.accumulation_steps = 2}));
      n.opt.finalize();
      n.opt.communicator().sums.clear();
      for (int a = 0; a < 2; ++a) {
        n.write(ds.micro_batch(0, 2 * rank + a));
        n.report_ready();
        n.opt.step();
      }
      std::size_t elements = 0;
      for (const auto& s : n.opt.communicator().sums) {
        CHECK(s.type == mpopt::type_name<C>);
        elements += s.elements;
      }
      // One reduction per boundary; zero2 reduces each micro-step; one process sums nothing.
      const std::size_t reductions = w == 1 && !Partition::sharded ? 0 : Partition::reduce_every_micro_step ? 2 : 1;
      CHECK(elements >= reductions * p);
      CHECK(elements <= reductions * (p + padding));
    };
    run(mpopt::replicated{});
    run(mpopt::zero1{});
    run(mpopt::zero2{});
  }

  TEST_CASE_TEMPLATE(
      "fp16 gradients summed or sent in 16 bits, pre-divided or not, give the fp32 path's bits when every sum is "
      "exact in fp16",
      P, half_sums HOST_ONLY(half_sent, half_kept)) {
    // Exact data: 8-bit gradients whose sums over up to 8 micro-batches need at most 11 bits.
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    const shape sh = random_shape(0x16B + w);
    const dataset ds{0x16B, sh.all(), true};
    const mpopt::dynamic_scale_options so{.init_scale = 1024, .window = 3};
    auto run = [&]<class Partition, class Rule>(Partition, Rule) {
      using Sixteen = mpopt::optimizer<P, mpopt::dynamic_scale, Partition, Rule, test_backend, mpopt::mpi>;
      using Default = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, Partition, Rule, test_backend, mpopt::mpi>;
      for (int a_steps : {1, 2}) {
        for (double predivide : {1.0, 2.0}) {
          CAPTURE(partition_name<Partition>());
          CAPTURE(Rule::name);
          CAPTURE(a_steps);
          CAPTURE(predivide);
          net<Sixteen> sixteen(layout::unfused, sh, 6, mpopt::mpi{MPI_COMM_WORLD},
                               small_buckets({.accumulation_steps = a_steps, .gradient_predivide = predivide}), so);
          net<Default> fp32_sums(layout::unfused, sh, 6, mpopt::mpi{MPI_COMM_WORLD},
                                 small_buckets({.accumulation_steps = a_steps}), so);
          for (int s = 0; s < 6; ++s) {
            CAPTURE(s);
            mpopt::step_status st[2];
            for (int a = 0; a < a_steps; ++a) {
              const grads_t g = ds.micro_batch(s, rank * a_steps + a);
              sixteen.write(g);
              fp32_sums.write(g);
              sixteen.report_ready();
              fp32_sums.report_ready();
              st[0] = sixteen.opt.step();
              st[1] = fp32_sums.opt.step();
            }
            CHECK(st[1].result == mpopt::step_result::applied);
            CHECK(st[0].result == st[1].result);
            CHECK(st[0].grad_norm == st[1].grad_norm);
            const std::string diff = take(sixteen).difference(take(fp32_sums));
            CHECK_MESSAGE(diff.empty(), "16-bit sums differ from fp32 sums: " << diff);
          }
        }
      }
    };
    run(mpopt::replicated{}, mpopt::adam{});
    run(mpopt::zero1{}, mpopt::lamb{});
    run(mpopt::zero2{}, mpopt::adam{});
  }

  TEST_CASE_TEMPLATE(
      "bf16 gradients summed and sent in bf16: after the first step every exp_avg is within the bound of its "
      "roundings of a single fp32-summing process; training goes on alike on every rank",
      P, bf16_sums, bf16_sent) {
    const int w = world_size();
    CAPTURE(w);
    const shape sh = random_shape(0xBF + w);
    const dataset ds{0xBF, sh.all(), false};
    auto run = [&]<class Partition>(Partition) {
      using D = mpopt::optimizer<P, mpopt::no_scaling, Partition, mpopt::adam, test_backend, mpopt::mpi>;
      using L = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::adam, test_backend>;
      for (int a_steps : {1, 2}) {
        CAPTURE(partition_name<Partition>());
        CAPTURE(a_steps);
        const int terms = w * a_steps;
        net<D> d(layout::unfused, sh, 7, mpopt::mpi{MPI_COMM_WORLD}, small_buckets({.accumulation_steps = a_steps}));
        net<L> l(layout::unfused, sh, 7, mpopt::optimizer_options{.accumulation_steps = terms});
        const auto batch = ds.batch(0, terms);
        const auto [sd, sl] = boundary(d, l, batch, a_steps);
        CHECK(sd.result == mpopt::step_result::applied);
        CHECK(sl.result == mpopt::step_result::applied);
        // The sum of `terms` bf16 gradients rounds at most terms - 1 times (adds across micro-steps and
        // ranks) plus once into a 16-bit shard; each rounding errs by at most bf16's unit roundoff 2^-8
        // of a partial sum, itself at most the sum of |g|. exp_avg = (1 - beta1) (clip * mean + L2
        // term), beta1 >= 0.85.
        const double roundings = terms, u = std::ldexp(1.0, -8);
        std::size_t bad = 0;
        double worst = 0;
        for (std::size_t i = 0; i < d.params.size(); ++i) {
          const auto md = whole(d.opt, i, d.opt.moment(0, i));
          const auto ml = whole(l.opt, i, l.opt.moment(0, i));
          for (std::size_t k = 0; k < md.size(); ++k) {
            double mean = 0, abs_sum = 0;
            for (const auto& g : batch) {
              const double x = double(to<mpopt::bfloat16>(g[i][k]));
              mean += x / terms;
              abs_sum += std::abs(x);
            }
            const double bound = 0.15 * (sd.clip_coef * roundings * u * abs_sum / terms +
                                         std::abs(sd.clip_coef - sl.clip_coef) * std::abs(mean)) +
                                 1e-6 * std::abs(double(ml[k])) + 1e-30;
            const double e = std::abs(double(md[k]) - double(ml[k]));
            bad += !(e <= bound);
            worst = std::max(worst, e / bound);
          }
        }
        CHECK_MESSAGE(bad == 0, bad << " exp_avg elements beyond their rounding bound; worst error / bound " << worst);
        if (world_rank() == 0 && doctest::getContextOptions()->success)
          MESSAGE(partition_name<Partition>() << " W=" << w << " A=" << a_steps << ": worst error / bound " << worst);
        for (int s = 1; s < 10; ++s) {
          CAPTURE(s);
          const auto [sd2, sl2] = boundary(d, l, ds.batch(s, terms), a_steps);
          check_status_same_on_every_rank(sd2);
          CHECK(sd2.result == mpopt::step_result::applied);
        }
        check_same_on_every_rank(d);
      }
    };
    run(mpopt::replicated{});
    run(mpopt::zero1{});
    run(mpopt::zero2{});
  }

  TEST_CASE_TEMPLATE(
      "an fp16 gradient sum that overflows across ranks skips the step; pre-divided by the world size it is "
      "applied, and equals the fp32-sent step bit for bit when W is a power of two",
      P, half_sums HOST_ONLY(half_sent)) {
    const int w = world_size();
    CAPTURE(w);
    const shape sh = random_shape(0xD1 + w);
    const mpopt::dynamic_scale_options so{.init_scale = 1024};
    // Every rank's scaled gradient lies in [35200, 41568] on fp16's grid of 32 there: two of them
    // overflow fp16 (65504); a W-th of each is exact for W = 2 and 4, and so is their sum.
    grads_t g;
    for (std::size_t n : sh.all()) {
      std::vector<double> t(n);
      for (std::size_t k = 0; k < n; ++k) t[k] = (k % 2 ? -1.0 : 1.0) * 32.0 * double(1100 + (k * 7 + n) % 200) / 1024;
      g.push_back(std::move(t));
    }
    auto run = [&]<class Partition>(Partition) {
      using D = mpopt::optimizer<P, mpopt::dynamic_scale, Partition, mpopt::adam, test_backend, mpopt::mpi>;
      using Ref = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, Partition, mpopt::adam, test_backend, mpopt::mpi>;
      CAPTURE(partition_name<Partition>());
      net<D> plain(layout::unfused, sh, 2, mpopt::mpi{MPI_COMM_WORLD}, small_buckets(), so);
      net<D> divided(layout::unfused, sh, 2, mpopt::mpi{MPI_COMM_WORLD}, small_buckets({.gradient_predivide = double(w)}), so);
      net<Ref> fp32_sent(layout::unfused, sh, 2, mpopt::mpi{MPI_COMM_WORLD}, small_buckets(), so);
      mpopt::step_status st[3];
      int k = 0;
      for (auto* n : {&plain, &divided}) {
        n->write(g);
        n->report_ready();
        st[k++] = n->opt.step();
      }
      fp32_sent.write(g);
      fp32_sent.report_ready();
      st[2] = fp32_sent.opt.step();
      CHECK(st[0].result == (w == 1 ? mpopt::step_result::applied : mpopt::step_result::skipped_nonfinite));
      CHECK(st[1].result == mpopt::step_result::applied);
      CHECK(st[2].result == mpopt::step_result::applied);
      if ((w & (w - 1)) == 0) {
        CHECK(st[1].grad_norm == st[2].grad_norm);
        const std::string diff = take(divided).difference(take(fp32_sent));
        CHECK_MESSAGE(diff.empty(), "the pre-divided fp16 step differs from the fp32-sent one: " << diff);
      } else {
        CHECK(std::abs(st[1].grad_norm - st[2].grad_norm) <= 1e-3 * st[2].grad_norm);
      }
      check_same_on_every_rank(divided);
    };
    run(mpopt::replicated{});
    run(mpopt::zero1{});
    run(mpopt::zero2{});
  }
}
