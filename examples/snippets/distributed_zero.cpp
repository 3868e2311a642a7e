// The snippet of docs/distributed.md, "ZeRO stage 1 and 2", made a translation unit; the stand-in is
// i, a tensor's index.
#include <mpopt/adam.hpp>
#include <mpopt/mpi.hpp>
#include <mpopt/optimizer.hpp>

#include <cstddef>

void zero(std::size_t i) {
  using optimizer = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam,
                                     mpopt::host, mpopt::mpi>;
  optimizer opt{mpopt::mpi{MPI_COMM_WORLD}, {.bucket_elements = 1 << 24}};
  // backward, as each gradient is stored (last layers first):
  opt.grad_ready(i);
  // then, as always:
  opt.step();
}
