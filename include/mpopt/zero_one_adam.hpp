// mpopt — the 0/1 Adam update rule (Lu et al. 2022, arXiv:2202.06009; DeepSpeed ZeroOneAdam).
//
// Adam without bias correction (eps outside the root, u = m / (sqrt(v) + eps) + wd p, p -= lr u)
// that communicates less and less. Phase 1 (the first var_freeze_step applied steps): the variance
// is updated only on variance steps, exponentially spaced, where the gradients are averaged at full
// precision; on the other steps each rank's gradient is averaged by the error-compensated 1-bit
// all-reduce (compressed_allreduce.hpp) and only the momentum moves. Phase 2: the variance is
// frozen, each rank steps on its own gradient, and on sync steps, exponentially spaced up to
// local_step_clipper apart, the ranks average the distance their parameters travelled since the
// last sync (1-bit compressed), return to the synchronised point plus that average, and rebuild
// the momentum from it.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "zero_one_adam_options.hpp"
#include "detail/config.hpp"
#include "detail/math/lamb_math.hpp"
#include "detail/options/validate.hpp"
#include "detail/drivers/zero_one_adam_driver.hpp"

namespace mpopt {

struct zero_one_adam {
  /// Per parameter group (zero_one_adam_options.hpp): DeepSpeed's ZeroOneAdam's options and defaults.
  using options = zero_one_adam_options;

  static constexpr std::string_view name = "zero_one_adam";
  static constexpr std::string_view title = "0/1 Adam";  ///< in messages
  /// The moments, and phase 2's accumulator: minus the distance travelled since the last sync.
  static constexpr std::array<std::string_view, 3> state = {"exp_avg", "exp_avg_sq", "momentum_accumulator"};
  /// As 1-bit Adam's (onebit_adam.hpp): FusedLamb's moments and direction, the step size lr.
  using scalars = detail::lamb_coefficients;

  static scalars prepare(const options& o, std::uint64_t) { return detail::uncorrected_adam(o); }
  /// Variance steps, compressed gradients, local steps and syncs (detail/drivers/zero_one_adam_driver.hpp).
  template <class Precision, class Partition, class Backend, class Communicator>
  using driver = detail::zero_one_adam_driver<zero_one_adam, Precision, Partition, Backend, Communicator>;

  /// A variance step; the other steps' passes are in detail/passes/onebit_passes.hpp.
  template <class E>
  MPOPT_HOST_DEVICE static void update(const scalars& k, E& e) {
    detail::uncorrected_adam_step(k, e);
  }

  // The schedule, a function of the applied step t (1-based) and the options; s = t + 1 is
  // DeepSpeed's count.

  /// Phase 1: whether step t <= var_freeze_step updates the variance (on gradients averaged at
  /// full precision). The variance steps come in blocks of var_update_scaler, the j-th block at the
  /// multiples of 2^j (in s) that follow the previous block: with 16, s = 2..17, 18, 20, .., 48, 52, ..
  static bool variance_step(const options& o, std::uint64_t t) {
    constexpr std::uint64_t most = std::numeric_limits<std::uint64_t>::max();
    const std::uint64_t s = t + 1, count = o.var_update_scaler - 1;  // steps after a block's first
    std::uint64_t last = 1;                                             // DeepSpeed's set-up call
    for (std::uint64_t interval = 1; interval != 0; interval <<= 1) {
      const std::uint64_t q = last / interval + 1;  // the block's first is q intervals
      if (q > most / interval || s < q * interval) return false;
      const std::uint64_t first = q * interval;
      if (count > (most - first) / interval || s <= first + count * interval) return s % interval == 0;
      last = first + count * interval;
    }
    return false;
  }
  /// Phase 2 (t > var_freeze_step): the interval between sync steps, doubled after every
  /// local_step_scaler phase-2 steps, at most local_step_clipper.
  static std::uint64_t local_interval(const options& o, std::uint64_t t) {
    const std::uint64_t doublings = (t - o.var_freeze_step - 1) / o.local_step_scaler;
    return doublings >= 63 ? o.local_step_clipper : std::min(o.local_step_clipper, std::uint64_t{1} << doublings);
  }
  /// Phase 2: whether step t synchronises the ranks.
  static bool sync_step(const options& o, std::uint64_t t) { return (t + 1) % local_interval(o, t) == 0; }
  /// Whether step t's gradients stay on their rank (the engine's all-reduce is off).
  static bool local_gradients(const options& o, std::uint64_t t) {
    return t > o.var_freeze_step || !variance_step(o, t);
  }
};

}  // namespace mpopt

#if defined(MPOPT_SEPARATE_COMPILATION)
#include "detail/backend/host_instances.hpp"
#define MPOPT_HOST_ZERO_ONE_ADAM_PASSES(EXTERN, P) \
  MPOPT_HOST_RULE_STAGE(EXTERN, P, mpopt::zero_one_adam, mpopt::detail::update_stage)
MPOPT_FOR_OWN_PRECISIONS(MPOPT_HOST_ZERO_ONE_ADAM_PASSES, extern)
MPOPT_HOST_RULE_COMPILED(mpopt::zero_one_adam)
MPOPT_FOR_OWN_PRECISIONS(MPOPT_HOST_COMPRESSED_PASSES, extern)
#include "detail/step/standard_optimizers.hpp"
MPOPT_STANDARD_OPTIMIZERS(extern, mpopt::zero_one_adam, MPOPT_STAGE_0_ONLY)
#endif
