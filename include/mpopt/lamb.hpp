// mpopt — the LAMB update rule (FusedLamb math): per-tensor trust ratio on uncorrected moments.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>

#include "detail/config.hpp"
#include "detail/math/lamb_math.hpp"
#include "detail/options/validate.hpp"
#include "detail/options/adam_family.hpp"
#include "fields.hpp"

namespace mpopt {

struct lamb {
  /// Per parameter group. Defaults are FusedLamb's.
  struct options {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;
    bool bias_correction = true;  ///< enters only the step size: lr * sqrt(1 - beta2^t) / (1 - beta1^t)
    bool eps_inside_sqrt = false;
    double min_coeff = 0.01;
    double max_coeff = 10.0;

    static constexpr auto fields = std::tuple_cat(detail::adam_family_fields<options>(), mpopt::fields(
        field{"bias_correction", &options::bias_correction},
        field{"eps_inside_sqrt", &options::eps_inside_sqrt},
        field{"min_coeff", &options::min_coeff, checks::at_least(0)},
        field{"max_coeff", &options::max_coeff, checks::above(0)}));

    /// The clamp is an interval, and the update's float factor fits a float: the step size (largest
    /// at step 1 or in the limit, lr) times a ratio.
    void validate(std::string_view group) const {
      detail::require_coeff_order(group, min_coeff, max_coeff);
      const double largest = std::max(step_size(*this, 1), lr) * max_coeff;
      if (!(largest <= FLT_MAX))
        detail::fail(group, ".lr (", lr, ") with beta1, beta2 and max_coeff (", max_coeff, ") gives a step of ",
                     largest, ", beyond the largest float");
    }
  };

  static constexpr std::string_view name = "lamb";
  static constexpr std::array<std::string_view, 2> state = {"exp_avg", "exp_avg_sq"};
  static constexpr std::array<bool, 2> nonnegative_state = {false, true};
  /// The trust ratio of each tensor's last applied step (DeepSpeed's get_lamb_coeffs()).
  static constexpr std::string_view tensor_state = "lamb_coeffs";
  using scalars = detail::lamb_coefficients;

  static scalars prepare(const options& o, std::uint64_t t) {
    return {float(o.beta1), float(o.beta2), float(1.0 - o.beta1), float(1.0 - o.beta2), float(o.eps),
            float(o.weight_decay), o.eps_inside_sqrt, step_size(o, t), o.min_coeff, o.max_coeff};
  }

  // Two passes around the per-tensor norms (lamb_math.hpp): the moments and the direction u, whose
  // norm and the weights' make the trust ratio; then u again, from the stored moments, bit for bit.
  template <class E>
  MPOPT_HOST_DEVICE static void direction(const scalars& k, E& e) {
    auto m = e.state(0), v = e.state(1);
    const auto p = e.param();
    const auto u = detail::lamb_moments(e.grad(), m, v, p, k);
    e.set_state(0, m);
    e.set_state(1, v);
    e.norm(0, p);
    e.norm(1, u);
  }
  /// The step of a tensor: the bias-corrected lr times its trust ratio, which it keeps.
  MPOPT_HOST_DEVICE static float tensor_scale(const scalars& k, double weight_norm, double update_norm, double& ratio) {
    ratio = detail::lamb_trust_ratio(weight_norm, update_norm, k.min_coeff, k.max_coeff);
    return float(k.step_size * ratio);
  }
  template <class E>
  MPOPT_HOST_DEVICE static void update(const scalars& k, E& e) {
    const auto p = e.param();
    e.set_param(detail::lamb_apply(detail::lamb_direction(e.state(0), e.state(1), p, k), p, e.tensor_scale()));
  }

  /// lr * sqrt(1 - beta2^t) / (1 - beta1^t) for the t-th applied step (lr without bias correction).
  static double step_size(const options& o, std::uint64_t t) {
    if (!o.bias_correction) return o.lr;
    return o.lr * std::sqrt(1.0 - std::pow(o.beta2, double(t))) / (1.0 - std::pow(o.beta1, double(t)));
  }
};

}  // namespace mpopt

#if defined(MPOPT_SEPARATE_COMPILATION)
#include "detail/backend/host_instances.hpp"
#define MPOPT_HOST_LAMB_PASSES(EXTERN, P) \
  MPOPT_HOST_RULE_STAGE(EXTERN, P, mpopt::lamb, mpopt::detail::direction_stage) \
  MPOPT_HOST_RULE_STAGE(EXTERN, P, mpopt::lamb, mpopt::detail::update_stage)
MPOPT_FOR_OWN_PRECISIONS(MPOPT_HOST_LAMB_PASSES, extern)
MPOPT_HOST_RULE_COMPILED(mpopt::lamb)
#include "detail/step/standard_optimizers.hpp"
MPOPT_STANDARD_OPTIMIZERS(extern, mpopt::lamb, MPOPT_EVERY_STAGE)
#endif
