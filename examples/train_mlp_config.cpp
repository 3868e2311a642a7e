// train_mlp --config: the example's one translation unit that includes make_optimizer.hpp, which
// instantiates every optimizer a DeepSpeed configuration can name (28 of them). train_mlp.cpp sees
// only mpopt::any_optimizer, so its own compile time does not grow, and a build compiles the two
// files side by side.
#include <mpopt/make_optimizer.hpp>
#if MPOPT_EXAMPLE_MPI
#include <mpopt/mpi.hpp>
#endif

/// The optimizer `c` describes, over the example's communicator (train_mlp.cpp declares it).
mpopt::any_optimizer make_configured_optimizer(const mpopt::deepspeed_config& c) {
#if MPOPT_EXAMPLE_MPI
  return mpopt::make_optimizer(c, mpopt::mpi{MPI_COMM_WORLD});
#else
  return mpopt::make_optimizer(c);
#endif
}
