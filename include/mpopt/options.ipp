// mpopt — the step pipeline's options' definitions (options.hpp): inline header-only, else compiled
// once by <mpopt/src.hpp>.
#pragma once

#include "options.hpp"

#include <cmath>

namespace mpopt::detail {

MPOPT_DECL optimizer_options validated(optimizer_options o, bool unscaled, bool nonblocking) {
  check_options(o, "");
  if (o.leave_param_gather_in_flight && !o.overlap_comm)
    fail("leave_param_gather_in_flight needs overlap_comm: without it every collective is waited for at once");
  if (o.overlap_comm && !nonblocking)
    fail("overlap_comm needs a communicator with nonblocking collectives (mpopt::nonblocking_communicator: "
         "start_all_reduce, start_reduce_scatter, start_all_gather), as mpopt::mpi and mpopt::nccl have");
  // Of n values, the newest scores at most sqrt(n - 1) standard deviations above their mean.
  const double reach = std::sqrt(double(o.spike_guard.window) - 1);
  auto check_z = [&](const char* field, double z) {
    if (z >= reach)
      fail(field, " = ", z, " never skips: in a window of ", o.spike_guard.window, " values none scores above sqrt(",
           o.spike_guard.window, " - 1) = ", reach, "; lower it or widen the window");
  };
  check_z("spike_guard.loss_z", o.spike_guard.loss_z);
  check_z("spike_guard.norm_z", o.spike_guard.norm_z);
  if (!o.skip_nonfinite && !unscaled)
    fail("skip_nonfinite = false needs mpopt::no_scaling: a loss-scaled step must skip on overflow");
  return o;
}

}  // namespace mpopt::detail
