// The snippet of docs/compressed-rules.md, "0/1 Adam", made a translation unit; the stand-ins are
// weight and weight_grad.
#include <mpopt/mpi.hpp>
#include <mpopt/optimizer.hpp>
#include <mpopt/zero_one_adam.hpp>

#include <vector>

void zero_one_adam() {
  std::vector<mpopt::bfloat16> weight(4096), weight_grad(4096);
  using optimizer = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::zero_one_adam,
                                     mpopt::host, mpopt::mpi>;
  optimizer opt{mpopt::mpi{MPI_COMM_WORLD}, {.clip_grad = 1.0}};
  opt.add_group({.lr = 1e-3, .var_freeze_step = 400, .local_step_scaler = 100}).add(weight, weight_grad, "w");
}
