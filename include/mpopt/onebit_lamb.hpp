// mpopt — the 1-bit LAMB update rule (Li et al. 2021, arXiv:2104.06069; DeepSpeed OnebitLamb).
//
// Warm-up: for the first freeze_step applied steps, plain LAMB on gradients averaged over ranks,
// without bias correction and with eps outside the square root (lamb_math.hpp), while a running
// average of each tensor's LAMB coefficient is kept. At the last warm-up step the variance is
// frozen (and copied as a "fresh" one). Compression stage: gradients stay on their rank; each rank
// advances its momentum locally, the momentum is averaged by the error-compensated 1-bit all-reduce
// (compressed_allreduce.hpp), the frozen variance preconditions it, and the frozen coefficient is
// scaled by a factor that tracks how far the fresh variance has drifted from the frozen one.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>

#include "detail/drivers/onebit_lamb_driver.hpp"
#include "lamb.hpp"
#include "onebit_lamb_options.hpp"

namespace mpopt {

struct onebit_lamb {
  /// Per parameter group (onebit_lamb_options.hpp): DeepSpeed's OnebitLamb's options and defaults.
  using options = onebit_lamb_options;

  static constexpr std::string_view name = "onebit_lamb";
  static constexpr std::string_view title = "1-bit LAMB";  ///< in messages
  /// LAMB's moments, and the fresh variance of the compression stage (zero until freeze_step).
  static constexpr std::array<std::string_view, 3> state = {"exp_avg", "exp_avg_sq", "exp_avg_sq_fresh"};
  static constexpr std::string_view tensor_state = lamb::tensor_state;
  using scalars = lamb::scalars;

  /// LAMB's scalars with eps outside the square root and no bias correction (DeepSpeed ignores
  /// eps_inside_sqrt and bias_correction): the step size is lr.
  static scalars prepare(const options& o, std::uint64_t) {
    return {float(o.beta1), float(o.beta2), float(1.0 - o.beta1), float(1.0 - o.beta2), float(o.eps),
            float(o.weight_decay), false, o.lr, o.min_coeff, o.max_coeff};
  }
  /// Warm-up, then compressed exchanges of the momentum: a step that is not a fixed chain of
  /// passes, so the rule names its own driver (detail/drivers/rule_driver.hpp, detail/drivers/onebit_lamb_driver.hpp).
  template <class Precision, class Partition, class Backend, class Communicator>
  using driver = detail::onebit_lamb_driver<onebit_lamb, Precision, Partition, Backend, Communicator>;

  // Warm-up steps are LAMB's stages; the compression stage's passes are in detail/passes/onebit_passes.hpp.
  template <class E>
  MPOPT_HOST_DEVICE static void direction(const scalars& k, E& e) {
    lamb::direction(k, e);
  }
  MPOPT_HOST_DEVICE static float tensor_scale(const scalars& k, double weight_norm, double update_norm, double& ratio) {
    return lamb::tensor_scale(k, weight_norm, update_norm, ratio);
  }
  template <class E>
  MPOPT_HOST_DEVICE static void update(const scalars& k, E& e) {
    lamb::update(k, e);
  }

  /// Warm-up: the running average of the LAMB coefficient, left alone when the coefficient is
  /// exactly 1 (a zero norm), as DeepSpeed does.
  static double freeze_coefficient(double frozen, double coeff, const options& o) {
    return coeff != 1.0 ? o.coeff_beta * frozen + (1.0 - o.coeff_beta) * coeff : frozen;
  }

  /// Compression stage: the factor on the frozen coefficient. max_ratio is the largest
  /// (sqrt(v) + eps) / (sqrt(v_fresh) + eps) of the tensor; with weight decay it is pulled toward 1
  /// by r = min(1, ||u0|| / ||u||) (u0 the update without decay; r = 1 when ||u|| = 0), clamped to
  /// [factor_min, factor_max], then to within factor_threshold of the last factor.
  static double compression_factor(double max_ratio, double prelim_norm, double update_norm, double last,
                                   const options& o) {
    double f = max_ratio;
    if (o.weight_decay > 0) {
      const double r = update_norm > 0 ? std::min(1.0, prelim_norm / update_norm) : 1.0;
      f = f * r + (1.0 - r);
    }
    f = std::clamp(f, o.factor_min, o.factor_max);
    return std::clamp(f, last * (1.0 - o.factor_threshold), last * (1.0 + o.factor_threshold));
  }
};

}  // namespace mpopt

#if defined(MPOPT_SEPARATE_COMPILATION)
#include "detail/backend/host_instances.hpp"
#define MPOPT_HOST_ONEBIT_LAMB_PASSES(EXTERN, P) \
  MPOPT_HOST_RULE_STAGE(EXTERN, P, mpopt::onebit_lamb, mpopt::detail::direction_stage) \
  MPOPT_HOST_RULE_STAGE(EXTERN, P, mpopt::onebit_lamb, mpopt::detail::update_stage)
MPOPT_FOR_OWN_PRECISIONS(MPOPT_HOST_ONEBIT_LAMB_PASSES, extern)
MPOPT_HOST_RULE_COMPILED(mpopt::onebit_lamb)
MPOPT_FOR_OWN_PRECISIONS(MPOPT_HOST_COMPRESSED_PASSES, extern)
#include "detail/step/standard_optimizers.hpp"
MPOPT_STANDARD_OPTIMIZERS(extern, mpopt::onebit_lamb, MPOPT_STAGE_0_ONLY)
#endif
