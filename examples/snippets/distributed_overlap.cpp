// The snippet of docs/distributed.md, "Overlapping communication with backward", made a translation
// unit; the stand-ins are optimizer (that of "ZeRO stage 1 and 2") and i, a tensor's index.
#include <mpopt/adam.hpp>
#include <mpopt/mpi.hpp>
#include <mpopt/optimizer.hpp>

#include <cstddef>

using optimizer = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam,
                                   mpopt::host, mpopt::mpi>;

void overlap(std::size_t i) {
  optimizer opt{mpopt::mpi{MPI_COMM_WORLD}, {.bucket_elements = 1 << 24, .overlap_comm = true}};
  // backward, as each gradient is stored (last layers first):
  opt.grad_ready(i);          // starts every bucket now complete, and returns
  opt.step();                 // waits for what is still running, then steps: the parameters are updated
}
