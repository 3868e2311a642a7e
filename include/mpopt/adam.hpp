// mpopt — the Adam update rule (FusedAdam math): L2 or decoupled (AdamW) weight decay.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <tuple>

#include "detail/math/adam_math.hpp"
#include "detail/config.hpp"
#include "detail/options/adam_family.hpp"
#include "fields.hpp"

namespace mpopt {

struct adam {
  /// Per parameter group. Defaults are FusedAdam's, with adam_w_mode=True as DeepSpeed builds it.
  struct options {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;
    bool decoupled_weight_decay = true;  ///< AdamW; false: L2 decay added to the gradient
    bool bias_correction = true;

    static constexpr auto fields = std::tuple_cat(detail::adam_family_fields<options>(), mpopt::fields(
      field{"decoupled_weight_decay", &options::decoupled_weight_decay},
      field{"bias_correction", &options::bias_correction}));
  };

  static constexpr std::string_view name = "adam";
  static constexpr std::array<std::string_view, 2> state = {"exp_avg", "exp_avg_sq"};
  static constexpr std::array<bool, 2> nonnegative_state = {false, true};
  using scalars = detail::adam_coefficients;

  /// Scalars of step t (1-based: the t-th applied step of the group).
  static scalars prepare(const options& o, std::uint64_t t) {
    const double bc1 = o.bias_correction ? 1.0 - std::pow(o.beta1, double(t)) : 1.0;
    const double bc2 = o.bias_correction ? 1.0 - std::pow(o.beta2, double(t)) : 1.0;
    return {float(o.lr), float(o.beta1), float(o.beta2), float(1.0 - o.beta1), float(1.0 - o.beta2),
            float(1.0 / bc1), float(1.0 / bc2), float(o.eps), float(o.weight_decay), o.decoupled_weight_decay};
  }

  /// One fused pass: moments and parameter from the gradient (adam_math.hpp).
  template <class E>
  MPOPT_HOST_DEVICE static void update(const scalars& k, E& e) {
    auto m = e.state(0), v = e.state(1);
    const auto p = detail::adam_update(e.grad(), m, v, e.param(), k);
    e.set_state(0, m);
    e.set_state(1, v);
    e.set_param(p);
  }
};

}  // namespace mpopt

#if defined(MPOPT_SEPARATE_COMPILATION)
#include "detail/backend/host_instances.hpp"
#define MPOPT_HOST_ADAM_PASSES(EXTERN, P) \
  MPOPT_HOST_RULE_STAGE(EXTERN, P, mpopt::adam, mpopt::detail::update_stage)
MPOPT_FOR_OWN_PRECISIONS(MPOPT_HOST_ADAM_PASSES, extern)
MPOPT_HOST_RULE_COMPILED(mpopt::adam)
#include "detail/step/standard_optimizers.hpp"
MPOPT_STANDARD_OPTIMIZERS(extern, mpopt::adam, MPOPT_EVERY_STAGE)
#endif
