// The NCCL communicator under mpirun, one GPU per rank: every collective of the communicator concept
// (device memory, and host memory through its scratch)
// against results each rank computes on the host, for every element type NCCL carries, and the
// started collectives of the nonblocking_communicator concept against the blocking ones; size errors
// throw on every rank before anything is enqueued. A standalone program (not doctest): every rank
// must run every collective in the same order.
//
// Without a GPU on every rank it checks what it can (construction fails as mpopt::error on every
// rank), prints why it skips and exits 77 on every rank, so mpirun and Meson report a skip.
#include <mpopt/nccl.hpp>

#include "cuda_ranks.hpp"
#include "mpi_checks.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace {

using namespace mpi_checks;

cudaStream_t stream = nullptr;

void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, double>) return "double";
  else if constexpr (std::is_same_v<T, std::uint8_t>) return "uint8";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "int64";
  else if constexpr (std::is_same_v<T, std::uint64_t>) return "uint64";
  else if constexpr (std::is_same_v<T, mpopt::half>) return "half";
  else return "bfloat16";
}

/// Device memory of n elements (at least one byte, so an empty piece still has an address).
template <class T>
class device_buffer {
 public:
  explicit device_buffer(std::size_t n) : n_(n) {
    cuda(cudaMalloc(&p_, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  }
  /// A copy of host, enqueued on the test's stream.
  explicit device_buffer(const std::vector<T>& host) : device_buffer(host.size()) {
    cuda(cudaMemcpyAsync(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { (void)cudaFree(p_); }

  std::span<T> span() { return {p_, n_}; }
  std::span<const T> cspan() const { return {p_, n_}; }
  /// The contents, after everything enqueued on the communicator's stream.
  std::vector<T> download(mpopt::nccl& comm) const {
    std::vector<T> host(n_);
    cuda(cudaMemcpyAsync(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    comm.synchronize();
    return host;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// Rank r's element i: small integers (0..4), so every sum over up to 63 ranks is exact in every
/// type, in any order NCCL adds them.
float value(int r, std::size_t i) { return float((std::size_t(r) * 3 + i) % 5); }
/// What rank `from` sends rank `to` at position k of an all-to-all block: exact in every type.
float tag(int from, int to, std::size_t k) { return float((std::size_t(from) * 7 + std::size_t(to) * 3 + k) % 61); }

template <class T>
std::vector<T> values(int r, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(value(r, i));
  return v;
}

/// got == expected element by element (compared as float: every value is a small integer).
template <class T>
void expect_equal(const std::string& what, const std::vector<T>& got, const std::vector<float>& expected) {
  const std::string name = what + " <" + type_name<T>() + ">";
  if (got.size() != expected.size())
    return expect(false, name + ": " + std::to_string(got.size()) + " elements, expected " +
                             std::to_string(expected.size()));
  for (std::size_t i = 0; i < got.size(); ++i)
    if (float(got[i]) != expected[i])
      return expect(false, name + ": element " + std::to_string(i) + " is " + std::to_string(float(got[i])) +
                               ", expected " + std::to_string(expected[i]));
  expect(true, name);
}

/// started == blocking, bit for bit.
template <class T>
void expect_same_bits(const std::string& what, const std::vector<T>& started, const std::vector<T>& blocking) {
  const auto bytes = [](const std::vector<T>& v) { return std::as_bytes(std::span<const T>(v)); };
  expect(std::ranges::equal(bytes(started), bytes(blocking)),
         what + " <" + type_name<T>() + ">: the same bits as the blocking call");
}

float reduce(mpopt::reduce_op op, std::size_t i) {
  float r = op == mpopt::reduce_op::sum ? 0.0f : value(0, i);
  for (int q = 0; q < world_size; ++q) r = op == mpopt::reduce_op::sum ? r + value(q, i) : std::max(r, value(q, i));
  return r;
}

/// Variable pieces with a zero count: odd ranks get nothing, even rank r gets 3 + r elements.
std::vector<std::size_t> piece_counts() {
  std::vector<std::size_t> counts(std::size_t(world_size), 0);
  for (int r = 0; r < world_size; r += 2) counts[std::size_t(r)] = 3 + std::size_t(r);
  return counts;
}
std::size_t offset(const std::vector<std::size_t>& counts, int rank) {
  std::size_t at = 0;
  for (int r = 0; r < rank; ++r) at += counts[std::size_t(r)];
  return at;
}

/// An in-place all-gather over `counts`: this rank holds only its own piece (99 elsewhere);
/// afterwards everyone holds every piece (`gathered`).
template <class T>
struct pieces {
  std::vector<T> mine;
  std::vector<float> gathered;
};
template <class T>
pieces<T> gather_pieces(const std::vector<std::size_t>& counts, int rank) {
  const std::size_t total = offset(counts, world_size);
  pieces<T> p{std::vector<T>(total, T(99.0f)), std::vector<float>(total)};
  for (int r = 0; r < world_size; ++r)
    for (std::size_t i = offset(counts, r); i < offset(counts, r + 1); ++i) {
      p.gathered[i] = value(r, i);
      if (r == rank) p.mine[i] = T(value(r, i));
    }
  return p;
}

constexpr mpopt::reduce_op ops[] = {mpopt::reduce_op::sum, mpopt::reduce_op::max};
const char* op_name(mpopt::reduce_op op) { return op == mpopt::reduce_op::sum ? "sum" : "max"; }

template <class T>
void check_all_reduce(mpopt::nccl& comm) {
  for (mpopt::reduce_op op : ops) {
    device_buffer<T> data(values<T>(comm.rank(), 37));
    comm.all_reduce(data.span(), op);
    std::vector<float> expected(37);
    for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = reduce(op, i);
    expect_equal(std::string("all_reduce ") + op_name(op), data.download(comm), expected);
  }
}

template <class T>
void check_reduce_scatter(mpopt::nccl& comm) {
  const std::size_t block = 5, w = std::size_t(world_size);
  for (mpopt::reduce_op op : ops) {
    device_buffer<T> in(values<T>(comm.rank(), block * w));
    device_buffer<T> out(block);
    comm.reduce_scatter(in.cspan(), out.span(), op);
    std::vector<float> expected(block);
    for (std::size_t i = 0; i < block; ++i) expected[i] = reduce(op, std::size_t(comm.rank()) * block + i);
    expect_equal(std::string("reduce_scatter equal blocks ") + op_name(op), out.download(comm), expected);
  }
  const std::vector<std::size_t> counts = piece_counts();
  const std::size_t total = offset(counts, world_size), at = offset(counts, comm.rank());
  const std::size_t mine = counts[std::size_t(comm.rank())];
  for (mpopt::reduce_op op : ops) {
    device_buffer<T> in(values<T>(comm.rank(), total));
    device_buffer<T> out(mine);
    comm.reduce_scatter(in.cspan(), out.span(), std::span<const std::size_t>(counts), op);
    std::vector<float> expected(mine);
    for (std::size_t i = 0; i < mine; ++i) expected[i] = reduce(op, at + i);
    expect_equal(std::string("reduce_scatter variable counts (one zero) ") + op_name(op), out.download(comm), expected);
  }
}

template <class T>
void check_all_gather(mpopt::nccl& comm) {
  const std::vector<std::size_t> counts = piece_counts();
  const pieces<T> p = gather_pieces<T>(counts, comm.rank());
  device_buffer<T> data(p.mine);
  comm.all_gather(data.span(), std::span<const std::size_t>(counts));
  expect_equal("all_gather in place, variable counts (one zero)", data.download(comm), p.gathered);

  const std::size_t block = 6;
  device_buffer<T> in(values<T>(comm.rank(), block));
  device_buffer<T> out(block * std::size_t(world_size));
  comm.all_gather(in.cspan(), out.span());
  std::vector<float> gathered;
  for (int r = 0; r < world_size; ++r)
    for (std::size_t i = 0; i < block; ++i) gathered.push_back(value(r, i));
  expect_equal("all_gather equal blocks", out.download(comm), gathered);
}

template <class T>
void check_all_to_all(mpopt::nccl& comm) {
  const std::size_t block = 4, w = std::size_t(world_size);
  std::vector<T> send(block * w);
  std::vector<float> expected(block * w);
  for (int peer = 0; peer < world_size; ++peer)
    for (std::size_t k = 0; k < block; ++k) {
      send[std::size_t(peer) * block + k] = T(tag(comm.rank(), peer, k));
      expected[std::size_t(peer) * block + k] = tag(peer, comm.rank(), k);
    }
  device_buffer<T> in(send);
  device_buffer<T> out(block * w), out_send_recv(block * w);
  comm.all_to_all(in.cspan(), out.span());
  expect_equal("all_to_all", out.download(comm), expected);
  comm.all_to_all_send_recv(in.cspan(), out_send_recv.span());
  expect_equal("all_to_all through sends and receives", out_send_recv.download(comm), expected);
}

template <class T>
void check_broadcast(mpopt::nccl& comm) {
  for (int root : {world_size - 1, 0}) {
    device_buffer<T> data(values<T>(comm.rank(), 11));
    comm.broadcast(data.span(), root);
    std::vector<float> expected(11);
    for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = value(root, i);
    expect_equal("broadcast from rank " + std::to_string(root), data.download(comm), expected);
  }
}

/// start_X leaves X in flight on the side stream; waited for, it leaves the bits X leaves.
template <class T>
void check_started(mpopt::nccl& comm) {
  for (mpopt::reduce_op op : ops) {
    device_buffer<T> blocking(values<T>(comm.rank(), 37)), started(values<T>(comm.rank(), 37));
    comm.all_reduce(blocking.span(), op);
    comm.start_all_reduce(started.span(), op).wait();
    expect_same_bits(std::string("start_all_reduce ") + op_name(op), started.download(comm), blocking.download(comm));
  }
  const std::vector<std::size_t> counts = piece_counts();
  const std::size_t total = offset(counts, world_size), mine = counts[std::size_t(comm.rank())];
  for (mpopt::reduce_op op : ops) {
    device_buffer<T> in(values<T>(comm.rank(), total));
    device_buffer<T> blocking(mine), started(mine);
    comm.reduce_scatter(in.cspan(), blocking.span(), std::span<const std::size_t>(counts), op);
    comm.start_reduce_scatter(in.cspan(), started.span(), std::span<const std::size_t>(counts), op).wait();
    expect_same_bits(std::string("start_reduce_scatter variable counts (one zero) ") + op_name(op),
                     started.download(comm), blocking.download(comm));
  }
  const pieces<T> p = gather_pieces<T>(counts, comm.rank());
  device_buffer<T> blocking(p.mine), started(p.mine);
  comm.all_gather(blocking.span(), std::span<const std::size_t>(counts));
  comm.start_all_gather(started.span(), std::span<const std::size_t>(counts)).wait();
  expect_same_bits("start_all_gather in place, variable counts (one zero)", started.download(comm),
                   blocking.download(comm));
}

template <class T>
void check_type(mpopt::nccl& comm) {
  const std::string t = type_name<T>();
  run("all_reduce <" + t + ">", [&] { check_all_reduce<T>(comm); });
  run("reduce_scatter <" + t + ">", [&] { check_reduce_scatter<T>(comm); });
  run("all_gather <" + t + ">", [&] { check_all_gather<T>(comm); });
  run("all_to_all <" + t + ">", [&] { check_all_to_all<T>(comm); });
  run("broadcast <" + t + ">", [&] { check_broadcast<T>(comm); });
  run("started collectives <" + t + ">", [&] { check_started<T>(comm); });
}

/// What a request promises: complete by default; several in flight at once, waited for in any
/// order; test() turns true by itself; synchronize() covers started collectives; abandoned or moved,
/// a started collective still orders stream() behind it; a request outlives a move of its
/// communicator; over host memory a request comes back complete.
void check_requests(mpopt::nccl& comm) {
  using request = mpopt::nccl::request;
  constexpr mpopt::reduce_op sum = mpopt::reduce_op::sum;
  const auto sums = [](std::size_t n) {
    std::vector<float> s(n);
    for (std::size_t i = 0; i < n; ++i) s[i] = reduce(sum, i);
    return s;
  };

  request none;
  expect(none.test(), "a default request is complete");
  none.wait();

  {
    const std::vector<std::size_t> counts = piece_counts();
    const pieces<float> p = gather_pieces<float>(counts, comm.rank());
    device_buffer<float> reduced(values<float>(comm.rank(), 37)), gathered(p.mine);
    request first = comm.start_all_reduce(reduced.span(), sum);
    request second = comm.start_all_gather(gathered.span(), std::span<const std::size_t>(counts));
    second.wait();
    first.wait();
    expect(first.test() && second.test(), "a waited request is complete");
    expect_equal("two requests in flight, waited for in reverse order: the all-reduce", reduced.download(comm),
                 sums(37));
    expect_equal("two requests in flight, waited for in reverse order: the all-gather", gathered.download(comm),
                 p.gathered);
  }
  {
    constexpr std::size_t n = std::size_t(1) << 22;  // long enough to be seen in flight
    device_buffer<float> data(values<float>(comm.rank(), n));
    request r = comm.start_all_reduce(data.span(), sum);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool done = r.test();
    while (!done && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
      done = r.test();
    }
    expect(done, "test() turns true once the collective has run, with no wait");
    expect(r.test(), "test() stays true");
    expect_equal("an all-reduce seen through test()", data.download(comm), sums(n));
  }
  {
    device_buffer<float> data(values<float>(comm.rank(), 37));
    request r = comm.start_all_reduce(data.span(), sum);
    comm.synchronize();
    expect(r.test(), "synchronize() waits for started collectives");
  }
  {
    device_buffer<float> data(values<float>(comm.rank(), 37));
    { request abandoned = comm.start_all_reduce(data.span(), sum); }
    expect_equal("a request destroyed in flight: stream() still waits for its collective", data.download(comm),
                 sums(37));
  }
  {
    device_buffer<float> a(values<float>(comm.rank(), 37)), b(values<float>(comm.rank(), 37));
    request r = comm.start_all_reduce(a.span(), sum);
    request moved(std::move(r));
    expect(r.test(), "a moved-from request is complete");  // NOLINT(bugprone-use-after-move)
    request assigned = comm.start_all_reduce(b.span(), sum);
    assigned = std::move(moved);  // abandons the all-reduce of b
    assigned.wait();
    expect_equal("a moved request", a.download(comm), sums(37));
    expect_equal("a request abandoned by a move assignment", b.download(comm), sums(37));
  }
  {
    device_buffer<float> data(values<float>(comm.rank(), 37));
    request r = comm.start_all_reduce(data.span(), sum);
    mpopt::nccl moved(std::move(comm));
    r.wait();
    expect_equal("a request outlives a move of its communicator", data.download(moved), sums(37));
    comm = std::move(moved);
  }
  {
    std::vector<float> host = values<float>(comm.rank(), 37);
    request r = comm.start_all_reduce(std::span<float>(host), sum);
    expect(r.test(), "start_all_reduce over host memory returns a complete request");
    expect_equal("start_all_reduce over host memory", host, sums(37));
  }
}

/// Host spans go through the communicator's device scratch and come back with the result, alone
/// or paired with a device span; the scratch grows to the largest and stays.
void check_host_memory(mpopt::nccl& comm) {
  std::vector<double> flags = values<double>(comm.rank(), 3);
  comm.all_reduce(std::span<double>(flags), mpopt::reduce_op::max);
  std::vector<float> expected(3);
  for (std::size_t i = 0; i < 3; ++i) expected[i] = reduce(mpopt::reduce_op::max, i);
  expect_equal("all_reduce in host memory", flags, expected);

  const std::size_t block = 6, w = std::size_t(world_size);
  const std::vector<float> mine = values<float>(comm.rank(), block);
  std::vector<float> gathered(block * w), everyone;
  comm.all_gather(std::span<const float>(mine), std::span<float>(gathered));
  for (int r = 0; r < world_size; ++r)
    for (std::size_t i = 0; i < block; ++i) everyone.push_back(value(r, i));
  expect_equal("all_gather from host to host memory", gathered, everyone);

  device_buffer<float> out(block * w);
  comm.all_gather(std::span<const float>(mine), out.span());
  expect_equal("all_gather from host to device memory", out.download(comm), everyone);

  const std::vector<float> whole = values<float>(comm.rank(), block * w);
  std::vector<float> piece(block);
  device_buffer<float> in(whole);
  comm.reduce_scatter(in.cspan(), std::span<float>(piece), mpopt::reduce_op::sum);
  std::vector<float> sums(block);
  for (std::size_t i = 0; i < block; ++i) sums[i] = reduce(mpopt::reduce_op::sum, std::size_t(comm.rank()) * block + i);
  expect_equal("reduce_scatter from device to host memory", piece, sums);
  expect(comm.workspace_bytes() >= block * w * sizeof(float), "the scratch held the largest host span");
}

/// Bad roots and sizes throw on every rank, and nothing is enqueued: the stream stays idle (an
/// unmatched collective would wait for its peers) and the next collective still matches up.
void check_bad_input(mpopt::nccl& comm) {
  const std::size_t w = std::size_t(world_size);
  device_buffer<float> a(4 * w + 1), b(4 * w + 1);
  const std::vector<std::size_t> too_many(w + 1, 0), wrong_total(w, 1);
  comm.synchronize();
  expect_error("broadcast from root == size", [&] { comm.broadcast(a.span(), world_size); });
  expect_error("broadcast from root -1", [&] { comm.broadcast(a.span(), -1); });
  expect_error("reduce_scatter with one count too many", [&] {
    comm.reduce_scatter(a.cspan(), b.span().first(0), std::span<const std::size_t>(too_many), mpopt::reduce_op::sum);
  });
  expect_error("reduce_scatter whose own piece does not match its count", [&] {
    std::vector<std::size_t> counts(w, 0);
    counts[0] = 4 * w + 1;
    comm.reduce_scatter(a.cspan(), b.span().first(comm.rank() == 0 ? 1 : 2), std::span<const std::size_t>(counts),
                        mpopt::reduce_op::sum);
  });
  expect_error("all_gather whose counts do not add up", [&] {
    comm.all_gather(a.span().first(w + 1), std::span<const std::size_t>(wrong_total));
  });
  expect_error("start_reduce_scatter with one count too many", [&] {
    (void)comm.start_reduce_scatter(a.cspan(), b.span().first(0), std::span<const std::size_t>(too_many),
                                    mpopt::reduce_op::sum);
  });
  expect_error("start_all_gather whose counts do not add up", [&] {
    (void)comm.start_all_gather(a.span().first(w + 1), std::span<const std::size_t>(wrong_total));
  });
  expect_error("reduce_scatter equal blocks that do not fit", [&] {
    comm.reduce_scatter(a.cspan(), b.span().first(4), mpopt::reduce_op::sum);
  });
  expect_error("all_gather equal blocks that do not fit", [&] { comm.all_gather(a.cspan().first(4), b.span()); });
  expect_error("all_to_all with different input and output sizes", [&] {
    comm.all_to_all(a.cspan(), b.span().first(4 * w));
  });
  if (world_size > 1)
    expect_error("all_to_all that does not split into equal blocks", [&] { comm.all_to_all(a.cspan(), b.span()); });
  expect(cudaStreamQuery(comm.stream()) == cudaSuccess, "nothing was enqueued by the calls that threw");
  check_all_reduce<float>(comm);
}

/// A negative timeout is refused before anything is set up (no GPU needed), naming the field.
void check_negative_timeout() {
  try {
    mpopt::nccl bad(MPI_COMM_WORLD, nullptr, {.timeout = std::chrono::milliseconds(-1)});
    expect(false, "a negative timeout: did not throw");
  } catch (const mpopt::error& e) {
    expect(std::string_view(e.what()).find("nccl_options.timeout") != std::string_view::npos,
           std::string("a negative timeout: the error names nccl_options.timeout: ") + e.what());
  }
}

/// With a timeout the collectives work as without one. Then a wait that outlasts it throws on every
/// rank, naming the last collective, and aborts the communicator: later calls throw at once. What
/// outlasts it is a host function holding the stream after an all-reduce every rank joins, so no
/// NCCL operation is left pending when the communicator is aborted.
void check_timeout() {
  using namespace std::chrono_literals;
  using steady = std::chrono::steady_clock;
  constexpr std::chrono::milliseconds timeout = 500ms;
  mpopt::nccl timed(MPI_COMM_WORLD, stream, {.timeout = timeout});
  expect(timed.options().timeout == timeout, "the options are kept");
  check_all_reduce<float>(timed);
  check_host_memory(timed);  // the staged paths, each waiting through synchronize()
  timed.barrier();

  device_buffer<float> data(values<float>(timed.rank(), 37));
  timed.all_reduce(data.span(), mpopt::reduce_op::sum);
  cuda(cudaLaunchHostFunc(stream, [](void*) { std::this_thread::sleep_for(2s); }, nullptr), "cudaLaunchHostFunc");
  std::string message;
  const auto start = steady::now();
  try {
    timed.synchronize();
  } catch (const mpopt::error& e) {
    message = e.what();
  }
  const auto took = steady::now() - start;
  const std::string expected = "nccl: ncclAllReduce, or other work on the stream, did not complete within 500 ms on "
                               "rank " + std::to_string(world_rank) + " of " + std::to_string(world_size);
  expect(message.find(expected) != std::string::npos, "the timeout names the all-reduce and the rank: " + message);
  expect(took >= timeout && took < timeout + 5s, "synchronize() threw after the timeout, not much later");
  const auto again = steady::now();
  expect_error("a barrier after the timeout", [&] { timed.barrier(); });
  expect(steady::now() - again < 100ms, "a collective after the timeout throws at once");
  cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // the host function has returned
}

}  // namespace

int main(int argc, char** argv) {
  start(argc, argv, "nccl_communicator");

  const cuda_ranks gpus = cuda_devices_on_every_rank();
  if (gpus.devices == 0) {
    // Construction still fails cleanly, as mpopt::error, on every rank.
    expect_error("nccl over MPI_COMM_NULL", [] { mpopt::nccl comm(MPI_COMM_NULL); });
    expect_error("nccl without a usable device", [] { mpopt::nccl comm(MPI_COMM_WORLD); });
    check_negative_timeout();
    if (world_rank == 0 && failed == 0)
      std::printf("%s; the NCCL communicator test needs a GPU per rank\n", gpus.why.c_str());
    return finish(77);
  }

  run("the communicator", [&] {
    cuda(cudaSetDevice(world_rank % gpus.devices), "cudaSetDevice");
    cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    mpopt::nccl comm(MPI_COMM_WORLD, stream);
    expect(comm.rank() == world_rank && comm.size() == world_size, "rank and size are those of MPI_COMM_WORLD");
    expect(comm.stream() == stream, "collectives run on the given stream");
    expect_error("nccl over MPI_COMM_NULL", [] { mpopt::nccl bad(MPI_COMM_NULL); });

    check_type<float>(comm);
    check_type<double>(comm);
    check_type<std::uint8_t>(comm);
    check_type<std::int64_t>(comm);
    check_type<std::uint64_t>(comm);
    check_type<mpopt::half>(comm);
    check_type<mpopt::bfloat16>(comm);
    run("host memory", [&] { check_host_memory(comm); });
    run("requests", [&] { check_requests(comm); });
    run("bad input", [&] { check_bad_input(comm); });
    run("barrier", [&] {
      comm.barrier();
      expect(cudaStreamQuery(comm.stream()) == cudaSuccess, "barrier waits for the stream");
    });
    run("a stream of its own", [&] {
      mpopt::nccl own(MPI_COMM_WORLD);
      expect(own.stream() != nullptr && own.stream() != stream, "without a stream, the communicator makes one");
      check_all_reduce<float>(own);
    });
    run("move", [&] {
      mpopt::nccl moved(std::move(comm));
      check_all_reduce<float>(moved);
      expect_error("a moved-from communicator", [&] { comm.barrier(); });  // NOLINT(bugprone-use-after-move)
    });
    run("timeout", [&] {
      check_negative_timeout();
      check_timeout();
    });
  });
  if (stream) (void)cudaStreamDestroy(stream);

  return finish();
}
