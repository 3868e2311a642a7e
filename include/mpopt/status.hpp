// mpopt — what step() reports. Never silent: every call says whether the weights moved and why.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <cstdint>
#include <limits>
#include <string_view>

namespace mpopt {

enum class step_result {
  applied,              ///< the update ran
  accumulating,         ///< a micro-step: gradients were folded into the accumulator
  skipped_nonfinite,    ///< some gradient element was inf or NaN on some rank (finite ones always
                        ///< give a finite norm: its squares are summed in double)
  skipped_loss_spike,    ///< the spike guard: the loss scored above spike_guard.loss_z
  skipped_norm_spike     ///< the spike guard: the gradient norm scored above spike_guard.norm_z
};

constexpr std::string_view to_string(step_result r) {
  switch (r) {
    case step_result::applied: return "applied";
    case step_result::accumulating: return "accumulating";
    case step_result::skipped_nonfinite: return "skipped: non-finite gradient";
    case step_result::skipped_loss_spike: return "skipped: loss spike";
    case step_result::skipped_norm_spike: return "skipped: gradient norm spike";
  }
  return "?";
}

struct step_status {
  step_result result = step_result::accumulating;
  bool applied = false;
  double scale_before = 1;         ///< the loss scale the gradients were made with
  double scale_after = 1;          ///< the scale for the next backward
  double grad_norm = 0;            ///< global L2 norm of the true (unscaled, averaged) gradient
  double grad_norm_clipped = 0;    ///< the norm after clipping
  double clip_coef = 1;            ///< min(1, clip / (grad_norm + 1e-6)), 1 without clipping
  std::uint64_t step = 0;          ///< applied steps of group 0 after this call (see param_group::step)
  std::uint64_t skipped_steps = 0; ///< skipped steps since construction (or load)
  std::uint64_t consecutive_skips = 0;
  int micro_step = 0;              ///< micro-steps accumulated so far (accumulating only)
  /// Bytes this rank handed the communicator for this call (its whole input to an all-reduce,
  /// reduce-scatter or all-to-all, its own piece of an all-gather), including grad_ready's.
  std::uint64_t comm_bytes = 0;
  /// comm_bytes / (4 bytes x parameters): about 1 for an fp32 all-reduce of every gradient.
  double comm_ratio = 0;
  /// 1-bit LAMB: the first step whose momentum was averaged compressed (0 while warming up).
  std::uint64_t compression_step = 0;

  /// The spike guard's scores of this boundary's loss and gradient norm (spike_guard_options): NaN
  /// while a test is off, its window not yet full, or between boundaries; +inf for a non-finite value.
  double loss_z = std::numeric_limits<double>::quiet_NaN();
  double norm_z = std::numeric_limits<double>::quiet_NaN();

  bool skipped() const { return result != step_result::applied && result != step_result::accumulating; }
  std::string_view reason() const { return to_string(result); }
};

}  // namespace mpopt
