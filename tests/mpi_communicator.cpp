// The MPI communicator: every collective against values each rank can compute on its own, for every
// element type the optimizer sends; size errors throw on every rank before anything is sent.
#include <doctest/doctest.h>

#include <mpopt/mpi.hpp>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace {

struct world {
  mpopt::mpi comm{MPI_COMM_WORLD};
  int rank = comm.rank();
  int size = comm.size();
};

/// A value of element i as rank r would contribute it: small integers, exact in every type.
float value(int r, std::size_t i) { return float((r + 1) * 3 + int(i % 7)); }

template <class T>
void check_all_reduce() {
  world w;
  std::vector<T> sum(37), max(37);
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = max[i] = T(value(w.rank, i));
  w.comm.all_reduce(std::span<T>(sum), mpopt::reduce_op::sum);
  w.comm.all_reduce(std::span<T>(max), mpopt::reduce_op::max);
  for (std::size_t i = 0; i < sum.size(); ++i) {
    float expected_sum = 0, expected_max = 0;
    for (int r = 0; r < w.size; ++r) {
      expected_sum += value(r, i);
      expected_max = std::max(expected_max, value(r, i));
    }
    CHECK(float(sum[i]) == expected_sum);
    CHECK(float(max[i]) == expected_max);
  }
}

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE("rank and size describe MPI_COMM_WORLD") {
    world w;
    int rank = -1, size = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    CHECK(w.rank == rank);
    CHECK(w.size == size);
  }

  TEST_CASE("all_reduce sums and maxes float, double, uint8, int64, half and bfloat16") {
    check_all_reduce<float>();
    check_all_reduce<double>();
    check_all_reduce<std::int64_t>();
    check_all_reduce<mpopt::half>();
    check_all_reduce<mpopt::bfloat16>();
    world w;
    std::vector<std::uint8_t> flag{std::uint8_t(w.rank == w.size - 1 ? 1 : 0)};
    w.comm.all_reduce(std::span<std::uint8_t>(flag), mpopt::reduce_op::max);
    CHECK(flag[0] == 1);  // one rank's overflow reaches every rank
  }

  TEST_CASE("reduce_scatter gives each rank its block of the sum") {
    world w;
    const std::size_t block = 5;
    std::vector<float> in(block * std::size_t(w.size)), out(block);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(w.rank, i);
    w.comm.reduce_scatter(std::span<const float>(in), std::span<float>(out), mpopt::reduce_op::sum);
    for (std::size_t j = 0; j < block; ++j) {
      float expected = 0;
      for (int r = 0; r < w.size; ++r) expected += value(r, std::size_t(w.rank) * block + j);
      CHECK(out[j] == expected);
    }
  }

  TEST_CASE("all_gather puts rank r's block at r, all_to_all sends block j to rank j") {
    world w;
    const std::size_t block = 3;
    std::vector<mpopt::half> mine(block), gathered(block * std::size_t(w.size));
    for (std::size_t i = 0; i < block; ++i) mine[i] = mpopt::half(value(w.rank, i));
    w.comm.all_gather(std::span<const mpopt::half>(mine), std::span<mpopt::half>(gathered));
    for (int r = 0; r < w.size; ++r)
      for (std::size_t i = 0; i < block; ++i) CHECK(float(gathered[std::size_t(r) * block + i]) == value(r, i));

    std::vector<float> send(block * std::size_t(w.size)), recv(send.size());
    for (int j = 0; j < w.size; ++j)
      for (std::size_t i = 0; i < block; ++i) send[std::size_t(j) * block + i] = float(w.rank * 100 + j * 10) + float(i);
    w.comm.all_to_all(std::span<const float>(send), std::span<float>(recv));
    for (int r = 0; r < w.size; ++r)
      for (std::size_t i = 0; i < block; ++i)
        CHECK(recv[std::size_t(r) * block + i] == float(r * 100 + w.rank * 10) + float(i));
  }

  TEST_CASE("broadcast copies the root's data to every rank; barrier returns") {
    world w;
    const int root = w.size - 1;
    std::vector<double> data(4, double(w.rank));
    w.comm.broadcast(std::span<double>(data), root);
    for (double x : data) CHECK(x == double(root));
    w.comm.barrier();
  }

  TEST_CASE("mismatched sizes and bad roots throw mpopt::error on every rank before sending") {
    world w;
    std::vector<float> in(4 * std::size_t(w.size) + 1), out(4);
    CHECK_THROWS_AS(w.comm.reduce_scatter(std::span<const float>(in), std::span<float>(out), mpopt::reduce_op::sum),
                    mpopt::error);
    std::vector<float> small(3), gathered(3 * std::size_t(w.size) + 2);
    CHECK_THROWS_AS(w.comm.all_gather(std::span<const float>(small), std::span<float>(gathered)), mpopt::error);
    std::vector<float> odd(std::size_t(w.size) + (w.size > 1 ? 1 : 0)), odd_out(odd.size());
    if (w.size > 1)
      CHECK_THROWS_AS(w.comm.all_to_all(std::span<const float>(odd), std::span<float>(odd_out)), mpopt::error);
    CHECK_THROWS_AS(w.comm.broadcast(std::span<float>(out), w.size), mpopt::error);
    CHECK_THROWS_AS(mpopt::mpi(MPI_COMM_NULL), mpopt::error);
    w.comm.barrier();  // every rank is still in step
  }

  TEST_CASE("started collectives give the blocking calls' bits, several in flight at once, waited in any order") {
    for (const bool deterministic : {false, true}) {
      CAPTURE(deterministic);
      mpopt::mpi comm(MPI_COMM_WORLD, {.deterministic = deterministic});
      const int w = comm.size(), rank = comm.rank();
      // Deterministic sums are rank-ordered either way: any values. Otherwise integers, exact in any order.
      auto x = [&](int r, std::size_t i) {
        return deterministic ? 1.0f / float(3 + r) + float(i) * 1e-3f : value(r, i);
      };
      const std::vector<std::size_t> counts = [&] {
        std::vector<std::size_t> c;
        for (int r = 0; r < w; ++r) c.push_back(std::size_t(r % 3 == 1 ? 0 : 5 + 2 * r));  // some ranks get none
        return c;
      }();
      const std::size_t n = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
      std::vector<float> sum(n + 3), in(n), gathered(n);
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = x(rank, i);
      for (std::size_t i = 0; i < n; ++i) in[i] = x(rank, i);
      const std::size_t mine = counts[std::size_t(rank)];
      const std::size_t at = std::accumulate(counts.begin(), counts.begin() + rank, std::size_t{0});
      std::vector<float> piece(mine);
      for (std::size_t i = 0; i < mine; ++i) gathered[at + i] = x(rank, i + 100);
      auto expect_sum = sum, expect_piece = piece, expect_gathered = gathered;
      comm.all_reduce(std::span<float>(expect_sum), mpopt::reduce_op::sum);
      comm.reduce_scatter(std::span<const float>(in), std::span<float>(expect_piece), std::span<const std::size_t>(counts),
                          mpopt::reduce_op::sum);
      comm.all_gather(std::span<float>(expect_gathered), std::span<const std::size_t>(counts));

      auto a = comm.start_all_reduce(std::span<float>(sum), mpopt::reduce_op::sum);
      auto b = comm.start_reduce_scatter(std::span<const float>(in), std::span<float>(piece),
                                         std::span<const std::size_t>(counts), mpopt::reduce_op::sum);
      auto c = comm.start_all_gather(std::span<float>(gathered), std::span<const std::size_t>(counts));
      c.wait();  // the last first
      while (!b.test()) {
      }
      a.wait();
      CHECK(a.test());
      CHECK(sum == expect_sum);
      CHECK(piece == expect_piece);
      CHECK(gathered == expect_gathered);
      CHECK(mpopt::mpi::request{}.test());  // a default request is complete
      // A bad count throws on every rank before anything starts.
      const std::vector<std::size_t> wrong(std::size_t(w), 1);
      CHECK_THROWS_AS(comm.start_all_gather(std::span<float>(gathered), std::span<const std::size_t>(wrong)),
                      mpopt::error);
    }
  }

  TEST_CASE("the communicator works on a sub-communicator, e.g. a data-parallel group") {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm half_world;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half_world);
    {
      mpopt::mpi comm(half_world);
      std::vector<float> x{1.0f};
      comm.all_reduce(std::span<float>(x), mpopt::reduce_op::sum);
      CHECK(x[0] == float(comm.size()));
    }
    MPI_Comm_free(&half_world);
  }
}
