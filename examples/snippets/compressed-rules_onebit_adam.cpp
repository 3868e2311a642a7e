// The snippet of docs/compressed-rules.md, "1-bit Adam", made a translation unit; the stand-ins are
// weight and weight_grad.
#include <mpopt/mpi.hpp>
#include <mpopt/onebit_adam.hpp>
#include <mpopt/optimizer.hpp>

#include <vector>

void onebit_adam() {
  std::vector<mpopt::half> weight(4096), weight_grad(4096);
  using optimizer = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::onebit_adam,
                                     mpopt::host, mpopt::mpi>;
  optimizer opt{mpopt::mpi{MPI_COMM_WORLD}, {.clip_grad = 1.0}};  // collective: checks the communicator
  opt.add_group({.lr = 1e-3, .weight_decay = 0.01, .freeze_step = 400}).add(weight, weight_grad, "weight");
}
