// memory_report() under ZeRO, against the heap: what finalize() allocates on each rank equals what the
// report lists, steps allocate nothing, the model state per rank follows the ZeRO formulas for fp16
// Adam, and the gradient memory per rank shrinks as the world grows.
#include <doctest/doctest.h>

#include "counting_new.hpp"
#include "mpi_harness.hpp"

namespace {

const shape model{{1, 7, 300001, 4097, 20000}, {3, 65, 100000}};  // P = 428174

using half_sums = mpopt::mixed_precision<mpopt::half, mpopt::half, mpopt::half>;

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE_TEMPLATE(
      "fp16 Adam under zero1 and zero2: finalize allocates exactly the reported bytes and steps none; per-rank "
      "model state is 4P + 12P/N (zero1) and 2P + 14P/N (zero2) with 16-bit gradient sums, 4P/N (zero1) and 2P/N "
      "(zero2) more with fp32 ones",
      C, cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::unfused, mpopt::zero1>,
      cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::unfused, mpopt::zero2>,
      cfg<half_sums, mpopt::dynamic_scale, mpopt::adam, layout::unfused, mpopt::zero1>,
      cfg<half_sums, mpopt::dynamic_scale, mpopt::adam, layout::unfused, mpopt::zero2>) {
    using D = typename C::dist;
    using Z = typename C::partition;
    constexpr bool sixteen_bit = std::is_same_v<typename D::accumulate_type, mpopt::half>;
    const int w = world_size(), rank = world_rank();
    const std::string what = C::describe() + (sixteen_bit ? " (16-bit sums)" : " (fp32 sums)");
    CAPTURE(what);
    CAPTURE(w);
    std::size_t p = 0;
    for (std::size_t n : model.all()) p += n;
    net<D> n(layout::unfused, model, 1, mpopt::mpi{MPI_COMM_WORLD}, mpopt::optimizer_options{.bucket_elements = 1 << 16},
             mpopt::dynamic_scale_options{.init_scale = 1024});
    const long long added = live_bytes_added_by([&] { n.opt.finalize(); });
    const mpopt::memory_report r = n.opt.memory_report();
    CHECK(added == static_cast<long long>(r.owned_bytes()));
    if (rank == 0 && doctest::getContextOptions()->success) MESSAGE(r.to_string());

    const dataset ds{0x3E3, model.all(), true};
    for (int s = 0; s < 3; ++s) {
      n.write(ds.micro_batch(s, rank));
      mpopt::step_status st;
      const long long during = live_bytes_added_by([&] {
        n.report_ready();
        st = n.opt.step();
      });
      CHECK(st.applied);
      CHECK(during == 0);
    }

    // The user's 16-bit parameters and gradients: 2P each, whole on every rank.
    CHECK(bytes_of(r, "parameters") == 2 * p);
    CHECK(bytes_of(r, "gradients") == 2 * p);
    // Master and two moments for my shard: 12P/N, plus this rank's share of the alignment padding
    // (every tensor starts on 16 floats, every group splits into N shards of 16-float multiples).
    const double shard = double(p) / w, padding = (16.0 * model.all().size() + 2 * 16.0 * w) / w;
    const std::size_t state = bytes_of(r, "master") + bytes_of(r, "exp_avg") + bytes_of(r, "exp_avg_sq");
    CHECK(double(state) >= 12 * shard);
    CHECK(double(state) <= 12 * (shard + padding));
    CHECK(bytes_of(r, "master") == bytes_of(r, "exp_avg"));
    // The reduced gradients of my shard: zero1 with 16-bit sums keeps them in the gradient tensors
    // (as DeepSpeed does), zero2 in a 16-bit shard (2P/N); fp32 sums need an fp32 shard (4P/N).
    const std::size_t shard_bytes = bytes_of(r, "gradient shard");
    if (sixteen_bit && !Z::reduce_every_micro_step) CHECK(shard_bytes == 0);
    else CHECK(shard_bytes == bytes_of(r, "master") / (sixteen_bit ? 2 : 1));
    CHECK(bytes_of(r, "gradient accumulator") == 0);  // no accumulation: nothing full-size is kept
    // ZeRO's model state: 16-bit params, zero1 also the full 16-bit gradients, 12P/N, the shard.
    const double model_state = double(bytes_of(r, "parameters") + (Z::reduce_every_micro_step ? 0 : bytes_of(r, "gradients")) +
                                      state + shard_bytes);
    const double paper = Z::reduce_every_micro_step ? 2.0 * double(p) + 14 * shard : 4.0 * double(p) + 12 * shard;
    // fp32 sums: an fp32 shard instead of a 16-bit one (zero2) or of none (zero1).
    const double extra = sixteen_bit ? 0 : (Z::reduce_every_micro_step ? 2 : 4) * shard;
    CHECK(model_state >= paper + extra);
    CHECK(model_state <= paper + extra + 16 * padding);
    // The named transients: one bucket (sent as fp32 or fp16; it also gathers the fp16 params) and
    // my piece of it when it cannot land in the shard directly.
    CHECK(bytes_of(r, "bucket") == (sixteen_bit ? 2u : 4u) << 16);
    if (sixteen_bit && !Z::reduce_every_micro_step) CHECK(bytes_of(r, "received piece") > 0);
  }

  TEST_CASE_TEMPLATE(
      "replicated with gradients summed or sent in bf16: finalize allocates exactly the reported bytes, steps none",
      P, mpopt::bf16, mpopt::mixed_precision<mpopt::bfloat16, float, mpopt::bfloat16>,
      mpopt::mixed_precision<mpopt::bfloat16, mpopt::bfloat16, mpopt::bfloat16>) {
    using D = mpopt::optimizer<P, mpopt::no_scaling, mpopt::replicated, mpopt::adam, mpopt::host, mpopt::mpi>;
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    std::size_t p = 0;
    for (std::size_t n : model.all()) p += n;
    net<D> n(layout::unfused, model, 1, mpopt::mpi{MPI_COMM_WORLD},
             mpopt::optimizer_options{.accumulation_steps = 2, .bucket_elements = 1 << 16});
    const long long added = live_bytes_added_by([&] { n.opt.finalize(); });
    const mpopt::memory_report r = n.opt.memory_report();
    CHECK(added == static_cast<long long>(r.owned_bytes()));
    const dataset ds{0x5E5, model.all(), true};
    const long long during = live_bytes_added_by([&] {
      for (int a = 0; a < 2; ++a) {
        n.write(ds.micro_batch(0, 2 * rank + a));
        n.opt.step();
      }
    });
    CHECK(during == 0);
    constexpr std::size_t accum = sizeof(typename D::accumulate_type), sent = sizeof(typename D::communicate_type);
    CHECK(bytes_of(r, "gradient accumulator") >= accum * p);
    // Converting for the all-reduce takes one bucket of the communication type.
    CHECK(bytes_of(r, "bucket") == (w > 1 && accum != sent ? sent << 16 : 0));
  }

  TEST_CASE_TEMPLATE(
      "overlap_comm: finalize allocates exactly the reported bytes, one staging slot per bucket in flight; once the "
      "first step has started as many collectives at once as ever, steps allocate nothing",
      P, mpopt::zero1, mpopt::zero2, mpopt::replicated) {
    using D = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, P, mpopt::adam, mpopt::host, mpopt::mpi>;
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    constexpr int slots = 3;
    // bf16 summed in bf16: replicated converts too, into its slots.
    using bf16_sums = mpopt::mixed_precision<mpopt::bfloat16, float, mpopt::bfloat16>;
    using R = std::conditional_t<std::is_same_v<P, mpopt::replicated>,
                                 mpopt::optimizer<bf16_sums, mpopt::no_scaling, P, mpopt::adam, mpopt::host, mpopt::mpi>, D>;
    net<R> n(layout::unfused, model, 1, mpopt::mpi{MPI_COMM_WORLD},
             mpopt::optimizer_options{.bucket_elements = 1 << 16, .overlap_comm = true, .buckets_in_flight = slots});
    const long long added = live_bytes_added_by([&] { n.opt.finalize(); });
    const mpopt::memory_report r = n.opt.memory_report();
    CHECK(added == static_cast<long long>(r.owned_bytes()));
    const std::size_t bucket = std::is_same_v<P, mpopt::replicated> ? (w > 1 ? 2 << 16 : 0) : 4 << 16;
    CHECK(bytes_of(r, std::is_same_v<P, mpopt::replicated> && w == 1 ? "bucket" : "buckets") == slots * bucket);
    const dataset ds{0x0E4, model.all(), true};
    for (int s = 0; s < 3; ++s) {
      n.write(ds.micro_batch(s, rank));
      const long long during = live_bytes_added_by([&] {
        n.report_ready();
        CHECK(n.opt.step().applied);
        n.opt.wait_params();
      });
      if (s > 0) CHECK(during == 0);
    }
  }

  TEST_CASE_TEMPLATE(
      "save() under ZeRO holds one gathered tensor at a time and load() reads only its part: neither comes near the "
      "12 bytes per parameter of the whole state",
      Z, mpopt::zero1, mpopt::zero2) {
    using D = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, Z, mpopt::adam, mpopt::host, mpopt::mpi>;
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    std::size_t p = 0, largest = 0;
    for (std::size_t n : model.all()) {
      p += n;
      largest = std::max(largest, n);
    }
    net<D> n(layout::unfused, model, 1, mpopt::mpi{MPI_COMM_WORLD}, mpopt::optimizer_options{.bucket_elements = 1 << 16},
             mpopt::dynamic_scale_options{.init_scale = 1024});
    const dataset ds{0x5A7E, model.all(), true};
    n.write(ds.micro_batch(0, rank));
    n.report_ready();
    CHECK(n.opt.step().applied);
    const shared_dir dir;
    // The header (names, shapes, metadata) is a few KiB; the file reader checksums in 1 MiB blocks.
    const long long slack = 256 << 10, whole_state = 12 * (long long)p;
    const long long saving = peak_bytes_added_by([&] { n.opt.save(dir / "state.safetensors"); });
    CAPTURE(saving);
    CHECK(saving <= 4 * (long long)largest + slack);  // one fp32 tensor, gathered
    CHECK(saving < whole_state / 3);
    const long long loading = peak_bytes_added_by([&] { n.opt.load(dir / "state.safetensors"); });
    CAPTURE(loading);
    CHECK(loading <= (1 << 20) + slack);
    CHECK(loading < whole_state / 3);
  }

  TEST_CASE("the gradient memory per rank shrinks as the world grows (zero2), and zero1 accumulation is full-size") {
    using D2 = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::zero2, mpopt::adam, mpopt::host, mpopt::mpi>;
    using D1 = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::zero1, mpopt::adam, mpopt::host, mpopt::mpi>;
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    std::vector<std::size_t> shard_bytes;
    for (int size = 1; size <= w; size *= 2) {
      if (w % size != 0) continue;
      MPI_Comm sub;
      MPI_Comm_split(MPI_COMM_WORLD, rank / size, rank, &sub);
      {
        const mpopt::optimizer_options o{.accumulation_steps = 2, .bucket_elements = 1 << 16};
        net<D2> z2(layout::unfused, model, 1, mpopt::mpi{sub}, o);
        net<D1> z1(layout::unfused, model, 1, mpopt::mpi{sub}, o);
        z2.opt.finalize();
        z1.opt.finalize();
        const auto r2 = z2.opt.memory_report(), r1 = z1.opt.memory_report();
        shard_bytes.push_back(bytes_of(r2, "gradient shard") + bytes_of(r2, "gradient accumulator"));
        CHECK(bytes_of(r2, "gradient accumulator") == 0);
        CHECK(bytes_of(r2, "received piece") > 0);  // accumulation adds each reduced piece in
        // zero1 folds micro-steps locally before one reduction: a full-size fp32 accumulator.
        std::size_t p = 0;
        for (std::size_t n : model.all()) p += n;
        CHECK(bytes_of(r1, "gradient accumulator") >= 4 * p);
      }
      MPI_Comm_free(&sub);
    }
    for (std::size_t i = 1; i < shard_bytes.size(); ++i) {
      CAPTURE(i);
      CHECK(shard_bytes[i] < shard_bytes[i - 1]);
      CHECK(shard_bytes[i] * 2 <= shard_bytes[i - 1] + 64 * 2 * 4);  // halves, up to the padding
    }
  }
}
