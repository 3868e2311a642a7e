// The snippet of docs/distributed.md, "Data parallel over MPI", made a translation unit; the stand-in
// is the function around opt.
#include <mpopt/adam.hpp>
#include <mpopt/mpi.hpp>
#include <mpopt/optimizer.hpp>

using optimizer = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::adam,
                                   mpopt::host, mpopt::mpi>;

void data_parallel() {
  optimizer opt{mpopt::mpi{MPI_COMM_WORLD}, {.clip_grad = 1.0}};   // or a data-parallel sub-communicator
}
