// The snippet of docs/gpu-and-offload.md, "ZeRO-Offload", made a translation unit; the stand-ins are
// w and w_grad (views of device memory) and i, a tensor's index. Test doc_snippets compiles it as the
// device tests build without a GPU (mpicxx on Thrust's OpenMP system), or with nvcc.
#include <mpopt/adam.hpp>
#include <mpopt/mpi.hpp>
#include <mpopt/optimizer.hpp>

#include <cstddef>

#include <mpopt/offload.hpp>
using offloaded = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam,
                                   mpopt::offload<mpopt::host>, mpopt::mpi>;

void offload(mpopt::view<mpopt::half> w, mpopt::view<mpopt::half> w_grad, std::size_t i) {
  offloaded opt{mpopt::mpi{MPI_COMM_WORLD}, {.overlap_comm = true}, {}};
  opt.add_group({.lr = 3e-4}).add(w, w_grad, "w");   // device tensors, as with mpopt::cuda
  // backward, as each gradient is stored:
  opt.grad_ready(i);   // tensor i's gradient starts crossing the bus
  opt.step();          // the rest cross, the host steps, the 16-bit parameters go back
}
