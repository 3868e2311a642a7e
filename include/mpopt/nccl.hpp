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
#include <vector>

#include "communicator.hpp"
#include "detail/backend/cuda_stream.hpp"
#include "detail/comm/mpi_c.hpp"
#include "detail/comm/poll.hpp"
#include "detail/options/validate.hpp"
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
/// Started collectives (start_X, the nonblocking_communicator): on device spans the collective runs
/// on a side stream of the communicator's own, after everything enqueued on stream() before the
/// call, so it overlaps what the caller enqueues on stream() afterwards until its request is waited
/// for (see request). On host spans start_X does what X does and returns a complete request.
///
/// Counts are elements, as size_t (NCCL has no int limit).
class nccl {
  struct core;  // what requests hold on to (below)

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
      : stream_(stream, detail::stream_destroyer{stream == nullptr}),
        options_(options),
        core_(std::make_unique<core>()) {
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
    core_->rank = rank_;
    core_->size = size_;

    // This rank's CUDA side first (the usual failure: no usable device), agreed before NCCL starts.
    std::string failed;
    if (!stream_) {
      cudaStream_t own = nullptr;
      failed = failure("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
      stream_.reset(own);
    }
    cudaStream_t side = nullptr;
    if (failed.empty())
      failed = failure("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    core_->side.reset(side);
    if (failed.empty())
      failed = failure("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&core_->ready, cudaEventDisableTiming));
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
    core_->comm.reset(joined.release());
  }
  nccl(nccl&&) noexcept = default;
  nccl& operator=(nccl&&) noexcept = default;
  nccl(const nccl&) = delete;  // one NCCL communicator per rank and device: create another explicitly
  nccl& operator=(const nccl&) = delete;
  ~nccl() = default;  // ncclCommDestroy, events, side stream, scratch and barrier byte, then the stream if owned

  /// A collective left in flight by start_X. Complete means ordered before the work enqueued on
  /// stream() afterwards, as for every collective of this stream communicator: wait() makes stream()
  /// wait for the collective and returns without blocking the host, so a collective that fails or
  /// hangs after it surfaces in synchronize() (which polls NCCL's errors under nccl_options::timeout).
  /// test() says whether the collective has run on the GPU (the host may then read its buffers). Both
  /// throw mpopt::error on an error NCCL has reported meanwhile, aborting the communicator. Destroyed
  /// in flight, a request is abandoned and stream() still waits for its collective. Complete or
  /// destroy requests before their communicator is destroyed; moving the communicator keeps them valid.
  class request {
   public:
    request() = default;
    request(request&& other) noexcept
        : core_(std::exchange(other.core_, nullptr)),
          stream_(other.stream_),
          done_(std::exchange(other.done_, nullptr)) {}
    request& operator=(request&& other) noexcept {
      if (this != &other) {
        abandon();
        core_ = std::exchange(other.core_, nullptr);
        stream_ = other.stream_;
        done_ = std::exchange(other.done_, nullptr);
      }
      return *this;
    }
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    ~request() { abandon(); }

    bool test() {
      if (!done_) return true;
      core_->check_async_error();
      const cudaError_t e = cudaEventQuery(done_);
      if (e == cudaErrorNotReady) return false;
      check(e, "cudaEventQuery");
      release();
      return true;
    }
    void wait() {
      if (!done_) return;
      core_->check_async_error();
      check(cudaStreamWaitEvent(stream_, done_, 0), "cudaStreamWaitEvent");
      release();
    }

   private:
    friend class nccl;
    request(core* owner, cudaStream_t stream, cudaEvent_t done) : core_(owner), stream_(stream), done_(done) {}

    /// The event may go back to the pool as soon as stream() waits for it: a wait keeps the record
    /// it was given, whatever the event records next.
    void release() noexcept {
      core_->give_back(std::exchange(done_, nullptr));
      core_ = nullptr;
    }
    /// Abandoned in flight, the collective still owns its buffers: stream() waits for it, so the
    /// work the caller enqueues there next (which may reuse them) cannot run before it is done.
    void abandon() noexcept {
      if (!done_) return;
      (void)cudaStreamWaitEvent(stream_, done_, 0);  // a destructor cannot report an error
      release();
    }

    core* core_ = nullptr;
    cudaStream_t stream_ = nullptr;  // the communicator's stream()
    cudaEvent_t done_ = nullptr;     // recorded on the side stream after the collective; null once complete
  };

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// The CUDA device current at construction: every buffer and the stream belong to it.
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_.get(); }
  ncclComm_t native() const { return core_ ? core_->comm.get() : nullptr; }
  const nccl_options& options() const { return options_; }

  /// Waits for everything enqueued on stream() and for every collective started (start_X), waited
  /// for or not. A collective that failed asynchronously (a lost peer, a network error) would never
  /// complete, so this polls NCCL's error state meanwhile; on such an error, or when the timeout
  /// passes first (nccl_options), it aborts the communicator (unusable afterwards) and throws
  /// mpopt::error.
  void synchronize() {
    live();  // moved from, or aborted: throws
    const bool done = detail::poll_until(options_.timeout, [&] {
      core_->check_async_error();
      return finished(stream()) && finished(core_->side.get());
    });
    const std::string_view waited_for = std::exchange(last_enqueued_, {});
    if (done) return;
    // A collective whose peers never join would keep the GPU and this rank waiting: aborting ends
    // NCCL's part of the work on the stream.
    core_->abort_after(std::string("a timeout in ").append(waited_for.empty() ? "synchronize()" : waited_for));
    const std::string late = waited_for.empty() ? "the work on the stream (no collective since the last wait)"
                                                : std::string(waited_for) + ", or other work on the stream,";
    detail::fail("nccl: ", late, " did not complete within ", options_.timeout.count(), " ms on rank ", rank_, " of ",
                 size_, ": another rank stopped calling the collectives (it missed a step(), or hangs), or a kernel "
                 "hangs; the communicator was aborted: end the job, e.g. MPI_Abort");
  }

  template <class T>
  void all_reduce(std::span<T> data, reduce_op op) {
    all_reduce(launch::blocking, data, op);
  }
  /// out = my block of the reduction of in over ranks (block r has out.size() elements).
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    detail::check_blocks("reduce_scatter", in.size(), out.size(), std::size_t(size_), 1);
    ncclComm_t c = live();
    if (out.empty()) return;
    in_and_out(launch::blocking, in, out, [&](const T* i, T* o, cudaStream_t s) {
      enqueue(ncclReduceScatter(i, o, out.size(), type<T>(), detail::nccl_op(op), c, s), "ncclReduceScatter");
    });
  }
  /// Variable pieces: rank r gets the next counts[r] elements of the reduction, in rank order.
  /// NCCL has no reduce-scatter-v, so it is one reduce per rank, fused in a group.
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts, reduce_op op) {
    reduce_scatter(launch::blocking, in, out, counts, op);
  }
  /// In place: rank r's piece is the counts[r] elements after those of ranks < r; on return every
  /// rank holds every piece. One broadcast per rank, fused in a group.
  template <class T>
  void all_gather(std::span<T> data, std::span<const std::size_t> counts) {
    all_gather(launch::blocking, data, counts);
  }
  /// out = the in of every rank, in rank order.
  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    detail::check_blocks("all_gather", in.size(), out.size(), 1, std::size_t(size_));
    ncclComm_t c = live();
    if (in.empty()) return;
    in_and_out(launch::blocking, in, out, [&](const T* i, T* o, cudaStream_t s) {
      enqueue(ncclAllGather(i, o, in.size(), type<T>(), c, s), "ncclAllGather");
    });
  }
  /// Block j of in goes to rank j; block i of out comes from rank i.
  template <class T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    const std::size_t block = all_to_all_block(in.size(), out.size());
    ncclComm_t c = live();
    if (block == 0) return;
    in_and_out(launch::blocking, in, out, [&](const T* i, T* o, cudaStream_t s) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
      enqueue(ncclAlltoAll(i, o, block, type<T>(), c, s), "ncclAlltoAll");
#else
      send_recv(i, o, block, c, s);
#endif
    });
  }
  /// all_to_all as NCCL before 2.28 runs it (a group of sends and receives), public so that both
  /// paths are compiled and tested whatever the NCCL version.
  template <class T>
  void all_to_all_send_recv(std::span<const T> in, std::span<T> out) {
    const std::size_t block = all_to_all_block(in.size(), out.size());
    ncclComm_t c = live();
    if (block != 0)
      in_and_out(launch::blocking, in, out, [&](const T* i, T* o, cudaStream_t s) { send_recv(i, o, block, c, s); });
  }
  template <class T>
  void broadcast(std::span<T> data, int root) {
    if (root < 0 || root >= size_) detail::fail("broadcast: root ", root, " is not a rank of ", size_);
    ncclComm_t c = live();
    if (data.empty()) return;
    in_place(launch::blocking, data, [&](T* d, cudaStream_t s) {
      enqueue(ncclBroadcast(d, d, data.size(), type<T>(), root, c, s), "ncclBroadcast");
    });
  }

  /// start_X: what X does, checked alike; on device spans left in flight behind the request.
  template <class T>
  request start_all_reduce(std::span<T> data, reduce_op op) {
    return all_reduce(launch::nonblocking, data, op);
  }
  template <class T>
  request start_reduce_scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts,
                               reduce_op op) {
    return reduce_scatter(launch::nonblocking, in, out, counts, op);
  }
  template <class T>
  request start_all_gather(std::span<T> data, std::span<const std::size_t> counts) {
    return all_gather(launch::nonblocking, data, counts);
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
  /// Where a collective over device memory goes: on stream() (X), or on the side stream behind a
  /// request (start_X). Host memory is always staged on stream() and waited for.
  enum class launch { blocking, nonblocking };

  // The collectives with a start_X, once for both launches: the request is complete when blocking.
  template <class T>
  request all_reduce(launch how, std::span<T> data, reduce_op op) {
    ncclComm_t c = live();
    if (data.empty()) return {};  // the same on every rank: sizes must match
    return in_place(how, data, [&](T* d, cudaStream_t s) {
      enqueue(ncclAllReduce(d, d, data.size(), type<T>(), detail::nccl_op(op), c, s), "ncclAllReduce");
    });
  }
  template <class T>
  request reduce_scatter(launch how, std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts,
                         reduce_op op) {
    detail::check_counts("reduce_scatter", in.size(), counts, rank_, size_, out.size());
    ncclComm_t c = live();
    return in_and_out(how, in, out, [&](const T* i, T* o, cudaStream_t s) {
      // o is written on the root only (NCCL ignores recvbuff elsewhere).
      for_each_piece(counts, [&](int r, std::size_t at, std::size_t n) {
        enqueue(ncclReduce(i + at, o, n, type<T>(), detail::nccl_op(op), r, c, s), "ncclReduce");
      });
    });
  }
  template <class T>
  request all_gather(launch how, std::span<T> data, std::span<const std::size_t> counts) {
    detail::check_counts("all_gather", data.size(), counts, rank_, size_);
    ncclComm_t c = live();
    return in_place(how, data, [&](T* d, cudaStream_t s) {
      for_each_piece(counts, [&](int r, std::size_t at, std::size_t n) {
        enqueue(ncclBroadcast(d + at, d + at, n, type<T>(), r, c, s), "ncclBroadcast");
      });
    });
  }

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
  void send_recv(const T* in, T* out, std::size_t block, ncclComm_t c, cudaStream_t s) {
    group g;
    for (int p = 0; p < size_; ++p) {
      const std::size_t at = std::size_t(p) * block;
      enqueue(ncclSend(in + at, block, type<T>(), p, c, s), "ncclSend");
      enqueue(ncclRecv(out + at, block, type<T>(), p, c, s), "ncclRecv");
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

  /// f(device pointer, stream) for an in-place collective, on device data launched as `how` says;
  /// host data is copied through the scratch and back, and the call waits for it.
  template <class T, class F>
  request in_place(launch how, std::span<T> data, F&& f) {
    if (data.empty() || !on_host(data.data()))
      return on_device(how, [&](cudaStream_t s) { f(data.data(), s); });
    T* d = reinterpret_cast<T*>(scratch(data.size_bytes()));
    check(cudaMemcpyAsync(d, data.data(), data.size_bytes(), cudaMemcpyHostToDevice, stream()), "cudaMemcpyAsync");
    f(d, stream());
    check(cudaMemcpyAsync(data.data(), d, data.size_bytes(), cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync");
    synchronize();
    return {};
  }

  /// f(device in, device out, stream), on device data launched as `how` says; either side in host
  /// memory goes through the scratch (in copied there before, out copied back after), and then the
  /// call waits for it.
  template <class T, class F>
  request in_and_out(launch how, std::span<const T> in, std::span<T> out, F&& f) {
    const bool host_in = !in.empty() && on_host(in.data());
    const bool host_out = !out.empty() && on_host(out.data());
    if (!host_in && !host_out) return on_device(how, [&](cudaStream_t s) { f(in.data(), out.data(), s); });
    constexpr std::size_t align = 256;  // cudaMalloc's alignment, kept for the second piece
    const std::size_t out_at = host_in ? (in.size_bytes() + align - 1) / align * align : 0;
    std::byte* s = scratch(out_at + (host_out ? out.size_bytes() : 0));
    const T* i = host_in ? reinterpret_cast<const T*>(s) : in.data();
    T* o = host_out ? reinterpret_cast<T*>(s + out_at) : out.data();
    if (host_in)
      check(cudaMemcpyAsync(s, in.data(), in.size_bytes(), cudaMemcpyHostToDevice, stream()), "cudaMemcpyAsync");
    f(i, o, stream());
    if (host_out)
      check(cudaMemcpyAsync(out.data(), o, out.size_bytes(), cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync");
    synchronize();
    return {};
  }

  /// f(stream) for a collective over device memory: blocking, on stream(); nonblocking, on the side
  /// stream after everything enqueued on stream() so far (its data is ready there), with a request
  /// for it.
  ///
  /// Every rank issues a communicator's collectives in the same order, and they must also run in
  /// that order. Blocking ones run in order on stream(), started ones in order on the side stream;
  /// a start runs after the blocking ones before it (the side stream waits for `ready`), and a
  /// blocking one after the starts before it once the caller has waited for their requests, as it
  /// does before its next blocking collective. (NCCL's launch code also chains one communicator's
  /// kernels in launch order across streams, but its documentation does not promise that.)
  template <class F>
  request on_device(launch how, F&& f) {
    if (how == launch::blocking) {
      f(stream());
      return {};
    }
    request started(core_.get(), stream(), core_->take_event());
    cudaStream_t side = core_->side.get();
    check(cudaEventRecord(core_->ready, stream()), "cudaEventRecord");
    check(cudaStreamWaitEvent(side, core_->ready, 0), "cudaStreamWaitEvent");
    f(side);
    check(cudaEventRecord(started.done_, side), "cudaEventRecord");
    return started;
  }

  /// Whether everything enqueued on s has run.
  static bool finished(cudaStream_t s) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e != cudaErrorNotReady) check(e, "cudaStreamQuery");
    return e == cudaSuccess;
  }

  ncclComm_t live() const {
    if (!core_) detail::fail("nccl: the communicator was moved from");
    return core_->live();
  }

  /// Checks an enqueued collective (`call` a string literal) and remembers it for synchronize().
  void enqueue(ncclResult_t r, std::string_view call) {
    check(r, call);
    last_enqueued_ = call;
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

  /// What requests reach, at an address of its own so that they outlive a move of the communicator:
  /// NCCL's handle (and why it was aborted), the side stream and the pool of `done` events.
  struct core {
    core() = default;
    core(const core&) = delete;
    core& operator=(const core&) = delete;
    ~core() {
      for (cudaEvent_t e : idle_events) (void)cudaEventDestroy(e);
      if (ready) (void)cudaEventDestroy(ready);
    }

    ncclComm_t live() const {
      if (!comm)
        detail::fail("nccl: the communicator is unusable: it was aborted after ", aborted_after, " on rank ", rank,
                     " of ", size, ": end the job, e.g. MPI_Abort");
      return comm.get();
    }
    /// A collective that failed asynchronously (a lost peer, a network error) never completes.
    void check_async_error() {
      ncclResult_t async = ncclSuccess;
      check(ncclCommGetAsyncError(live(), &async), "ncclCommGetAsyncError");
      if (async != ncclSuccess && async != ncclInProgress) {
        abort_after("an asynchronous error");
        detail::fail(failure("a collective", async), " (asynchronously; the communicator was aborted)");
      }
    }
    /// After an error that leaves collectives unable to complete: ncclCommDestroy would wait for them.
    void abort_after(std::string why) {
      abort_comm{}(comm.release());
      aborted_after = std::move(why);
    }

    /// An idle event, or a new one: once every request in flight at a time has had one, steps
    /// allocate nothing.
    cudaEvent_t take_event() {
      if (idle_events.empty()) {
        idle_events.reserve(events_made + 1);  // room for every event to come back: see give_back
        cudaEvent_t e = nullptr;
        check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
        ++events_made;
        return e;
      }
      const cudaEvent_t e = idle_events.back();
      idle_events.pop_back();
      return e;
    }
    /// Never allocates (take_event reserved the room), so a request's destructor may call it.
    void give_back(cudaEvent_t e) noexcept { idle_events.push_back(e); }

    int rank = 0;  // the communicator's rank and size, for messages
    int size = 1;
    detail::stream_holder side;             // start_X's collectives
    cudaEvent_t ready = nullptr;            // recorded on stream() for the side stream to wait on
    std::vector<cudaEvent_t> idle_events;   // the pool: the events no request holds
    std::size_t events_made = 0;
    std::string aborted_after;  // why the communicator was aborted, if it was
    std::unique_ptr<std::remove_pointer_t<ncclComm_t>, destroy_comm> comm;  // declared last: destroyed first
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
  std::unique_ptr<core> core_;      // declared last: destroyed first (NCCL's handle before the buffers)
};

static_assert(nonblocking_communicator<nccl>);

}  // namespace mpopt
