// mpopt — the options of the Muon rule (muon.hpp), on their own: what a configuration reader and the
// options reference need without the rule's BLAS.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <array>
#include <cfloat>
#include <cstdint>
#include <string_view>
#include <tuple>

#include "detail/math/muon_math.hpp"
#include "detail/math/newton_schulz_settings.hpp"
#include "detail/options/validate.hpp"
#include "fields.hpp"

namespace mpopt::detail {
constexpr std::array<std::string_view, 2> choice_names(muon_lr_adjustment) { return {"original", "match_rms_adamw"}; }
constexpr std::array<std::string_view, 2> choice_names(newton_schulz_precision) { return {"fp32", "bf16"}; }
}  // namespace mpopt::detail

namespace mpopt {

/// The quintic's coefficients of Muon's Newton-Schulz iteration (torch's ns_coefficients).
struct newton_schulz_coefficients {
  double a = 3.4445, b = -4.7750, c = 2.0315;
  static constexpr auto fields =
      mpopt::fields(field{"a", &newton_schulz_coefficients::a}, field{"b", &newton_schulz_coefficients::b},
                    field{"c", &newton_schulz_coefficients::c});
};

/// Per parameter group of mpopt::muon. Names and defaults are torch.optim.Muon's; ns_precision is
/// mpopt's.
struct muon_options {
  /// How a matrix's shape scales the rate (torch's adjust_lr_fn; its None is `original`).
  using lr_adjustment = detail::muon_lr_adjustment;
  /// What the Newton-Schulz iteration computes in: fp32, or bf16 as PyTorch's Muon always does.
  using iteration_precision = detail::newton_schulz_precision;

  double lr = 1e-3;
  double weight_decay = 0.1;  ///< decoupled: p -= lr * weight_decay * p, with the unadjusted rate
  double momentum = 0.95;
  bool nesterov = true;
  newton_schulz_coefficients ns_coefficients = {};
  double eps = 1e-7;  ///< the floor of the norm the iteration's input is divided by
  std::int32_t ns_steps = 5;
  lr_adjustment adjust_lr_fn = lr_adjustment::original;
  iteration_precision ns_precision = iteration_precision::fp32;

  static constexpr auto fields = mpopt::fields(
      field{"lr", &muon_options::lr, checks::rate}, field{"weight_decay", &muon_options::weight_decay, checks::rate},
      field{"momentum", &muon_options::momentum, checks::beta}, field{"nesterov", &muon_options::nesterov},
      field{"ns_coefficients", &muon_options::ns_coefficients}, field{"eps", &muon_options::eps, checks::divisor},
      field{"ns_steps", &muon_options::ns_steps, checks::half_open(0, 100)},
      field{"adjust_lr_fn", &muon_options::adjust_lr_fn}, field{"ns_precision", &muon_options::ns_precision});

  /// The decay factor 1 - lr * weight_decay is a float.
  void validate(std::string_view group) const {
    if (!(lr * weight_decay <= FLT_MAX))
      detail::fail(group, ".lr (", lr, ") times weight_decay (", weight_decay, ") is beyond the largest float");
  }
};

}  // namespace mpopt
