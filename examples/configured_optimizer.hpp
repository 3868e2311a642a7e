// The optimizer a DeepSpeed configuration describes, over the examples' communicator: MPI's world
// in an MPI build, else one process. configured_optimizer.cpp is the one translation unit that
// instantiates every optimizer a configuration can name, so the examples that include this header
// see only mpopt::any_optimizer and compile fast.
#pragma once

#include <mpopt/any_optimizer.hpp>
#include <mpopt/deepspeed_config.hpp>

mpopt::any_optimizer make_configured_optimizer(const mpopt::deepspeed_config& c);
