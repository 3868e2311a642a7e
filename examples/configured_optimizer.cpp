// make_configured_optimizer (configured_optimizer.hpp): the examples' one translation unit that
// includes make_optimizer.hpp, which instantiates every optimizer a DeepSpeed configuration can
// name. The build compiles it once, into a library that train_mlp and train_gpt share.
#include "configured_optimizer.hpp"

#include <mpopt/make_optimizer.hpp>
#if MPOPT_EXAMPLE_MPI
#include <mpopt/mpi.hpp>
#endif

mpopt::any_optimizer make_configured_optimizer(const mpopt::deepspeed_config& c) {
#if MPOPT_EXAMPLE_MPI
  return mpopt::make_optimizer(c, mpopt::mpi{MPI_COMM_WORLD});
#else
  return mpopt::make_optimizer(c);
#endif
}
