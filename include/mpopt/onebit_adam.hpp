// mpopt — the 1-bit Adam update rule (Tang et al. 2021, arXiv:2102.02888; DeepSpeed OnebitAdam).
//
// Warm-up: for the first freeze_step applied steps, Adam on gradients averaged over ranks, without
// bias correction and with eps outside the square root: u = m / (sqrt(v) + eps) + wd p, p -= lr u.
// Then the variance is frozen, gradients stay on their rank, and each rank's momentum
// m = beta1 m + (1 - beta1) g is averaged by the error-compensated 1-bit all-reduce
// (compressed_allreduce.hpp) before the same update with the frozen variance.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "onebit_adam_options.hpp"
#include "detail/config.hpp"
#include "detail/math/lamb_math.hpp"
#include "detail/drivers/onebit_adam_driver.hpp"
#include "detail/options/validate.hpp"

namespace mpopt {

struct onebit_adam {
  /// Per parameter group (onebit_adam_options.hpp): DeepSpeed's OnebitAdam's options and defaults.
  using options = onebit_adam_options;

  static constexpr std::string_view name = "onebit_adam";
  static constexpr std::string_view title = "1-bit Adam";  ///< in messages
  static constexpr std::array<std::string_view, 2> state = {"exp_avg", "exp_avg_sq"};
  /// DeepSpeed's OnebitAdam moves its moments and direction as FusedLamb does (uncorrected, eps
  /// outside the root), without the trust ratio: the step size is lr.
  using scalars = detail::lamb_coefficients;

  static scalars prepare(const options& o, std::uint64_t) { return detail::uncorrected_adam(o); }
  /// Warm-up, then compressed exchanges of the momentum (detail/drivers/onebit_adam_driver.hpp).
  template <class Precision, class Partition, class Backend, class Communicator>
  using driver = detail::onebit_adam_driver<onebit_adam, Precision, Partition, Backend, Communicator>;

  /// A warm-up step; the compression stage's passes are in detail/passes/onebit_passes.hpp.
  template <class E>
  MPOPT_HOST_DEVICE static void update(const scalars& k, E& e) {
    detail::uncorrected_adam_step(k, e);
  }
};

}  // namespace mpopt

#if defined(MPOPT_SEPARATE_COMPILATION)
#include "detail/backend/host_instances.hpp"
#define MPOPT_HOST_ONEBIT_ADAM_PASSES(EXTERN, P) \
  MPOPT_HOST_RULE_STAGE(EXTERN, P, mpopt::onebit_adam, mpopt::detail::update_stage)
MPOPT_FOR_OWN_PRECISIONS(MPOPT_HOST_ONEBIT_ADAM_PASSES, extern)
MPOPT_HOST_RULE_COMPILED(mpopt::onebit_adam)
MPOPT_FOR_OWN_PRECISIONS(MPOPT_HOST_COMPRESSED_PASSES, extern)
#include "detail/step/standard_optimizers.hpp"
MPOPT_STANDARD_OPTIMIZERS(extern, mpopt::onebit_adam, MPOPT_STAGE_0_ONLY)
#endif
