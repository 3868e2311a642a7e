// mpopt — the step pipeline's options, common to every policy combination.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "detail/config.hpp"
#include "detail/options/field_refs.hpp"
#include "detail/options/validate.hpp"
#include "fields.hpp"

namespace mpopt {

/// How micro-step gradients are combined at the accumulation boundary.
enum class accumulation { mean, sum };
constexpr std::array<std::string_view, 2> choice_names(accumulation) { return {"mean", "sum"}; }

/// The loss-spike guard (llm.c's outlier detector): each boundary's loss (the mean over its
/// micro-steps and ranks, given to step(loss)) and global gradient norm join a window of the last
/// `window` values, and a step whose value scores above its z (standard deviations above the
/// window's mean, the value included) is skipped, changing nothing. A z of 0 turns its test off
/// (the default: the guard is off); a test acts once its window is full.
struct spike_guard_options {
  static constexpr int max_window = 1 << 16;
  int window = 128;   ///< values per window (llm.c's 128)
  double loss_z = 0;  ///< skip when the loss scores above this; needs step(loss)
  double norm_z = 0;  ///< skip when the gradient norm scores above this

  static constexpr auto fields = mpopt::fields(
      field{"window", &spike_guard_options::window, checks::closed(2, max_window)},
      field{"loss_z", &spike_guard_options::loss_z, checks::at_least(0)},
      field{"norm_z", &spike_guard_options::norm_z, checks::at_least(0)});
};

/// Options of the step pipeline, common to every policy combination.
struct optimizer_options {
  double clip_grad = 1.0;                     ///< max global L2 norm of the true gradient; 0 disables (DeepSpeed default 1.0)
  int accumulation_steps = 1;                 ///< micro-steps per optimizer step
  accumulation combine = accumulation::mean;  ///< mean or sum of the micro-step gradients
  bool skip_nonfinite = true;                 ///< skip steps with inf/NaN gradients (always on with a loss scaler)
  std::uint64_t max_consecutive_skips = 0;    ///< throw after this many skips in a row; 0: never
  std::size_t bucket_elements = std::size_t{1} << 24;  ///< elements per reduce-scatter or all-gather (and per
                                                       ///< all-reduce when it needs a type conversion)
  /// Gradients are divided by this before they are summed across ranks and multiplied back after:
  /// a factor near the world size keeps a 16-bit sum from overflowing (DeepSpeed's
  /// gradient_predivide_factor). It changes rounding, not the mean; one rank sends nothing and
  /// ignores it.
  double gradient_predivide = 1.0;
  /// Replicated: form the norm sums per would-be shard of the world size and add them in rank order,
  /// as zero1/zero2 must. With a deterministic communicator (mpi_options::deterministic) the three
  /// partitions then train bit for bit alike; by default replicated sums in one sequence, like a
  /// single process.
  bool sum_by_shard = false;
  /// Seeds stochastic rounding (precision policies with mpopt::stochastic_rounding; ignored by the
  /// others): the same seed gives the same bits on any thread count, SIMD level, backend and world
  /// size. A checkpoint saved under stochastic rounding keeps it, and load() takes it back.
  std::uint64_t rounding_seed = 0;
  /// Leave collectives in flight (DeepSpeed's overlap_comm; needs a nonblocking_communicator):
  /// grad_ready() starts each completed bucket's reduction and returns (zero2 every micro-step;
  /// replicated and zero1 at the window's last one), and step() waits only for what is still
  /// running. step() returns with every parameter updated, as without. Results are the same bits.
  bool overlap_comm = false;
  /// Buckets whose collectives may be in flight at once under overlap_comm, each with a staging
  /// buffer of its own (bucket_elements wide); DeepSpeed's double buffer is 2.
  int buckets_in_flight = 2;
  /// Under overlap_comm with zero1/zero2, step() returns with the updated parameters' all-gather
  /// still running, so that the next forward overlaps it: the other ranks' pieces of a tensor hold
  /// the last step's values until wait_params(i) (or wait_params() for all) returns. The next
  /// grad_ready(), step() or save() throws mpopt::error, changing nothing, if a tensor was not
  /// waited for. Off (the default): step() returns with every parameter updated.
  bool leave_param_gather_in_flight = false;
  /// Skips steps whose loss or gradient norm spikes (off by default); see spike_guard_options.
  spike_guard_options spike_guard{};

  static constexpr auto fields = mpopt::fields(
      field{"clip_grad", &optimizer_options::clip_grad, checks::at_least(0)},
      field{"accumulation_steps", &optimizer_options::accumulation_steps, checks::at_least(1)},
      field{"combine", &optimizer_options::combine},
      field{"skip_nonfinite", &optimizer_options::skip_nonfinite},
      field{"max_consecutive_skips", &optimizer_options::max_consecutive_skips},
      field{"bucket_elements", &optimizer_options::bucket_elements, checks::closed(1, 1 << 30)},
      field{"gradient_predivide", &optimizer_options::gradient_predivide, checks::float_scale},
      field{"sum_by_shard", &optimizer_options::sum_by_shard},
      field{"rounding_seed", &optimizer_options::rounding_seed},
      field{"overlap_comm", &optimizer_options::overlap_comm},
      field{"buckets_in_flight", &optimizer_options::buckets_in_flight, checks::closed(1, 64)},
      field{"leave_param_gather_in_flight", &optimizer_options::leave_param_gather_in_flight},
      field{"spike_guard", &optimizer_options::spike_guard});
};

/// What load() does with state that cannot carry over.
struct load_options {
  /// 1-bit LAMB: a file saved in the compression stage by W > 1 ranks holds their error-feedback
  /// buffers, which belong to those ranks. Loading on another number of ranks (above 1) throws
  /// unless this is set; then the errors start at zero, as DeepSpeed always does on load.
  bool reset_compression_errors = false;
};

namespace detail {
/// o, checked (`unscaled`: the loss scaler is mpopt::no_scaling; `nonblocking`: the communicator
/// can leave collectives in flight); throws naming the first bad field.
MPOPT_DECL optimizer_options validated(optimizer_options o, bool unscaled, bool nonblocking = true);
}  // namespace detail

}  // namespace mpopt

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "options.ipp"
#endif
