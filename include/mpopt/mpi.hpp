// mpopt — the MPI communicator (Open MPI or any MPI-3 library). Include it separately: mpopt.hpp
// needs no MPI header.
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only: Open MPI's C++ bindings warn under -Wextra
#endif
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "communicator.hpp"
#include "detail/validate.hpp"
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
template <>
struct mpi_type<float> {
  static MPI_Datatype type() { return MPI_FLOAT; }
  static MPI_Op op(reduce_op o) { return o == reduce_op::sum ? MPI_SUM : MPI_MAX; }
};
template <>
struct mpi_type<double> {
  static MPI_Datatype type() { return MPI_DOUBLE; }
  static MPI_Op op(reduce_op o) { return o == reduce_op::sum ? MPI_SUM : MPI_MAX; }
};
template <>
struct mpi_type<std::uint8_t> {
  static MPI_Datatype type() { return MPI_UINT8_T; }
  static MPI_Op op(reduce_op o) { return o == reduce_op::sum ? MPI_SUM : MPI_MAX; }
};
template <>
struct mpi_type<std::int64_t> {
  static MPI_Datatype type() { return MPI_INT64_T; }
  static MPI_Op op(reduce_op o) { return o == reduce_op::sum ? MPI_SUM : MPI_MAX; }
};
template <>
struct mpi_type<std::uint64_t> {
  static MPI_Datatype type() { return MPI_UINT64_T; }
  static MPI_Op op(reduce_op o) { return o == reduce_op::sum ? MPI_SUM : MPI_MAX; }
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

/// Collectives over an MPI communicator (e.g. MPI_COMM_WORLD or a data-parallel sub-communicator).
/// It works on its own duplicate of the communicator, with errors returned rather than fatal, so
/// a failing collective becomes an mpopt::error and the user's communicator is left as it was.
class mpi {
 public:
  static constexpr std::string_view name = "mpi";

  explicit mpi(MPI_Comm comm) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) detail::fail("mpi: MPI_Init has not been called");
    if (comm == MPI_COMM_NULL) detail::fail("mpi: the communicator is MPI_COMM_NULL");
    check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  mpi(mpi&& o) noexcept : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), rank_(o.rank_), size_(o.size_) {}
  mpi(const mpi&) = delete;  // duplicating is collective: do it explicitly with mpi(other.native())
  mpi& operator=(const mpi&) = delete;
  mpi& operator=(mpi&&) = delete;
  ~mpi() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm native() const { return comm_; }

  template <class T>
  void all_reduce(std::span<T> data, reduce_op op) {
    // Element-wise, so counts beyond int range go in pieces.
    for (std::size_t at = 0; at < data.size(); at += max_count) {
      const int n = int(std::min<std::size_t>(max_count, data.size() - at));
      check(MPI_Allreduce(MPI_IN_PLACE, data.data() + at, n, type<T>(), detail::mpi_type<T>::op(op), comm_),
            "MPI_Allreduce");
    }
  }
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    detail::check_blocks("reduce_scatter", in.size(), out.size(), std::size_t(size_), 1);
    check(MPI_Reduce_scatter_block(in.data(), out.data(), count(out.size()), type<T>(), detail::mpi_type<T>::op(op), comm_),
          "MPI_Reduce_scatter_block");
  }
  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    detail::check_blocks("all_gather", in.size(), out.size(), 1, std::size_t(size_));
    check(MPI_Allgather(in.data(), count(in.size()), type<T>(), out.data(), count(in.size()), type<T>(), comm_),
          "MPI_Allgather");
  }
  template <class T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    detail::check_blocks("all_to_all", in.size(), out.size(), 1, 1);
    if (in.size() % std::size_t(size_) != 0)
      detail::fail("all_to_all: ", in.size(), " elements do not split into ", size_, " equal blocks");
    const int block = count(in.size() / std::size_t(size_));
    check(MPI_Alltoall(in.data(), block, type<T>(), out.data(), block, type<T>(), comm_), "MPI_Alltoall");
  }
  template <class T>
  void broadcast(std::span<T> data, int root) {
    if (root < 0 || root >= size_) detail::fail("broadcast: root ", root, " is not a rank of ", size_);
    check(MPI_Bcast(data.data(), count(data.size()), type<T>(), root, comm_), "MPI_Bcast");
  }
  void barrier() { check(MPI_Barrier(comm_), "MPI_Barrier"); }

 private:
  static constexpr std::size_t max_count = std::size_t{1} << 30;

  template <class T>
  static MPI_Datatype type() {
    return detail::mpi_type<std::remove_const_t<T>>::type();
  }
  static int count(std::size_t n) {
    if (n > std::size_t(INT_MAX)) detail::fail("mpi: ", n, " elements exceed MPI's int count");
    return int(n);
  }
  static void check(int code, std::string_view call) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    detail::fail("mpi: ", call, " failed: ", std::string_view(text, std::size_t(length)));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

static_assert(communicator<mpi>);

}  // namespace mpopt
