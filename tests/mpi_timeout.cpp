// The MPI communicator's timeout (mpi_options::timeout), under mpirun -np 2: a collective that a rank
// does not join throws mpopt::error on the others once the timeout has passed, naming the call and
// the rank, and leaves that communicator unusable; with every rank joining, the collectives give
// the bits they give without a timeout; an optimizer whose rank skips a step() reports it.
//
// In the cases where a rank stays away, "early" ranks call and time out while the last rank
// ("late") waits on MPI_COMM_WORLD, a different communicator from mpopt::mpi's duplicate. Where it
// can, the late rank then joins the abandoned collective, so that it completes rather than stays
// pending; the optimizer case, last, leaves one pending (it explains why that is safe here).
#include <doctest/doctest.h>

#include <mpopt/mpi.hpp>
#include <mpopt/mpopt.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mpi_world.hpp"
#include "temp_dir.hpp"

using namespace std::chrono_literals;

namespace {

constexpr std::chrono::milliseconds timeout = 300ms;
// How late past the timeout a timed-out collective may throw: generous, for a loaded machine.
constexpr std::chrono::milliseconds margin = 5s;
// A collective on an unusable communicator throws at once: well under the timeout.
constexpr std::chrono::milliseconds at_once = 100ms;

using steady = std::chrono::steady_clock;

bool is_late() { return world_rank() == world_size() - 1; }

/// The message f throws as mpopt::error (empty if it throws nothing), and how long it took.
struct thrown {
  std::string message;
  steady::duration took{};
};
template <class F>
thrown time_error(F&& f) {
  thrown t;
  const auto start = steady::now();
  try {
    f();
  } catch (const mpopt::error& e) {
    t.message = e.what();
  }
  t.took = steady::now() - start;
  return t;
}

std::string rank_of_world() {
  return "rank " + std::to_string(world_rank()) + " of " + std::to_string(world_size());
}

/// Checks an early rank's error: `call` timed out, it said so in time, and the communicator now
/// refuses every collective at once.
void check_timed_out(const thrown& t, const std::string& call, std::chrono::milliseconds limit, mpopt::mpi& comm) {
  CAPTURE(t.message);
  CHECK(t.message.find("mpi: " + call + " did not complete within " + std::to_string(limit.count()) + " ms on " +
                       rank_of_world()) != std::string::npos);
  CHECK(t.message.find("unusable") != std::string::npos);
  CHECK(t.took >= limit);
  CHECK(t.took < limit + margin);
  const std::string unusable = "unusable after a timeout in " + call;
  std::vector<float> x(4, 1.0f);
  for (const thrown& later : {time_error([&] { comm.barrier(); }),
                              time_error([&] { comm.all_reduce(std::span<float>(x), mpopt::reduce_op::sum); }),
                              time_error([&] { comm.broadcast(std::span<float>(x), 0); })}) {
    CAPTURE(later.message);
    CHECK(later.message.find(unusable) != std::string::npos);
    CHECK(later.took < at_once);
  }
}

/// Buffers that live until the program exits: a collective that timed out may still complete when
/// its late rank joins, after the test case that started it has moved on.
std::vector<float>& kept(std::size_t n) {
  static std::deque<std::vector<float>> buffers;
  return buffers.emplace_back(n, float(world_rank() + 1));
}

/// One collective, as each early rank calls it and the late rank later joins it.
struct collective {
  std::string call;  // what MPI names it
  bool deterministic;
  std::function<void(mpopt::mpi&)> run;
};

std::vector<collective> every_collective() {
  const std::size_t w = std::size_t(world_size());
  const std::vector<std::size_t> counts(w, 2);
  const auto sum = mpopt::reduce_op::sum;
  return {
      {"MPI_Allreduce", false, [=](mpopt::mpi& c) { c.all_reduce(std::span<float>(kept(8)), sum); }},
      {"MPI_Reduce_scatter_block", false,
       [=](mpopt::mpi& c) { c.reduce_scatter(std::span<const float>(kept(2 * w)), std::span<float>(kept(2)), sum); }},
      {"MPI_Reduce_scatter", false,
       [=](mpopt::mpi& c) {
         c.reduce_scatter(std::span<const float>(kept(2 * w)), std::span<float>(kept(2)),
                          std::span<const std::size_t>(counts), sum);
       }},
      // Deterministic: the rank-ordered reduce-scatter, an all-to-all and a local sum.
      {"MPI_Alltoallv", true,
       [=](mpopt::mpi& c) {
         c.reduce_scatter(std::span<const float>(kept(2 * w)), std::span<float>(kept(2)),
                          std::span<const std::size_t>(counts), sum);
       }},
      {"MPI_Allgatherv", false,
       [=](mpopt::mpi& c) { c.all_gather(std::span<float>(kept(2 * w)), std::span<const std::size_t>(counts)); }},
      {"MPI_Allgather", false,
       [=](mpopt::mpi& c) { c.all_gather(std::span<const float>(kept(2)), std::span<float>(kept(2 * w))); }},
      {"MPI_Alltoall", false,
       [=](mpopt::mpi& c) { c.all_to_all(std::span<const float>(kept(2 * w)), std::span<float>(kept(2 * w))); }},
      // From the late rank: the others cannot finish without it.
      {"MPI_Bcast", false, [=](mpopt::mpi& c) { c.broadcast(std::span<float>(kept(4)), int(w) - 1); }},
      {"MPI_Barrier", false, [](mpopt::mpi& c) { c.barrier(); }},
  };
}

// ------------------------------------------------------------ every collective, with and without

/// Rank r's element i: small integers, whose sums are exact in every type and order.
float value(int r, std::size_t i) { return float((r + 1) * 3 + int(i % 7)); }

template <class T>
std::vector<T> values(int r, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(value(r, i));
  return v;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// Every collective on `plain` (no timeout) and on `timed`, from the same inputs: the same bits,
/// and the values expected.
template <class T>
void check_same_results(mpopt::mpi& plain, mpopt::mpi& timed) {
  const int w = plain.size(), rank = plain.rank();
  const std::size_t n = 3 * std::size_t(w) + 5;  // not a multiple of W: uneven pieces
  auto both = [&](const char* what, auto&& f) {
    CAPTURE(what);
    const std::vector<T> a = f(plain), b = f(timed);
    CHECK(same_bits(a, b));
    return a;
  };
  for (const auto op : {mpopt::reduce_op::sum, mpopt::reduce_op::max}) {
    const std::vector<T> reduced = both("all_reduce", [&](mpopt::mpi& c) {
      std::vector<T> v = values<T>(rank, n);
      c.all_reduce(std::span<T>(v), op);
      return v;
    });
    for (std::size_t i = 0; i < n; ++i) {
      float expected = op == mpopt::reduce_op::sum ? 0.0f : value(0, i);
      for (int r = 0; r < w; ++r)
        expected = op == mpopt::reduce_op::sum ? expected + value(r, i) : std::max(expected, value(r, i));
      CHECK(float(reduced[i]) == expected);
    }
  }
  const std::vector<T> block = both("reduce_scatter, equal blocks", [&](mpopt::mpi& c) {
    std::vector<T> out(2);
    c.reduce_scatter(std::span<const T>(values<T>(rank, 2 * std::size_t(w))), std::span<T>(out), mpopt::reduce_op::sum);
    return out;
  });
  for (std::size_t j = 0; j < 2; ++j) {
    float expected = 0;
    for (int r = 0; r < w; ++r) expected += value(r, std::size_t(rank) * 2 + j);
    CHECK(float(block[j]) == expected);
  }
  std::vector<std::size_t> counts(static_cast<std::size_t>(w));
  for (int r = 0; r < w; ++r) counts[std::size_t(r)] = std::size_t(r) + 1;  // 1, 2, ...: uneven
  const std::size_t total = std::size_t(w * (w + 1) / 2), mine = std::size_t(rank) + 1;
  const std::size_t at = std::size_t(rank * (rank + 1) / 2);
  const std::vector<T> piece = both("reduce_scatter, counts", [&](mpopt::mpi& c) {
    std::vector<T> out(mine);
    c.reduce_scatter(std::span<const T>(values<T>(rank, total)), std::span<T>(out),
                     std::span<const std::size_t>(counts), mpopt::reduce_op::sum);
    return out;
  });
  for (std::size_t j = 0; j < mine; ++j) {
    float expected = 0;
    for (int r = 0; r < w; ++r) expected += value(r, at + j);
    CHECK(float(piece[j]) == expected);
  }
  const std::vector<T> gathered = both("all_gather in place, counts", [&](mpopt::mpi& c) {
    std::vector<T> v(total, T(0.0f));
    for (std::size_t j = 0; j < mine; ++j) v[at + j] = T(value(rank, j));
    c.all_gather(std::span<T>(v), std::span<const std::size_t>(counts));
    return v;
  });
  for (int r = 0, k = 0; r < w; ++r)
    for (int j = 0; j <= r; ++j, ++k) CHECK(float(gathered[std::size_t(k)]) == value(r, std::size_t(j)));
  const std::vector<T> blocks = both("all_gather, equal blocks", [&](mpopt::mpi& c) {
    std::vector<T> out(3 * std::size_t(w));
    c.all_gather(std::span<const T>(values<T>(rank, 3)), std::span<T>(out));
    return out;
  });
  for (int r = 0; r < w; ++r)
    for (std::size_t j = 0; j < 3; ++j) CHECK(float(blocks[std::size_t(r) * 3 + j]) == value(r, j));
  const std::vector<T> exchanged = both("all_to_all", [&](mpopt::mpi& c) {
    std::vector<T> in(2 * std::size_t(w)), out(in.size());
    for (std::size_t k = 0; k < in.size(); ++k) in[k] = T(float(rank * 10) + float(k));  // block k / 2 to rank k / 2
    c.all_to_all(std::span<const T>(in), std::span<T>(out));
    return out;
  });
  for (int r = 0; r < w; ++r)
    for (std::size_t j = 0; j < 2; ++j)
      CHECK(float(exchanged[std::size_t(r) * 2 + j]) == float(r * 10) + float(std::size_t(rank) * 2 + j));
  const std::vector<T> broadcast = both("broadcast", [&](mpopt::mpi& c) {
    std::vector<T> v = values<T>(rank, 5);
    c.broadcast(std::span<T>(v), w - 1);
    return v;
  });
  CHECK(same_bits(broadcast, values<T>(w - 1, 5)));
  plain.barrier();
  timed.barrier();
}

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE("a negative timeout is refused at construction, naming the field") {
    CHECK_THROWS_WITH_AS(mpopt::mpi(MPI_COMM_WORLD, {.timeout = -1ms}), doctest::Contains("mpi_options.timeout"),
                         mpopt::error);
    mpopt::mpi off(MPI_COMM_WORLD);  // the default: no timeout
    CHECK(off.options().timeout == 0ms);
  }

  TEST_CASE("ranks that disagree on having a timeout throw at construction on every rank") {
    // Different timeouts are fine (every rank runs the nonblocking collectives); none on some ranks
    // is not: their blocking collectives would never match the others' nonblocking ones.
    const std::chrono::milliseconds mine = world_rank() == 0 ? 0ms : 1s;
    if (world_size() > 1)
      CHECK_THROWS_WITH_AS(mpopt::mpi(MPI_COMM_WORLD, {.timeout = mine}),
                           doctest::Contains("mpi_options.timeout is set on some ranks and 0 on others"), mpopt::error);
    mpopt::mpi different(MPI_COMM_WORLD, {.timeout = world_rank() == 0 ? 1s : 2s});
    std::vector<float> x{1.0f};
    different.all_reduce(std::span<float>(x), mpopt::reduce_op::sum);
    CHECK(x[0] == float(world_size()));
  }

  TEST_CASE("with a timeout and every rank joining, every collective gives the bits it gives without one") {
    for (const bool deterministic : {false, true}) {
      CAPTURE(deterministic);
      mpopt::mpi plain(MPI_COMM_WORLD, {.deterministic = deterministic});
      mpopt::mpi timed(MPI_COMM_WORLD, {.deterministic = deterministic, .timeout = 60s});
      check_same_results<float>(plain, timed);
      check_same_results<double>(plain, timed);
      check_same_results<mpopt::half>(plain, timed);
      check_same_results<std::uint8_t>(plain, timed);
    }
  }

  TEST_CASE("a collective one rank does not join throws on the others after the timeout, naming it; the "
            "communicator is unusable afterwards, and the late rank can still complete it") {
    if (world_size() < 2) return;
    for (const collective& c : every_collective()) {
      CAPTURE(c.call);
      mpopt::mpi comm(MPI_COMM_WORLD, {.deterministic = c.deterministic, .timeout = timeout});
      if (!is_late()) check_timed_out(time_error([&] { c.run(comm); }), c.call, timeout, comm);
      MPI_Barrier(MPI_COMM_WORLD);
      // The late rank joins: its call matches the early ranks' pending one, which completes as they
      // drive MPI in the barrier below, and their destructor frees its request.
      if (is_late()) CHECK(time_error([&] { c.run(comm); }).message == "");
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }

  TEST_CASE("destroying a communicator whose collective timed out neither waits nor crashes, and a late rank "
            "completing it afterwards writes only into memory still alive") {
    if (world_size() < 2) return;
    const std::size_t w = std::size_t(world_size());
    const std::vector<std::size_t> counts(w, 3);
    std::vector<float>& gathered = kept(3 * w);  // the caller's buffer must outlive the collective
    auto all_gather = [&](mpopt::mpi& c) {
      c.all_gather(std::span<float>(gathered), std::span<const std::size_t>(counts));
    };
    std::optional<mpopt::mpi> comm(std::in_place, MPI_COMM_WORLD, mpopt::mpi_options{.timeout = timeout});
    if (!is_late()) {
      check_timed_out(time_error([&] { all_gather(*comm); }), "MPI_Allgatherv", timeout, *comm);
      const auto start = steady::now();
      comm.reset();  // MPI_Iallgatherv pending, reading the communicator's counts and displacements
      CHECK(steady::now() - start < at_once);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    // MPI completes the early ranks' abandoned all-gather as they drive it in the barrier below:
    // it reads the arrays the destructor left allocated and writes into `gathered`.
    if (is_late()) CHECK(time_error([&] { all_gather(*comm); }).message == "");
    MPI_Barrier(MPI_COMM_WORLD);
  }

  TEST_CASE("an optimizer whose rank skips a step(): the others' step() throws after the timeout, naming the "
            "collective, the step and the rank; the communicator stays unusable; every process exits cleanly") {
    if (world_size() < 2) return;
    using Opt =
        mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::adam, mpopt::host, mpopt::mpi>;
    constexpr std::chrono::milliseconds step_timeout = 500ms;
    std::vector<float> weights(64, 0.5f), grads(64);
    Opt opt{mpopt::mpi{MPI_COMM_WORLD, {.timeout = step_timeout}}, {}};
    opt.add_group({}).add(weights, grads, "weights");
    auto backward = [&](int step) {
      for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * float(int(i % 5) - 2 + step);
    };
    // Every rank takes steps 1..3; the late rank then stops calling step().
    const int steps = 3;
    for (int s = 1; s <= steps; ++s) {
      backward(s);
      CHECK(opt.step().result == mpopt::step_result::applied);
    }
    if (!is_late()) {
      backward(steps + 1);
      const thrown t = time_error([&] { opt.step(); });
      check_timed_out(t, "MPI_Allreduce", step_timeout, opt.communicator());
      // The optimizer's context (include/mpopt/detail/comm/metered.hpp) names the step.
      CHECK(t.message.find("(" + rank_of_world() + ", in step() at step " + std::to_string(steps + 1) + ")") !=
            std::string::npos);
      // Later calls that need a collective throw at once: another step, and a checkpoint.
      const thrown again = time_error([&] { opt.step(); });
      CAPTURE(again.message);
      CHECK(again.message.find("unusable after a timeout in MPI_Allreduce") != std::string::npos);
      CHECK(again.took < at_once);
      const temp_dir dir("mpopt_timeout_");
      const thrown save = time_error([&] { opt.save(dir / "state.safetensors"); });
      CAPTURE(save.message);
      CHECK(save.message.find("unusable after a timeout in MPI_Allreduce") != std::string::npos);
      CHECK(save.took < at_once);
    }
    // The ranks meet on MPI_COMM_WORLD, whose collectives are separate from the optimizer's.
    //
    // The early ranks' all-reduce of step 4 stays pending for good: mpopt::mpi neither waits for it
    // nor frees it (MPI forbids freeing or cancelling a collective request), and MPI_Comm_free in
    // the destructor only marks the duplicate for release once the operation completes, which it
    // never does. MPI_Finalize with an operation pending is erroneous by the standard, which is why
    // a real job ends with MPI_Abort after a timeout; a test has to exit 0. Open MPI 4.1's
    // MPI_Finalize does not wait for pending requests (checked over shared memory and TCP, with
    // eager and rendezvous messages), and the gradients here are 256 bytes: sent eagerly, so what
    // is left is a posted receive, and a message in the late rank's queue for a communicator that
    // no rank uses again (its context id stays taken while the request holds it). The cases above
    // show the alternative, where the late rank completes the collective; here its step 4 would
    // go on to a second collective (the overflow flag) that the early ranks never start.
    MPI_Barrier(MPI_COMM_WORLD);
  }
}
