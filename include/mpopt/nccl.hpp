// mpopt — the NCCL communicator: collectives between GPUs, one rank per GPU, bootstrapped over MPI.
// Include it separately: mpopt.hpp needs no CUDA, NCCL or MPI header.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "communicator.hpp"
#include "detail/cuda_stream.hpp"
#include "detail/mpi_c.hpp"
#include "detail/poll.hpp"
#include "detail/validate.hpp"
#include "numeric.hpp"
#include "tensor.hpp"

namespace mpopt {

namespace detail {

template <class>
inline constexpr bool nccl_unsupported = false;

/// NCCL's name for an element type. half and bfloat16 have the layout of __half and __nv_bfloat16.
template <class T>
constexpr ncclDataType_t nccl_type() {
  using U = std::remove_const_t<T>;
  if constexpr (std::is_same_v<U, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<U, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<U, std::uint8_t>) return ncclUint8;
  else if constexpr (std::is_same_v<U, std::int64_t>) return ncclInt64;
  else if constexpr (std::is_same_v<U, std::uint64_t>) return ncclUint64;
  else if constexpr (std::is_same_v<U, half>) return ncclFloat16;
  else if constexpr (std::is_same_v<U, bfloat16>) return ncclBfloat16;
  else {
    static_assert(nccl_unsupported<U>, "mpopt::nccl communicates float, double, std::uint8_t, std::int64_t, "
                                       "std::uint64_t, mpopt::half and mpopt::bfloat16 only");
    return ncclNumTypes;
  }
}

constexpr ncclRedOp_t nccl_op(reduce_op op) { return op == reduce_op::sum ? ncclSum : ncclMax; }

}  // namespace detail

/// Options of the NCCL communicator.
struct nccl_options {
  /// How long synchronize() (and so every collective over host memory, and barrier()) may wait for
  /// the stream; zero waits forever, as NCCL does. On expiry the communicator is aborted
  /// (ncclCommAbort) and mpopt::error names the last collective enqueued since the previous wait:
  /// end the job, e.g. with MPI_Abort.
  std::chrono::milliseconds timeout{0};
};

/// Collectives over NCCL, one rank per GPU.
///
/// Memory and ordering: spans in device memory of this communicator's GPU (the one current when it
/// was constructed) are enqueued on stream() and the call returns before they run: kernels and
/// copies the caller enqueues on the same stream see the results in order, and host code calls
/// synchronize() before it reads results or reuses inputs. Spans in host memory (pageable or
/// page-locked) go through a device scratch, and the call returns with the result in place: that is
/// how the optimizer agrees on its overflow flag and norm. Sizes are checked on the host, before
/// anything is enqueued, and throw mpopt::error on every rank that calls with bad sizes.
///
/// An mpopt::optimizer with the cuda backend runs its passes on this communicator's stream, so
/// its passes and collectives follow each other in order without waits.
///
/// Counts are elements, as size_t (NCCL has no int limit).
class nccl {
 public:
  static constexpr std::string_view name = "nccl";
  static constexpr memory_space space = memory_space::device;

  /// Collective over `comm`: rank 0 creates NCCL's unique id and broadcasts it; every rank then
  /// joins with the CUDA device current on its thread. Collectives run on `stream` (not owned), or
  /// without one on a non-blocking stream of the communicator's own. Every step ends with all ranks
  /// agreeing on success, so a failure on any rank throws mpopt::error on all of them instead of
  /// leaving some waiting. (A rank that fails inside ncclCommInitRank itself may still leave peers
  /// waiting there.) `options`: see nccl_options.
  explicit nccl(MPI_Comm comm, cudaStream_t stream = nullptr, nccl_options options = {})
      : stream_(stream, detail::stream_destroyer{stream == nullptr}), options_(options) {
    if (options_.timeout.count() < 0)
      detail::fail("nccl_options.timeout must be >= 0 ms (0: no timeout), got ", options_.timeout.count(), " ms");
    int initialized = 0;
    MPI_Initialized(&initialized);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!initialized || finalized) detail::fail("nccl: MPI is not initialized (or already finalized)");
    if (comm == MPI_COMM_NULL) detail::fail("nccl: the communicator is MPI_COMM_NULL");
    // A duplicate whose errors return: a failing bootstrap becomes an mpopt::error, and the user's
    // communicator keeps its error handler.
    struct duplicate {
      MPI_Comm comm = MPI_COMM_NULL;
      ~duplicate() {
        if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
      }
    } boot;
    mpi_check(MPI_Comm_dup(comm, &boot.comm), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(boot.comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(boot.comm, &rank_);
    MPI_Comm_size(boot.comm, &size_);

    // This rank's CUDA side first (the usual failure: no usable device), agreed before NCCL starts.
    std::string failed;
    if (!stream_) {
      cudaStream_t own = nullptr;
      failed = failure("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
      stream_.reset(own);
    }
    void* flag = nullptr;
    if (failed.empty()) failed = failure("cudaMalloc", cudaMalloc(&flag, 1));
    flag_.reset(static_cast<std::byte*>(flag));
    if (failed.empty()) failed = failure("cudaGetDevice", cudaGetDevice(&device_));
    if (failed.empty()) failed = failure("cudaMemsetAsync", cudaMemsetAsync(flag, 0, 1, this->stream()));
    agree(boot.comm, failed, "CUDA setup");

    struct {
      ncclResult_t result;
      ncclUniqueId id;
    } unique{ncclSuccess, {}};
    if (rank_ == 0) unique.result = ncclGetUniqueId(&unique.id);
    mpi_check(MPI_Bcast(&unique, int(sizeof unique), MPI_BYTE, 0, boot.comm), "MPI_Bcast");
    if (unique.result != ncclSuccess) detail::fail(failure("ncclGetUniqueId on rank 0", unique.result));

    ncclComm_t c = nullptr;
    failed = failure("ncclCommInitRank", ncclCommInitRank(&c, size_, unique.id, rank_));
    // Aborted, not destroyed, if another rank failed: its peers will never finish with it.
    std::unique_ptr<std::remove_pointer_t<ncclComm_t>, abort_comm> joined(failed.empty() ? c : nullptr);
    agree(boot.comm, failed, "ncclCommInitRank");
    comm_.reset(joined.release());
  }
  nccl(nccl&&) noexcept = default;
  nccl& operator=(nccl&&) noexcept = default;
  nccl(const nccl&) = delete;  // one NCCL communicator per rank and device: create another explicitly
  nccl& operator=(const nccl&) = delete;
  ~nccl() = default;  // ncclCommDestroy, cudaFree of scratch and barrier byte, then the stream if owned

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// The CUDA device current at construction: every buffer and the stream belong to it.
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_.get(); }
  ncclComm_t native() const { return comm_.get(); }
  const nccl_options& options() const { return options_; }

  /// Waits for everything enqueued on stream(). A collective that failed asynchronously (a lost
  /// peer, a network error) would never complete, so this polls NCCL's error state meanwhile; on
  /// such an error, or when the timeout passes first (nccl_options), it aborts the communicator
  /// (unusable afterwards) and throws mpopt::error.
  void synchronize() {
    ncclComm_t c = live();
    const bool done = detail::poll_until(options_.timeout, [&] {
      ncclResult_t async = ncclSuccess;
      check(ncclCommGetAsyncError(c, &async), "ncclCommGetAsyncError");
      if (async != ncclSuccess && async != ncclInProgress) {
        abort_after("an asynchronous error");
        detail::fail(failure("a collective", async), " (asynchronously; the communicator was aborted)");
      }
      const cudaError_t e = cudaStreamQuery(stream());
      if (e != cudaErrorNotReady) check(e, "cudaStreamQuery");
      return e == cudaSuccess;
    });
    const std::string_view waited_for = std::exchange(last_enqueued_, {});
    if (done) return;
    // A collective whose peers never join would keep the GPU and this rank waiting: aborting ends
    // NCCL's part of the work on the stream.
    abort_after(std::string("a timeout in ").append(waited_for.empty() ? "synchronize()" : waited_for));
    const std::string late = waited_for.empty() ? "the work on the stream (no collective since the last wait)"
                                                : std::string(waited_for) + ", or other work on the stream,";
    detail::fail("nccl: ", late, " did not complete within ", options_.timeout.count(), " ms on rank ", rank_, " of ",
                 size_, ": another rank stopped calling the collectives (it missed a step(), or hangs), or a kernel "
                 "hangs; the communicator was aborted: end the job, e.g. MPI_Abort");
  }

  template <class T>
  void all_reduce(std::span<T> data, reduce_op op) {
    ncclComm_t c = live();
    if (data.empty()) return;  // the same on every rank: sizes must match
    in_place(data, [&](T* d) {
      enqueue(ncclAllReduce(d, d, data.size(), type<T>(), detail::nccl_op(op), c, stream()), "ncclAllReduce");
    });
  }
  /// out = my block of the reduction of in over ranks (block r has out.size() elements).
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    detail::check_blocks("reduce_scatter", in.size(), out.size(), std::size_t(size_), 1);
    ncclComm_t c = live();
    if (out.empty()) return;
    in_and_out(in, out, [&](const T* i, T* o) {
      enqueue(ncclReduceScatter(i, o, out.size(), type<T>(), detail::nccl_op(op), c, stream()), "ncclReduceScatter");
    });
  }
  /// Variable pieces: rank r gets the next counts[r] elements of the reduction, in rank order.
  /// NCCL has no reduce-scatter-v, so it is one reduce per rank, fused in a group.
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts, reduce_op op) {
    detail::check_counts("reduce_scatter", in.size(), counts, rank_, size_, out.size());
    ncclComm_t c = live();
    in_and_out(in, out, [&](const T* i, T* o) {
      // o is written on the root only (NCCL ignores recvbuff elsewhere).
      for_each_piece(counts, [&](int r, std::size_t at, std::size_t n) {
        enqueue(ncclReduce(i + at, o, n, type<T>(), detail::nccl_op(op), r, c, stream()), "ncclReduce");
      });
    });
  }
  /// In place: rank r's piece is the counts[r] elements after those of ranks < r; on return every
  /// rank holds every piece. One broadcast per rank, fused in a group.
  template <class T>
  void all_gather(std::span<T> data, std::span<const std::size_t> counts) {
    detail::check_counts("all_gather", data.size(), counts, rank_, size_);
    ncclComm_t c = live();
    in_place(data, [&](T* d) {
      for_each_piece(counts, [&](int r, std::size_t at, std::size_t n) {
        enqueue(ncclBroadcast(d + at, d + at, n, type<T>(), r, c, stream()), "ncclBroadcast");
      });
    });
  }
  /// out = the in of every rank, in rank order.
  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    detail::check_blocks("all_gather", in.size(), out.size(), 1, std::size_t(size_));
    ncclComm_t c = live();
    if (in.empty()) return;
    in_and_out(in, out, [&](const T* i, T* o) {
      enqueue(ncclAllGather(i, o, in.size(), type<T>(), c, stream()), "ncclAllGather");
    });
  }
  /// Block j of in goes to rank j; block i of out comes from rank i.
  template <class T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    const std::size_t block = all_to_all_block(in.size(), out.size());
    ncclComm_t c = live();
    if (block == 0) return;
    in_and_out(in, out, [&](const T* i, T* o) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
      enqueue(ncclAlltoAll(i, o, block, type<T>(), c, stream()), "ncclAlltoAll");
#else
      send_recv(i, o, block, c);
#endif
    });
  }
  /// all_to_all as NCCL before 2.28 runs it (a group of sends and receives), public so that both
  /// paths are compiled and tested whatever the NCCL version.
  template <class T>
  void all_to_all_send_recv(std::span<const T> in, std::span<T> out) {
    const std::size_t block = all_to_all_block(in.size(), out.size());
    ncclComm_t c = live();
    if (block != 0) in_and_out(in, out, [&](const T* i, T* o) { send_recv(i, o, block, c); });
  }
  template <class T>
  void broadcast(std::span<T> data, int root) {
    if (root < 0 || root >= size_) detail::fail("broadcast: root ", root, " is not a rank of ", size_);
    ncclComm_t c = live();
    if (data.empty()) return;
    in_place(data, [&](T* d) {
      enqueue(ncclBroadcast(d, d, data.size(), type<T>(), root, c, stream()), "ncclBroadcast");
    });
  }
  /// Device bytes held to stage host spans: as much as the largest host collective needed so far.
  std::size_t workspace_bytes() const { return scratch_bytes_; }
  static constexpr std::string_view workspace_purpose = "device scratch for collectives over host memory";
  /// Returns once every rank has called barrier() and all work enqueued on stream() has finished:
  /// an all-reduce of one device byte cannot complete before every rank joins it.
  void barrier() {
    enqueue(ncclAllReduce(flag_.get(), flag_.get(), 1, ncclUint8, ncclMax, live(), stream()),
            "ncclAllReduce (barrier)");
    synchronize();
  }

 private:
  /// ncclGroupStart; the group is closed by end(), or when an error leaves the scope early.
  struct group {
    group() { check(ncclGroupStart(), "ncclGroupStart"); }
    group(const group&) = delete;
    group& operator=(const group&) = delete;
    ~group() {
      if (open) (void)ncclGroupEnd();  // closing after an error: the error already thrown says why
    }
    void end() {
      open = false;
      check(ncclGroupEnd(), "ncclGroupEnd");
    }
    bool open = true;
  };

  /// f(rank, offset, count) for every rank's nonempty piece of `counts`, in rank order, in one group.
  template <class F>
  void for_each_piece(std::span<const std::size_t> counts, F&& f) {
    group g;
    std::size_t at = 0;
    for (int r = 0; r < size_; ++r) {
      const std::size_t n = counts[std::size_t(r)];
      if (n != 0) f(r, at, n);
      at += n;
    }
    g.end();
  }

  /// The block size of an all-to-all, after mpi.hpp's checks.
  std::size_t all_to_all_block(std::size_t in, std::size_t out) const {
    detail::check_blocks("all_to_all", in, out, 1, 1);
    if (in % std::size_t(size_) != 0)
      detail::fail("all_to_all: ", in, " elements do not split into ", size_, " equal blocks");
    return in / std::size_t(size_);
  }

  template <class T>
  void send_recv(const T* in, T* out, std::size_t block, ncclComm_t c) {
    group g;
    for (int p = 0; p < size_; ++p) {
      const std::size_t at = std::size_t(p) * block;
      enqueue(ncclSend(in + at, block, type<T>(), p, c, stream()), "ncclSend");
      enqueue(ncclRecv(out + at, block, type<T>(), p, c, stream()), "ncclRecv");
    }
    g.end();
  }

  /// Memory NCCL cannot read or write: the host's, pageable or page-locked.
  static bool on_host(const void* p) {
    cudaPointerAttributes a{};
    check(cudaPointerGetAttributes(&a, p), "cudaPointerGetAttributes");
    return a.type == cudaMemoryTypeHost || a.type == cudaMemoryTypeUnregistered;
  }

  /// At least `bytes` of device scratch. Grows only when a larger host collective comes; nothing
  /// staged is in flight then (every staged call waits before it returns).
  std::byte* scratch(std::size_t bytes) {
    if (bytes > scratch_bytes_) {
      void* p = nullptr;
      check(cudaMalloc(&p, bytes), "cudaMalloc");
      scratch_.reset(static_cast<std::byte*>(p));
      scratch_bytes_ = bytes;
    }
    return scratch_.get();
  }

  /// f(device pointer) for an in-place collective; host data is copied through the scratch and
  /// back, and the call waits for it.
  template <class T, class F>
  void in_place(std::span<T> data, F&& f) {
    if (data.empty() || !on_host(data.data())) return f(data.data());
    T* d = reinterpret_cast<T*>(scratch(data.size_bytes()));
    check(cudaMemcpyAsync(d, data.data(), data.size_bytes(), cudaMemcpyHostToDevice, stream()), "cudaMemcpyAsync");
    f(d);
    check(cudaMemcpyAsync(data.data(), d, data.size_bytes(), cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync");
    synchronize();
  }

  /// f(device in, device out); either side in host memory goes through the scratch (in copied
  /// there before, out copied back after), and then the call waits for it.
  template <class T, class F>
  void in_and_out(std::span<const T> in, std::span<T> out, F&& f) {
    const bool host_in = !in.empty() && on_host(in.data());
    const bool host_out = !out.empty() && on_host(out.data());
    if (!host_in && !host_out) return f(in.data(), out.data());
    constexpr std::size_t align = 256;  // cudaMalloc's alignment, kept for the second piece
    const std::size_t out_at = host_in ? (in.size_bytes() + align - 1) / align * align : 0;
    std::byte* s = scratch(out_at + (host_out ? out.size_bytes() : 0));
    const T* i = host_in ? reinterpret_cast<const T*>(s) : in.data();
    T* o = host_out ? reinterpret_cast<T*>(s + out_at) : out.data();
    if (host_in)
      check(cudaMemcpyAsync(s, in.data(), in.size_bytes(), cudaMemcpyHostToDevice, stream()), "cudaMemcpyAsync");
    f(i, o);
    if (host_out)
      check(cudaMemcpyAsync(out.data(), o, out.size_bytes(), cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync");
    synchronize();
  }

  ncclComm_t live() const {
    if (!comm_ && !aborted_after_.empty())
      detail::fail("nccl: the communicator is unusable: it was aborted after ", aborted_after_, " on rank ", rank_,
                   " of ", size_, ": end the job, e.g. MPI_Abort");
    if (!comm_) detail::fail("nccl: the communicator was moved from");
    return comm_.get();
  }

  /// Checks an enqueued collective (`call` a string literal) and remembers it for synchronize().
  void enqueue(ncclResult_t r, std::string_view call) {
    check(r, call);
    last_enqueued_ = call;
  }

  /// After an error that leaves collectives unable to complete: ncclCommDestroy would wait for them.
  void abort_after(std::string why) {
    abort_comm{}(comm_.release());
    aborted_after_ = std::move(why);
  }

  /// Every rank learns whether any rank failed a local step (its message `mine`, empty if not), so
  /// all of them throw together rather than some waiting forever in the next step.
  void agree(MPI_Comm comm, const std::string& mine, std::string_view step) const {
    int first = mine.empty() ? size_ : rank_;
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce");
    if (!mine.empty()) detail::fail(mine);
    if (first != size_) detail::fail("nccl: ", step, " failed on rank ", first, " (that rank's error says why)");
  }

  template <class T>
  static constexpr ncclDataType_t type() {
    return detail::nccl_type<T>();
  }
  /// "nccl: <call> failed: <reason>", or empty on success.
  static std::string failure(std::string_view call, ncclResult_t r) {
    if (r == ncclSuccess) return {};
    std::string s = std::string("nccl: ").append(call).append(" failed: ").append(ncclGetErrorString(r));
    if (const char* last = ncclGetLastError(nullptr); last && *last) s.append(": ").append(last);
    return s;
  }
  static std::string failure(std::string_view call, cudaError_t e) {
    if (e == cudaSuccess) return {};
    return std::string("nccl: ").append(call).append(" failed: ").append(cudaGetErrorString(e));
  }
  static void check(ncclResult_t r, std::string_view call) {
    if (r != ncclSuccess) detail::fail(failure(call, r));
  }
  static void check(cudaError_t e, std::string_view call) {
    if (e != cudaSuccess) detail::fail(failure(call, e));
  }
  static void mpi_check(int code, std::string_view call) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    detail::fail("nccl: ", call, " failed: ", std::string_view(text, std::size_t(length)));
  }

  // Destructors cannot report errors, so the results of these are dropped.
  struct free_device {
    void operator()(std::byte* p) const noexcept { (void)cudaFree(p); }
  };
  struct destroy_comm {
    void operator()(ncclComm_t c) const noexcept { (void)ncclCommDestroy(c); }
  };
  struct abort_comm {  // after a failure: ncclCommDestroy would wait for operations that cannot finish
    void operator()(ncclComm_t c) const noexcept { (void)ncclCommAbort(c); }
  };

  detail::stream_holder stream_;  // declared first: destroyed last
  int rank_ = 0;
  int size_ = 1;
  int device_ = -1;
  std::unique_ptr<std::byte, free_device> flag_;     // barrier()'s device byte
  std::unique_ptr<std::byte, free_device> scratch_;  // host spans staged
  std::size_t scratch_bytes_ = 0;
  nccl_options options_;
  std::string_view last_enqueued_;  // the last collective enqueued since the last synchronize()
  std::string aborted_after_;       // why the communicator was aborted, if it was
  std::unique_ptr<std::remove_pointer_t<ncclComm_t>, destroy_comm> comm_;  // declared last: destroyed first
};

static_assert(communicator<nccl>);

}  // namespace mpopt
