// make_state_optimizer (configured_optimizer.hpp): AdamW on bf16 parameters whose moments are stored
// in less than fp32 and whose master is the parameter and its 16-bit remainder, types a DeepSpeed
// configuration cannot name. make_optimizer_as builds each from the configuration, which must agree
// with it (bf16, no ZeRO, AdamW); this unit compiles their host passes (host_passes.hpp), which the
// separately compiled mode has only for mpopt's own precisions.
#include "configured_optimizer.hpp"

#include <mpopt/host_passes.hpp>
#include <mpopt/make_optimizer.hpp>
#include <mpopt/state_precision.hpp>
#if MPOPT_EXAMPLE_MPI
#include <mpopt/mpi.hpp>
#endif

#include <stdexcept>
#include <string>

namespace {

template <class State>
mpopt::any_optimizer make_with(const mpopt::deepspeed_config& c) {
  using precision = mpopt::with_state<mpopt::bf16, State, mpopt::remainder16>;
#if MPOPT_EXAMPLE_MPI
  return mpopt::make_optimizer_as<precision, mpopt::no_scaling, mpopt::replicated, mpopt::adam>(
      c, mpopt::mpi{MPI_COMM_WORLD});
#else
  return mpopt::make_optimizer_as<precision, mpopt::no_scaling, mpopt::replicated, mpopt::adam>(c);
#endif
}

}  // namespace

mpopt::any_optimizer make_state_optimizer(const mpopt::deepspeed_config& c, std::string_view state) {
  if (state == "bf16") return make_with<mpopt::bf16_state<>>(c);
  if (state == "blockwise8") return make_with<mpopt::blockwise8_state>(c);
  if (state == "blockwise4") return make_with<mpopt::blockwise4_state>(c);
  throw std::invalid_argument("make_state_optimizer: no state storage '" + std::string(state) +
                              "' (bf16, blockwise8 or blockwise4)");
}
