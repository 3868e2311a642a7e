// memory_report() under ZeRO, against the heap: what finalize() allocates on each rank equals what the
// report lists, steps allocate nothing, the model state per rank follows the ZeRO formulas for fp16
// Adam, and the gradient memory per rank shrinks as the world grows.
#include <doctest/doctest.h>

#include "counting_new.hpp"
#include "mpi_harness.hpp"

namespace {

std::size_t bytes_of(const mpopt::memory_report& r, const std::string& name) {
  std::size_t n = 0;
  for (const auto& b : r.buffers)
    if (b.name == name) n += b.bytes;
  return n;
}

const shape model{{1, 7, 300001, 4097, 20000}, {3, 65, 100000}};  // P = 428174

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE_TEMPLATE(
      "fp16 Adam under zero1 and zero2: finalize allocates exactly the reported bytes and steps none; per-rank "
      "model state is 4P + 12P/N (zero1) and 2P + 12P/N + the fp32 gradient shard 4P/N (zero2)",
      Z, mpopt::zero1, mpopt::zero2) {
    using D = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, Z, mpopt::adam, mpopt::host, mpopt::mpi>;
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    CAPTURE(Z::name);
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
    const std::size_t state = bytes_of(r, "master") + bytes_of(r, "exp_avg") + bytes_of(r, "exp_avg_sq");
    const double padding = 4.0 * 3 * (16.0 * model.all().size() + 2 * 16.0 * w) / w;
    CHECK(double(state) >= 12.0 * double(p) / w);
    CHECK(double(state) <= 12.0 * double(p) / w + padding);
    CHECK(bytes_of(r, "master") == bytes_of(r, "exp_avg"));
    // The reduced gradients of my shard, in fp32: 4P/N (the ZeRO paper counts 2P/N for fp16 ones).
    CHECK(bytes_of(r, "gradient shard") == bytes_of(r, "master"));
    CHECK(bytes_of(r, "gradient accumulator") == 0);  // no accumulation: nothing full-size is kept
    CHECK(bytes_of(r, "bucket") == 4u << 16);
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
