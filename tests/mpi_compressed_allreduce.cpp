// The error-compensated 1-bit all-reduce (mpopt::compressed_allreduce) on W MPI ranks, against the
// float64 simulation of onebit_reference.hpp (written from docs/design.md §3.7, not from the
// library): W workers and W servers in one process, rounding to float where the algorithm keeps
// fp32 buffers. Several rounds, so the error feedback is exercised; sizes 0, 1,
// and ones that are not multiples of 8 W or that span several 64 Ki-element chunks.
#include <doctest/doctest.h>

#include "mpi_harness.hpp"
#include "onebit_reference.hpp"

namespace {

/// Rank r's vector in round k: uniform noise whose amplitude differs per rank and along the vector.
std::vector<float> input(std::size_t n, int round, int r, std::uint64_t seed) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = float(unit(key(seed, std::uint64_t(round), std::uint64_t(r), i)) * (1.0 + r) * (i % 3 == 0 ? 4.0 : 0.5));
  return x;
}

/// Every rank's copy of a per-rank vector.
std::vector<std::vector<double>> gather_all(std::span<const float> mine) {
  const int w = world_size();
  std::vector<float> all(mine.size() * std::size_t(w));
  MPI_Allgather(mine.data(), int(mine.size()), MPI_FLOAT, all.data(), int(mine.size()), MPI_FLOAT, MPI_COMM_WORLD);
  std::vector<std::vector<double>> out(static_cast<std::size_t>(w));
  for (int r = 0; r < w; ++r) out[std::size_t(r)].assign(all.begin() + std::ptrdiff_t(r * mine.size()),
                                                          all.begin() + std::ptrdiff_t((r + 1) * mine.size()));
  return out;
}

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE(
      "the compressed all-reduce equals a float64 simulation of the algorithm over several rounds: the average, "
      "every rank's worker error and its server error; sizes 0, 1, odd, and beyond one 64 Ki chunk") {
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(8), std::size_t(13),
                          std::size_t(1001), std::size_t(70001)}) {
      CAPTURE(n);
      counting_mpi comm{MPI_COMM_WORLD};
      mpopt::compressed_allreduce<test_backend> ar(n, w, rank);
      test_backend backend;
      ref::compressed_sim sim(std::size_t(w), n);
      CHECK(ar.padded_size() == sim.padded);
      CHECK(ar.padded_size() % (8 * std::size_t(w)) == 0);
      CHECK(ar.padded_size() - n < 8 * std::size_t(w));
      std::size_t compared = 0, mismatched = 0, result_errors = 0, error_errors = 0;
      for (int round = 0; round < 5; ++round) {
        CAPTURE(round);
        std::vector<std::vector<double>> xs;
        for (int r = 0; r < w; ++r) {
          const auto xr = input(n, round, r, 0xC0DE + n);
          xs.emplace_back(xr.begin(), xr.end());
        }
        std::vector<float> x = input(n, round, rank, 0xC0DE + n);
        const std::size_t before = comm.bytes;
        ar.average(comm, backend, x);
        CHECK(comm.bytes - before == ar.bytes_per_exchange());
        sim.run(xs);
        double largest = 0;
        for (double v : sim.result) largest = std::max(largest, std::fabs(v));
        // The library stores x + error, the errors and the scales in fp32 (the simulation keeps
        // float64): values agree to float rounding, which the errors carry from round to round.
        const double rel = 2e-5, tol = rel * largest * (round + 1);
        for (std::size_t i = 0; i < n; ++i) {
          if (sim.tie[i]) continue;
          ++compared;
          if (std::fabs(double(x[i]) - sim.result[i]) > rel * std::fabs(sim.result[i])) ++result_errors;
          if ((x[i] >= 0) != (sim.result[i] >= 0)) ++mismatched;
        }
        for (std::size_t i = 0; i < sim.padded; ++i)
          if (!sim.tie[i] && std::fabs(double(ar.worker_error()[i]) - sim.worker_error[std::size_t(rank)][i]) > tol)
            ++error_errors;
        for (std::size_t i = 0; i < sim.chunk; ++i)
          if (!sim.tie[std::size_t(rank) * sim.chunk + i] &&
              std::fabs(double(ar.server_error()[i]) - sim.server_error[std::size_t(rank)][i]) > tol)
            ++error_errors;
      }
      // Signs decided within float rounding of zero are left out of the comparison; the padding's
      // first signs are such (zeros), real data's are rare.
      const auto ties = std::size_t(std::count(sim.tie.begin(), sim.tie.begin() + std::ptrdiff_t(n), char(1)));
      CHECK(mismatched == 0);
      CHECK(result_errors == 0);
      CHECK(error_errors == 0);
      CHECK(ties * 1000 <= n);
      if (n > 0) CHECK(compared > 0);
    }
  }

  TEST_CASE(
      "with segments, each has its own scales (the worker's over its elements, the server's over its piece of the "
      "chunk) and equals the float64 simulation over several rounds: averages, worker and server errors; the padding "
      "between segments takes no part; segments of 0, 1 and odd sizes, and beyond one 64 Ki chunk") {
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    const std::vector<std::vector<std::size_t>> layouts{{0}, {1}, {13, 0, 1, 7}, {70001, 5, 1000}, {3, 40000, 2}};
    for (const auto& sizes : layouts) {
      CAPTURE(sizes.size());
      CAPTURE(sizes.front());
      mpopt::mpi comm{MPI_COMM_WORLD};
      mpopt::compressed_allreduce<test_backend> ar(std::span<const std::size_t>(sizes), w, rank);
      test_backend backend;
      ref::compressed_sim sim(std::size_t(w), sizes);
      REQUIRE(ar.padded_size() == sim.padded);
      REQUIRE(ar.segments() == sizes.size());
      for (std::size_t k = 0; k < sizes.size(); ++k) CHECK(ar.segment_start(k) == sim.starts[k]);
      CHECK(ar.padded_size() % (16 * std::size_t(w)) == 0);
      CHECK_THROWS_AS(ar.average(comm, backend, std::span<float>()), mpopt::error);
      std::size_t compared = 0, off = 0;
      for (int round = 0; round < 4; ++round) {
        CAPTURE(round);
        std::vector<std::vector<double>> xs;
        for (int r = 0; r < w; ++r) {
          const auto xr = input(sim.n, round, r, 0x5E6 + sim.n);
          xs.emplace_back(xr.begin(), xr.end());
        }
        // The caller adds its vector into the worker error at each element's place, and sums the squares per segment.
        const std::vector<float> x = input(sim.n, round, rank, 0x5E6 + sim.n);
        std::vector<double> sums(sizes.size(), 0.0);
        for (std::size_t k = 0, i = 0; k < sizes.size(); ++k)
          for (std::size_t j = 0; j < sizes[k]; ++j, ++i) {
            float& e = ar.worker_error()[sim.place(i)];
            e += x[i];
            sums[k] += double(e) * double(e);
          }
        ar.exchange(comm, backend, sums);
        sim.run(xs);
        const auto code = ar.result();
        double largest = 0;
        for (double v : sim.result) largest = std::max(largest, std::fabs(v));
        const double tol = 2e-5 * largest * (round + 1);
        for (std::size_t k = 0, i = 0; k < sizes.size(); ++k)
          for (std::size_t j = 0; j < sizes[k]; ++j, ++i) {
            if (sim.tied_at(i)) continue;
            ++compared;
            const std::size_t at = sim.place(i);
            const float got = code.scale_of(k, at) * ((code.bits[at / 8] >> (at % 8)) & 1 ? 1.0f : -1.0f);
            off += std::fabs(double(got) - sim.average(i)) > 2e-5 * std::fabs(sim.average(i));
            off += std::fabs(double(ar.worker_error()[at]) - sim.worker_error[std::size_t(rank)][at]) > tol;
          }
        for (std::size_t j = 0; j < sim.chunk; ++j) {
          const std::size_t at = std::size_t(rank) * sim.chunk + j;
          if (!sim.tie[at]) off += std::fabs(double(ar.server_error()[j]) - sim.server_error[std::size_t(rank)][j]) > tol;
        }
      }
      // Places outside every segment never change.
      std::vector<char> inside(sim.padded, 0);
      for (std::size_t i = 0; i < sim.n; ++i) inside[sim.place(i)] = 1;
      std::size_t touched = 0;
      for (std::size_t at = 0; at < sim.padded; ++at) touched += !inside[at] && ar.worker_error()[at] != 0.0f;
      CHECK(touched == 0);
      CHECK(off == 0);
      if (sim.n > 0) CHECK(compared * 1000 >= sim.n * 999);
    }
  }

  TEST_CASE(
      "error feedback keeps the sum exact: over K rounds, the sum of the results equals the sum of the true "
      "averages minus the mean worker error and the server error left at the end") {
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    const std::size_t n = 5003;
    mpopt::mpi comm{MPI_COMM_WORLD};
    mpopt::compressed_allreduce<test_backend> ar(n, w, rank);
    test_backend backend;
    std::vector<double> results(n, 0.0), averages(n, 0.0);
    double scales = 0;
    for (int round = 0; round < 12; ++round) {
      std::vector<float> x = input(n, round, rank, 0xFEED);
      for (int r = 0; r < w; ++r) {
        const auto xr = input(n, round, r, 0xFEED);
        for (std::size_t i = 0; i < n; ++i) averages[i] += double(xr[i]) / w;
      }
      ar.average(comm, backend, x);
      double largest = 0;
      for (std::size_t i = 0; i < n; ++i) {
        results[i] += x[i];
        largest = std::max(largest, std::fabs(double(x[i])));
      }
      scales += largest;
    }
    const auto worker = gather_all(ar.worker_error());
    const auto server = gather_all(ar.server_error());
    std::size_t off = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double mean_worker = 0;
      for (const auto& e : worker) mean_worker += e[i] / w;
      const double left = mean_worker + server[i / ar.chunk_size()][i % ar.chunk_size()];
      if (std::fabs(results[i] - (averages[i] - left)) > 1e-5 * scales) ++off;
    }
    CHECK(off == 0);
  }

  TEST_CASE("an exchange whose all-gather fails resumes with finish() and gives the uninterrupted result") {
    const int w = world_size(), rank = world_rank();
    const std::size_t n = 3000;
    counting_mpi broken{MPI_COMM_WORLD}, clean{MPI_COMM_WORLD};
    mpopt::compressed_allreduce<test_backend> a(n, w, rank), b(n, w, rank);
    test_backend backend;
    for (int round = 0; round < 3; ++round) {
      CAPTURE(round);
      const std::vector<float> x = input(n, round, rank, 0xABC);
      for (std::size_t i = 0; i < n; ++i) {
        a.worker_error()[i] += x[i];
        b.worker_error()[i] += x[i];
      }
      double sumsq = 0;
      for (std::size_t i = 0; i < n; ++i) sumsq += double(a.worker_error()[i]) * a.worker_error()[i];
      a.compress_worker(backend, {&sumsq, 1});
      broken.fail_gather_at = broken.gathers + (round == 1 ? 2 : 0);  // phase 2, or phase 1
      CHECK_THROWS_AS(a.finish(broken, backend), mpopt::error);
      CHECK(a.pending());
      a.finish(broken, backend);
      CHECK_FALSE(a.pending());
      b.exchange(clean, backend, {&sumsq, 1});
      std::vector<float> ra(n), rb(n);
      for (std::size_t i = 0; i < n; ++i) {
        ra[i] = a.result().scale_of(0, i) * ((a.result().bits[i / 8] >> (i % 8)) & 1 ? 1.0f : -1.0f);
        rb[i] = b.result().scale_of(0, i) * ((b.result().bits[i / 8] >> (i % 8)) & 1 ? 1.0f : -1.0f);
      }
      CHECK(ra == rb);
      CHECK(std::equal(a.worker_error().begin(), a.worker_error().end(), b.worker_error().begin()));
      CHECK(std::equal(a.server_error().begin(), a.server_error().end(), b.server_error().begin()));
    }
  }
}
