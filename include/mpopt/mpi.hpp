// mpopt — the MPI communicator (Open MPI or any MPI-3 library). Include it separately: mpopt.hpp
// needs no MPI header.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "communicator.hpp"
#include "detail/comm/mpi_c.hpp"
#include "detail/comm/poll.hpp"
#include "detail/options/validate.hpp"
#include "numeric.hpp"

namespace mpopt {

namespace detail {

/// Sum and max of 16-bit floats: widen, combine in float, round back (MPI has no such types).
template <class T, reduce_op Op>
void mpi_reduce_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = float(a[i]), y = float(b[i]);
    b[i] = T(Op == reduce_op::sum ? x + y : (x > y ? x : y));
  }
}

/// MPI datatype and reduction of an element type. The 16-bit ones are created on first use.
template <class T>
struct mpi_type;
/// MPI's built-in types reduce with MPI_SUM and MPI_MAX.
struct mpi_builtin_op {
  static MPI_Op op(reduce_op o) { return o == reduce_op::sum ? MPI_SUM : MPI_MAX; }
};
template <>
struct mpi_type<float> : mpi_builtin_op {
  static MPI_Datatype type() { return MPI_FLOAT; }
};
template <>
struct mpi_type<double> : mpi_builtin_op {
  static MPI_Datatype type() { return MPI_DOUBLE; }
};
template <>
struct mpi_type<std::uint8_t> : mpi_builtin_op {
  static MPI_Datatype type() { return MPI_UINT8_T; }
};
template <>
struct mpi_type<std::int64_t> : mpi_builtin_op {
  static MPI_Datatype type() { return MPI_INT64_T; }
};
template <>
struct mpi_type<std::uint64_t> : mpi_builtin_op {
  static MPI_Datatype type() { return MPI_UINT64_T; }
};
template <class T>
  requires(std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
struct mpi_type<T> {
  static MPI_Datatype type() {
    static const MPI_Datatype t = [] {
      MPI_Datatype d;
      MPI_Type_contiguous(2, MPI_BYTE, &d);
      MPI_Type_commit(&d);
      return d;
    }();
    return t;
  }
  static MPI_Op op(reduce_op o) {
    static const MPI_Op sum = create(&mpi_reduce_16bit<T, reduce_op::sum>);
    static const MPI_Op max = create(&mpi_reduce_16bit<T, reduce_op::max>);
    return o == reduce_op::sum ? sum : max;
  }

 private:
  static MPI_Op create(MPI_User_function* f) {
    MPI_Op op;
    MPI_Op_create(f, /*commute=*/1, &op);
    return op;
  }
};

}  // namespace detail

/// Options of the MPI communicator.
struct mpi_options {
  /// Float sums in rank order (x0 + x1 + ... + x(W-1), one rounding for 16-bit types) instead of
  /// whatever order the MPI library's algorithm picks: the same bits on every MPI build and message
  /// size, and all_reduce equals reduce_scatter + all_gather bit for bit (so replicated, zero1 and
  /// zero2 train identically). It runs as an all-to-all plus a local sum: the data volume of a
  /// reduce-scatter, with a workspace of W times the largest piece.
  bool deterministic = false;
  /// How long each collective may wait for the other ranks; zero waits forever, as MPI does. With a
  /// limit, collectives run as their nonblocking twins (MPI_Iallreduce, ...), polled until they
  /// complete; one that does not complete in time throws mpopt::error, and the communicator is
  /// unusable from then on (MPI cannot cancel a collective): end the job, e.g. with MPI_Abort.
  std::chrono::milliseconds timeout{0};
};

/// Collectives over an MPI communicator (e.g. MPI_COMM_WORLD or a data-parallel sub-communicator).
/// It works on its own duplicate of the communicator, with errors returned rather than fatal, so
/// a failing collective becomes an mpopt::error and the user's communicator is left as it was.
class mpi {
 public:
  static constexpr std::string_view name = "mpi";

  explicit mpi(MPI_Comm comm, mpi_options options = {}) : options_(options) {
    if (options_.timeout.count() < 0)
      detail::fail("mpi_options.timeout must be >= 0 ms (0: no timeout), got ", options_.timeout.count(), " ms");
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) detail::fail("mpi: MPI_Init has not been called");
    if (comm == MPI_COMM_NULL) detail::fail("mpi: the communicator is MPI_COMM_NULL");
    check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    // A blocking collective never matches a nonblocking one (MPI-3.1, 5.12): with a timeout on some
    // ranks only, the first collective would hang. So every rank learns whether all agree.
    int timed[2] = {options_.timeout.count() > 0, options_.timeout.count() == 0};  // both 1: they differ
    const int agreed = MPI_Allreduce(MPI_IN_PLACE, timed, 2, MPI_INT, MPI_MAX, comm_);
    if (agreed != MPI_SUCCESS || (timed[0] && timed[1])) {
      MPI_Comm_free(&comm_);
      check(agreed, "MPI_Allreduce");
      detail::fail("mpi_options.timeout is set on some ranks and 0 on others: give every rank a timeout, or none "
                   "(a collective with a timeout runs as MPI's nonblocking twin, which no blocking call matches)");
    }
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    counts_.resize(std::size_t(size_));
    displs_.resize(std::size_t(size_));
    ones_.resize(std::size_t(size_));
    steps_.resize(std::size_t(size_));
  }
  mpi(mpi&& o) noexcept
      : options_(o.options_),
        comm_(std::exchange(o.comm_, MPI_COMM_NULL)),
        rank_(o.rank_),
        size_(o.size_),
        counts_(std::move(o.counts_)),
        displs_(std::move(o.displs_)),
        ones_(std::move(o.ones_)),
        steps_(std::move(o.steps_)),
        workspace_(std::move(o.workspace_)),
        timed_out_(std::exchange(o.timed_out_, MPI_REQUEST_NULL)),
        timed_out_call_(o.timed_out_call_),
        flights_(std::move(o.flights_)) {}
  mpi(const mpi&) = delete;  // duplicating is collective: do it explicitly with mpi(other.native())
  mpi& operator=(const mpi&) = delete;
  mpi& operator=(mpi&&) = delete;
  ~mpi() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (timed_out_ != MPI_REQUEST_NULL) release_timed_out();
    // A collective still in flight may write into its flight once a late rank joins: leaked, not freed.
    for (auto& f : flights_)
      if (f->busy) (void)f.release();
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm native() const { return comm_; }
  const mpi_options& options() const { return options_; }
  /// Heap bytes of the deterministic mode's workspace and of the collectives in flight (they grow
  /// to the largest collective, and the most in flight at once, once).
  std::size_t workspace_bytes() const {
    std::size_t bytes = workspace_.capacity() + flights_.capacity() * sizeof(flights_[0]);
    for (const auto& f : flights_)
      bytes += sizeof(flight) + f->workspace.capacity() +
               (f->counts.capacity() + f->displs.capacity() + f->ones.capacity() + f->steps.capacity()) * sizeof(int);
    return bytes;
  }
  static constexpr std::string_view workspace_purpose =
      "rank-ordered sums (deterministic mode) and collectives in flight (overlap_comm)";

  template <class T>
  void all_reduce(std::span<T> data, reduce_op op) {
    // Element-wise, so counts beyond int range go in pieces.
    for (std::size_t at = 0; at < data.size(); at += max_count) {
      const std::span<T> piece = data.subspan(at, std::min<std::size_t>(max_count, data.size() - at));
      if (ordered<T>(op)) {
        ordered_all_reduce(piece);
        continue;
      }
      collective("MPI_Allreduce", MPI_Allreduce, MPI_Iallreduce, MPI_IN_PLACE, piece.data(), int(piece.size()),
                 type<T>(), detail::mpi_type<T>::op(op), comm_);
    }
  }
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    detail::check_blocks("reduce_scatter", in.size(), out.size(), std::size_t(size_), 1);
    collective("MPI_Reduce_scatter_block", MPI_Reduce_scatter_block, MPI_Ireduce_scatter_block, in.data(), out.data(),
               count(out.size()), type<T>(), detail::mpi_type<T>::op(op), comm_);
  }
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts, reduce_op op) {
    detail::check_counts("reduce_scatter", in.size(), counts, rank_, size_, out.size());
    set_counts(counts);
    if (ordered<T>(op)) return ordered_reduce_scatter(in, out);
    collective("MPI_Reduce_scatter", MPI_Reduce_scatter, MPI_Ireduce_scatter, in.data(), out.data(), counts_.data(),
               type<T>(), detail::mpi_type<T>::op(op), comm_);
  }
  template <class T>
  void all_gather(std::span<T> data, std::span<const std::size_t> counts) {
    detail::check_counts("all_gather", data.size(), counts, rank_, size_);
    set_counts(counts);
    collective("MPI_Allgatherv", MPI_Allgatherv, MPI_Iallgatherv, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data(),
               counts_.data(), displs_.data(), type<T>(), comm_);
  }
  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    detail::check_blocks("all_gather", in.size(), out.size(), 1, std::size_t(size_));
    collective("MPI_Allgather", MPI_Allgather, MPI_Iallgather, in.data(), count(in.size()), type<T>(), out.data(),
               count(in.size()), type<T>(), comm_);
  }
  template <class T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    detail::check_blocks("all_to_all", in.size(), out.size(), 1, 1);
    if (in.size() % std::size_t(size_) != 0)
      detail::fail("all_to_all: ", in.size(), " elements do not split into ", size_, " equal blocks");
    const int block = count(in.size() / std::size_t(size_));
    collective("MPI_Alltoall", MPI_Alltoall, MPI_Ialltoall, in.data(), block, type<T>(), out.data(), block, type<T>(),
               comm_);
  }
  template <class T>
  void broadcast(std::span<T> data, int root) {
    if (root < 0 || root >= size_) detail::fail("broadcast: root ", root, " is not a rank of ", size_);
    collective("MPI_Bcast", MPI_Bcast, MPI_Ibcast, data.data(), count(data.size()), type<T>(), root, comm_);
  }
  void barrier() { collective("MPI_Barrier", MPI_Barrier, MPI_Ibarrier, comm_); }

 private:
  struct flight;

 public:
  /// A collective in flight (nonblocking_communicator). wait() waits as a blocking collective does:
  /// forever, or up to mpi_options::timeout, after which the communicator is unusable. A request
  /// destroyed in flight is abandoned; its buffers (the caller's and the communicator's) stay the
  /// collective's, so it is tested once and, if still running, its flight is never reused. In
  /// deterministic mode an all-reduce is two collectives, and the second starts in wait() (where
  /// every rank starts it in the same order): until then test() says false.
  class request {
   public:
    request() = default;
    request(request&& o) noexcept : comm_(std::exchange(o.comm_, nullptr)), flight_(std::exchange(o.flight_, nullptr)) {}
    request& operator=(request&& o) noexcept {
      if (this != &o) {
        abandon();
        comm_ = std::exchange(o.comm_, nullptr);
        flight_ = std::exchange(o.flight_, nullptr);
      }
      return *this;
    }
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    ~request() { abandon(); }

    bool test() {
      if (!flight_) return true;
      flight* f = std::exchange(flight_, nullptr);  // a throw frees it, or leaves it to MPI for good
      if (comm_->advance(*f, false)) return true;
      flight_ = f;
      return false;
    }
    void wait() {
      if (flight_) comm_->advance(*std::exchange(flight_, nullptr), true);
    }

   private:
    friend class mpi;
    request(mpi* comm, flight* f) : comm_(comm), flight_(f) {}
    void abandon() noexcept {
      if (flight_) comm_->abandon(*std::exchange(flight_, nullptr));
    }
    mpi* comm_ = nullptr;
    flight* flight_ = nullptr;
  };

  template <class T>
  request start_all_reduce(std::span<T> data, reduce_op op) {
    const int n = count(data.size());
    flight& f = take_flight("MPI_Iallreduce");
    if (ordered<T>(op)) {  // a rank-ordered reduce-scatter into near-equal blocks, then an all-gather
      block_counts(data.size(), f.counts, f.displs);
      start_ordered_reduce_scatter<T>(f, data.data(), data.data() + f.displs[std::size_t(rank_)],
                                      std::size_t(f.counts[std::size_t(rank_)]), true);
    } else {
      f.started(MPI_Iallreduce(MPI_IN_PLACE, data.data(), n, type<T>(), detail::mpi_type<T>::op(op), comm_,
                               &f.mpi_request));
    }
    return launched(f);
  }
  template <class T>
  request start_reduce_scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts,
                               reduce_op op) {
    detail::check_counts("reduce_scatter", in.size(), counts, rank_, size_, out.size());
    flight& f = take_flight("MPI_Ireduce_scatter");
    set_counts(f, counts);
    if (ordered<T>(op)) {
      start_ordered_reduce_scatter<T>(f, in.data(), out.data(), out.size(), false);
    } else {
      f.started(MPI_Ireduce_scatter(in.data(), out.data(), f.counts.data(), type<T>(), detail::mpi_type<T>::op(op),
                                    comm_, &f.mpi_request));
    }
    return launched(f);
  }
  template <class T>
  request start_all_gather(std::span<T> data, std::span<const std::size_t> counts) {
    detail::check_counts("all_gather", data.size(), counts, rank_, size_);
    flight& f = take_flight("MPI_Iallgatherv");
    set_counts(f, counts);
    f.started(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data(), f.counts.data(), f.displs.data(),
                              type<T>(), comm_, &f.mpi_request));
    return launched(f);
  }

 private:
  /// What a collective in flight needs until it completes: MPI reads its counts and writes its
  /// workspace meanwhile, so each has its own. Flights are reused, so steps allocate nothing once
  /// as many as are ever in flight at once exist.
  struct flight {
    MPI_Request mpi_request = MPI_REQUEST_NULL;
    std::string_view call;
    int code = MPI_SUCCESS;
    std::vector<int> counts, displs, ones, steps;
    std::vector<std::byte> workspace;
    /// The local part after MPI's (deterministic mode): sums the received pieces and, for an
    /// all-reduce, starts the gather of the sums. Null once only MPI's part is left.
    void (*then)(mpi&, flight&) = nullptr;
    bool then_collective = false;  // `then` starts a collective
    void *data = nullptr, *out = nullptr;
    std::size_t n = 0;
    bool busy = false;

    void started(int result) { code = result; }
  };
  static constexpr std::size_t max_count = std::size_t{1} << 30;

  /// Whether this reduction runs in rank order: float sums in deterministic mode (integer sums and
  /// maxima are exact in any order).
  template <class T>
  bool ordered(reduce_op op) const {
    return options_.deterministic && op == reduce_op::sum && !std::is_integral_v<T>;
  }

  /// counts_ and displs_ as MPI's int arrays.
  void set_counts(std::span<const std::size_t> counts) { set_counts(counts, counts_, displs_); }
  static void set_counts(std::span<const std::size_t> counts, std::vector<int>& to, std::vector<int>& displs) {
    std::size_t at = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      to[r] = count(counts[r]);
      displs[r] = count(at);
      at += counts[r];
    }
  }
  void set_counts(flight& f, std::span<const std::size_t> counts) { set_counts(counts, f.counts, f.displs); }
  /// Near-equal blocks of n elements, one per rank: how an all-reduce is cut in deterministic mode.
  void block_counts(std::size_t n, std::vector<int>& counts, std::vector<int>& displs) const {
    const std::size_t w = std::size_t(size_);
    for (std::size_t r = 0, at = 0; r < w; ++r) {
      const std::size_t c = n / w + (r < n % w);
      counts[r] = int(c);
      displs[r] = int(at);
      at += c;
    }
  }

  // ---- collectives in flight

  flight& take_flight(std::string_view call) {
    if (!timed_out_call_.empty())
      detail::fail("mpi: the communicator is unusable after a timeout in ", timed_out_call_, " on rank ", rank_, " of ",
                   size_, "; ", call, " not started: end the job, e.g. MPI_Abort");
    // Room for as many as an optimizer ever has in flight (optimizer_options::buckets_in_flight),
    // made at the first: how many run at once varies from step to step, the steps' allocations must not.
    if (flights_.empty()) add_flights(max_buckets_in_flight);
    flight* f = nullptr;
    for (auto& x : flights_)
      if (!x->busy) f = x.get();
    if (!f) f = add_flights(1);
    f->call = call;
    f->then = nullptr;
    f->then_collective = false;
    f->code = MPI_SUCCESS;
    return *f;
  }
  /// n more flights; returns the last.
  flight* add_flights(std::size_t n) {
    for (std::size_t k = 0; k < n; ++k) {
      flights_.push_back(std::make_unique<flight>());
      for (std::vector<int>* v : {&flights_.back()->counts, &flights_.back()->displs, &flights_.back()->ones,
                                  &flights_.back()->steps})
        v->resize(std::size_t(size_));
    }
    return flights_.back().get();
  }
  static constexpr std::size_t max_buckets_in_flight = 64;

  /// The flight's request, or the error of starting it (then the flight is free again).
  request launched(flight& f) {
    if (f.code != MPI_SUCCESS) {
      f.mpi_request = MPI_REQUEST_NULL;
      check(f.code, f.call);
    }
    f.busy = true;
    return request(this, &f);
  }

  /// Deterministic mode's first part: every rank sends rank r its piece (f.counts, f.displs) and
  /// receives the W pieces of its own into the flight's workspace, to be summed in rank order into
  /// out (n elements), and then, for an all-reduce (`gather`: in is the whole buffer), gathered.
  template <class T>
  void start_ordered_reduce_scatter(flight& f, const T* in, T* out, std::size_t n, bool gather) {
    const std::size_t bytes = n * std::size_t(size_) * sizeof(T);
    if (f.workspace.size() < bytes) f.workspace.resize(bytes);
    for (std::size_t r = 0; r < std::size_t(size_); ++r) {
      f.ones[r] = count(n);
      f.steps[r] = count(r * n);
    }
    f.data = const_cast<T*>(in);
    f.out = out;
    f.n = n;
    f.then = gather ? &sum_then_gather<T> : &sum_pieces<T>;
    f.then_collective = gather;
    f.started(MPI_Ialltoallv(in, f.counts.data(), f.displs.data(), type<T>(), f.workspace.data(), f.ones.data(),
                             f.steps.data(), type<T>(), comm_, &f.mpi_request));
  }
  template <class T>
  static void sum_pieces(mpi& m, flight& f) {
    f.then = nullptr;
    sum_in_rank_order(reinterpret_cast<const T*>(f.workspace.data()), static_cast<T*>(f.out), f.n,
                      std::size_t(m.size_));
  }
  template <class T>
  static void sum_then_gather(mpi& m, flight& f) {
    sum_pieces<T>(m, f);
    f.then_collective = false;
    f.started(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, f.data, f.counts.data(), f.displs.data(), type<T>(),
                              m.comm_, &f.mpi_request));
  }

  /// Moves flight f along: MPI's part, then the local part that follows it, until done or (unless
  /// `block`) MPI's part is still running. Returns whether it is done; then f is free again. A
  /// failure or a timeout throws; after a timeout f stays taken (MPI may still write into it).
  bool advance(flight& f, bool block) {
    if (!timed_out_call_.empty() && block)  // waiting again would wait out the timeout again
      detail::fail("mpi: ", f.call, " abandoned: the communicator is unusable after a timeout in ", timed_out_call_);
    for (;;) {
      int done = 1;
      if (f.code == MPI_SUCCESS && f.mpi_request != MPI_REQUEST_NULL) {
        if (block && options_.timeout.count() == 0) {
          f.code = MPI_Wait(&f.mpi_request, MPI_STATUS_IGNORE);
        } else if (block) {
          const bool ended = detail::poll_until(options_.timeout, [&] {
            f.code = MPI_Test(&f.mpi_request, &done, MPI_STATUS_IGNORE);
            return f.code != MPI_SUCCESS || done != 0;
          });
          if (!ended) {
            timed_out_call_ = f.call;
            detail::fail("mpi: ", f.call, " did not complete within ", options_.timeout.count(), " ms on rank ", rank_,
                         " of ", size_, ": another rank stopped calling the collectives (it missed a step(), or "
                         "hangs); this communicator is unusable now: end the job, e.g. MPI_Abort");
          }
        } else {
          f.code = MPI_Test(&f.mpi_request, &done, MPI_STATUS_IGNORE);
        }
      }
      if (f.code != MPI_SUCCESS) {
        f.busy = false;
        check(f.code, f.call);
      }
      if (!done) return false;
      // A second collective may only start where every rank starts it, in the same order: in a
      // wait, never on a test that happens to find the first done.
      if (!block && f.then_collective) return false;
      if (!f.then) {
        f.busy = false;
        return true;
      }
      f.then(*this, f);
    }
  }
  /// A request dropped in flight: freed if it has completed, otherwise its flight is never reused.
  void abandon(flight& f) noexcept {
    int done = 0;
    if (f.then == nullptr && MPI_Test(&f.mpi_request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) f.busy = false;
  }

  /// Every rank sends rank r its piece (counts_/displs_); each sums the W pieces it receives in rank
  /// order, in float (double for double) with one final rounding.
  template <class T>
  void ordered_reduce_scatter(std::span<const T> in, std::span<T> out) {
    const std::size_t n = out.size();
    const std::size_t bytes = n * std::size_t(size_) * sizeof(T);
    if (workspace_.size() < bytes) workspace_.resize(bytes);
    T* pieces = reinterpret_cast<T*>(workspace_.data());
    for (std::size_t r = 0; r < std::size_t(size_); ++r) {
      ones_[r] = count(n);
      steps_[r] = count(r * n);
    }
    collective("MPI_Alltoallv", MPI_Alltoallv, MPI_Ialltoallv, in.data(), counts_.data(), displs_.data(), type<T>(),
               pieces, ones_.data(), steps_.data(), type<T>(), comm_);
    sum_in_rank_order(pieces, out.data(), n, std::size_t(size_));
  }
  /// out[i] = pieces[i] + pieces[n + i] + ... over w pieces, in float (double for double), one rounding.
  template <class T>
  static void sum_in_rank_order(const T* pieces, T* out, std::size_t n, std::size_t w) {
    using acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
    for (std::size_t i = 0; i < n; ++i) {
      acc sum = acc(pieces[i]);
      for (std::size_t r = 1; r < w; ++r) sum += acc(pieces[r * n + i]);
      out[i] = T(sum);
    }
  }

  /// All-reduce as a rank-ordered reduce-scatter into near-equal blocks, then an all-gather.
  template <class T>
  void ordered_all_reduce(std::span<T> data) {
    block_counts(data.size(), counts_, displs_);
    const std::size_t me = std::size_t(rank_);
    ordered_reduce_scatter(std::span<const T>(data), data.subspan(std::size_t(displs_[me]), std::size_t(counts_[me])));
    collective("MPI_Allgatherv", MPI_Allgatherv, MPI_Iallgatherv, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data(),
               counts_.data(), displs_.data(), type<T>(), comm_);
  }

  template <class T>
  static MPI_Datatype type() {
    return detail::mpi_type<std::remove_const_t<T>>::type();
  }
  static int count(std::size_t n) {
    if (n > std::size_t(INT_MAX)) detail::fail("mpi: ", n, " elements exceed MPI's int count");
    return int(n);
  }
  /// One collective, `call` named as MPI names it (a string literal). Without a timeout it is the
  /// blocking call, as ever. With one it is the nonblocking twin, polled until it completes or the
  /// timeout passes. `args` are the blocking call's, and the twin takes them and a request, so each
  /// call site is written once.
  template <class... Args>
  void collective(std::string_view call, int (*blocking)(Args...),
                  std::type_identity_t<int (*)(Args..., MPI_Request*)> nonblocking,
                  std::type_identity_t<Args>... args) {
    if (!timed_out_call_.empty())
      detail::fail("mpi: the communicator is unusable after a timeout in ", timed_out_call_, " on rank ", rank_, " of ",
                   size_, "; ", call, " not started: end the job, e.g. MPI_Abort");
    if (options_.timeout.count() == 0) return check(blocking(args...), call);
    MPI_Request request = MPI_REQUEST_NULL;
    check(nonblocking(args..., &request), call);
    int code = MPI_SUCCESS;
    const bool ended = detail::poll_until(options_.timeout, [&] {
      int done = 0;
      code = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      return code != MPI_SUCCESS || done != 0;
    });
    if (ended) return check(code, call);
    // MPI can neither cancel nor free a pending collective: the request is kept (the destructor
    // deals with it), and nothing else may run on this communicator, as the ranks no longer agree
    // on which collective comes next.
    timed_out_ = request;
    timed_out_call_ = call;
    detail::fail("mpi: ", call, " did not complete within ", options_.timeout.count(), " ms on rank ", rank_, " of ",
                 size_, ": another rank stopped calling the collectives (it missed a step(), or hangs); this "
                 "communicator is unusable now: end the job, e.g. MPI_Abort");
  }

  /// The destructor's part after a timeout, without MPI_Wait (it could block forever). If the late
  /// rank has joined since, the collective is complete and one MPI_Test frees its request.
  /// Otherwise it stays pending: MPI_Comm_free is still allowed, it only marks the communicator to
  /// be freed once its pending operations complete (MPI-3.1, 6.4.3). Should a late rank complete it
  /// after all, MPI would read this object's counts and write into its workspace: those are leaked,
  /// not freed. (The caller's buffers are the caller's; after a timeout the job is expected to end.)
  void release_timed_out() {
    int done = 0;
    if (MPI_Test(&timed_out_, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) return;
    for (std::vector<int>* v : {&counts_, &displs_, &ones_, &steps_}) (void)new std::vector<int>(std::move(*v));
    (void)new std::vector<std::byte>(std::move(workspace_));
  }

  static void check(int code, std::string_view call) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    detail::fail("mpi: ", call, " failed: ", std::string_view(text, std::size_t(length)));
  }

  mpi_options options_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> counts_, displs_, ones_, steps_;  // per-rank counts and displacements of v-collectives
  std::vector<std::byte> workspace_;                 // the deterministic mode's received pieces
  MPI_Request timed_out_ = MPI_REQUEST_NULL;         // the collective that timed out, still pending
  std::string_view timed_out_call_;                  // its name; nonempty: the communicator is unusable
  std::vector<std::unique_ptr<flight>> flights_;     // collectives in flight, and free ones to reuse
};

static_assert(nonblocking_communicator<mpi>);

}  // namespace mpopt
