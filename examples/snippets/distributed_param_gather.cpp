// The snippet of docs/distributed.md, "Overlapping communication with backward" (the all-gather left
// in flight), made a translation unit; the stand-ins are optimizer (that of "ZeRO stage 1 and 2") and
// i, a tensor's index.
#include <mpopt/adam.hpp>
#include <mpopt/mpi.hpp>
#include <mpopt/optimizer.hpp>

#include <cstddef>

using optimizer = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam,
                                   mpopt::host, mpopt::mpi>;

void param_gather(std::size_t i) {
  optimizer opt{mpopt::mpi{MPI_COMM_WORLD}, {.overlap_comm = true, .leave_param_gather_in_flight = true}};
  opt.step();                 // returns with the parameters' all-gather in flight
  // forward, as each layer is reached:
  opt.wait_params(i);         // tensor i holds the update (or opt.wait_params() for all)
}
