// The examples' view of the processes they run in: MPI's world in an MPI build (MPOPT_EXAMPLE_MPI,
// started alone or under mpirun), else one process. Every rank trains on its own share of the
// data; the optimizer's communicator sums the gradients over the ranks.
#pragma once

#include <mpopt/communicator.hpp>
#if MPOPT_EXAMPLE_MPI
#include <mpopt/mpi.hpp>
#endif

#include <vector>

namespace example {

#if MPOPT_EXAMPLE_MPI
constexpr bool with_mpi = true;
using communicator = mpopt::mpi;
inline communicator make_communicator() { return mpopt::mpi{MPI_COMM_WORLD}; }
inline int world(int (*query)(MPI_Comm, int*)) {
  int v = 0;
  query(MPI_COMM_WORLD, &v);
  return v;
}
inline int world_rank() { return world(MPI_Comm_rank); }
inline int world_size() { return world(MPI_Comm_size); }
/// Each rank's value, on rank 0 (empty elsewhere).
inline std::vector<unsigned long long> gather_on_rank0(unsigned long long mine) {
  std::vector<unsigned long long> all(world_rank() == 0 ? std::size_t(world_size()) : 0);
  MPI_Gather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  return all;
}
inline double sum_over_ranks(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return x;
}
#else
constexpr bool with_mpi = false;
using communicator = mpopt::single_process;
inline communicator make_communicator() { return {}; }
inline int world_rank() { return 0; }
inline int world_size() { return 1; }
inline std::vector<unsigned long long> gather_on_rank0(unsigned long long mine) { return {mine}; }
inline double sum_over_ranks(double x) { return x; }
#endif

inline double mean_over_ranks(double x) { return sum_over_ranks(x) / world_size(); }

}  // namespace example
