// The snippet of docs/gpu-and-offload.md, "ZeRO-Offload" (over a device communicator), made a
// translation unit; the stand-in is the function around opt. Test doc_snippets compiles it as the
// device tests build without a GPU (mpicxx on Thrust's OpenMP system), or with nvcc.
#include <mpopt/adam.hpp>
#include <mpopt/nccl.hpp>
#include <mpopt/offload.hpp>
#include <mpopt/optimizer.hpp>

using offloaded = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam,
                                   mpopt::offload<mpopt::host>, mpopt::nccl>;

void offload_over_nccl() {
  offloaded opt{mpopt::nccl{MPI_COMM_WORLD}, {.overlap_comm = true}, {}};
}
