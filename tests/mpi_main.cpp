// doctest's main for the multi-rank suites: every rank runs every test case (collectives must match),
// rank 0 reports in full, the others only their failures.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context context(argc, argv);
  context.setOption("no-colors", true);  // mpirun may hand us a terminal; logs are parsed
  if (rank != 0) context.setOption("minimal", true);
  const int failed = context.run();
  // Agree on the outcome so every rank exits with the same status.
  int any_failed = failed != 0;
  MPI_Allreduce(MPI_IN_PLACE, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
