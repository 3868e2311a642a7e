// make_muon_optimizer (configured_optimizer.hpp): Muon for the model's hidden matrices beside AdamW
// for the rest, one optimizer of mpopt::rules<muon, adam> on bf16 parameters, a type a DeepSpeed
// configuration cannot name. make_optimizer_as builds it from the configuration, whose AdamW
// options the AdamW groups take; the Muon group takes Muon's defaults and its group settings. Built
// where a CBLAS is found (Muon's iteration runs on it); this unit compiles Muon's host passes.
#include "configured_optimizer.hpp"

#include <mpopt/adam.hpp>
#include <mpopt/host_passes.hpp>
#include <mpopt/make_optimizer.hpp>
#include <mpopt/muon.hpp>
#include <mpopt/rules.hpp>
#if MPOPT_EXAMPLE_MPI
#include <mpopt/mpi.hpp>
#endif

mpopt::any_optimizer make_muon_optimizer(const mpopt::deepspeed_config& c) {
  using rule = mpopt::rules<mpopt::muon, mpopt::adam>;
#if MPOPT_EXAMPLE_MPI
  return mpopt::make_optimizer_as<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, rule>(c,
                                                                                          mpopt::mpi{MPI_COMM_WORLD});
#else
  return mpopt::make_optimizer_as<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, rule>(c);
#endif
}
