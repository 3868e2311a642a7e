// The optimizer a DeepSpeed configuration describes, over the examples' communicator: MPI's world
// in an MPI build, else one process. configured_optimizer.cpp is the one translation unit that
// instantiates every optimizer a configuration can name, so the examples that include this header
// see only mpopt::any_optimizer and compile fast.
#pragma once

#include <mpopt/any_optimizer.hpp>
#include <mpopt/deepspeed_config.hpp>

#include <string_view>

mpopt::any_optimizer make_configured_optimizer(const mpopt::deepspeed_config& c);

/// The same with Adam's moments stored as `state` (bf16, blockwise8 or blockwise4) and the master as
/// remainder16 (state_optimizer.cpp): `c` must say bf16, no ZeRO and Adam or AdamW.
mpopt::any_optimizer make_state_optimizer(const mpopt::deepspeed_config& c, std::string_view state);

/// Muon (mpopt::rules<muon, adam>) on bf16 parameters, replicated (muon_optimizer.cpp, where a CBLAS is
/// found): a group takes Muon with group_settings{.rule = "muon"}, AdamW with the configuration's
/// options with {.rule = "adam"}. `c` must say bf16, no ZeRO and Adam or AdamW.
mpopt::any_optimizer make_muon_optimizer(const mpopt::deepspeed_config& c);

/// The examples' --rule (adam, lamb, onebit_adam, onebit_lamb, zero_one_adam) as a configuration's
/// rule and optimizer.type.
inline void set_rule(mpopt::deepspeed_config& ds, std::string_view rule) {
  if (rule == "lamb") ds.rule = mpopt::config_rule::lamb, ds.optimizer_type = "Lamb";
  else if (rule == "onebit_adam") ds.rule = mpopt::config_rule::onebit_adam, ds.optimizer_type = "OneBitAdam";
  else if (rule == "onebit_lamb") ds.rule = mpopt::config_rule::onebit_lamb, ds.optimizer_type = "OneBitLamb";
  else if (rule == "zero_one_adam") ds.rule = mpopt::config_rule::zero_one_adam, ds.optimizer_type = "ZeroOneAdam";
  else ds.rule = mpopt::config_rule::adam, ds.optimizer_type = "AdamW";
}
