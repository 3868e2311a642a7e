// The snippet of docs/distributed.md, "Timeouts", made a translation unit; the stand-in is optimizer
// (that of "Data parallel over MPI").
#include <mpopt/adam.hpp>
#include <mpopt/mpi.hpp>
#include <mpopt/optimizer.hpp>

#include <chrono>

using optimizer = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::adam,
                                   mpopt::host, mpopt::mpi>;

void timeout() {
  using namespace std::chrono_literals;
  optimizer opt{mpopt::mpi{MPI_COMM_WORLD, {.timeout = 10min}}, {.clip_grad = 1.0}};
}
