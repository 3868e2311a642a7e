// The snippet of docs/compressed-rules.md, "1-bit LAMB", made a translation unit; the stand-ins are
// weight, weight_grad and the step after the comment.
#include <mpopt/mpi.hpp>
#include <mpopt/onebit_lamb.hpp>
#include <mpopt/optimizer.hpp>

#include <vector>

void onebit_lamb() {
  std::vector<mpopt::half> weight(4096), weight_grad(4096);
  using optimizer = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::onebit_lamb,
                                     mpopt::host, mpopt::mpi>;
  optimizer opt{mpopt::mpi{MPI_COMM_WORLD}, {.clip_grad = 1.0}};  // collective: checks the communicator
  opt.add_group({.lr = 1e-2, .weight_decay = 0.01, .freeze_step = 400}).add(weight, weight_grad, "weight");
  // step() as always; status.compression_step turns nonzero when compression starts
  const mpopt::step_status status = opt.step();
  [[maybe_unused]] const bool compressing = status.compression_step != 0;
}
