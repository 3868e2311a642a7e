// mpopt — mixed-precision, partitioned optimizers for C++ training engines. Include this one header.
#pragma once

#include "version.hpp"  // IWYU pragma: export
#include "adam.hpp"           // IWYU pragma: export
#include "backend.hpp"        // IWYU pragma: export
#include "checkpoint.hpp"     // IWYU pragma: export
#include "communicator.hpp"   // IWYU pragma: export
#include "compressed_allreduce.hpp"  // IWYU pragma: export
#include "convert.hpp"        // IWYU pragma: export
#include "error.hpp"          // IWYU pragma: export
#include "host.hpp"           // IWYU pragma: export
#include "host_passes.hpp"    // IWYU pragma: export
#include "lamb.hpp"           // IWYU pragma: export
#include "loss_scale.hpp"     // IWYU pragma: export
#include "lr_schedule.hpp"    // IWYU pragma: export
#include "memory_report.hpp"  // IWYU pragma: export
#include "numeric.hpp"        // IWYU pragma: export
#include "onebit_adam.hpp"    // IWYU pragma: export
#include "onebit_lamb.hpp"    // IWYU pragma: export
#include "optimizer.hpp"      // IWYU pragma: export
#include "options.hpp"        // IWYU pragma: export
#include "partition.hpp"      // IWYU pragma: export
#include "precision.hpp"      // IWYU pragma: export
#include "rule.hpp"           // IWYU pragma: export
#include "state_precision.hpp"  // IWYU pragma: export
#include "status.hpp"         // IWYU pragma: export
#include "tensor.hpp"         // IWYU pragma: export
#include "zero_one_adam.hpp"  // IWYU pragma: export
