// mpopt — loss-scaler policies. The optimizer calls update(overflow) once per accumulation boundary
// with the overflow flag already agreed by every rank.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "detail/config.hpp"
#include "fields.hpp"
#include "numeric.hpp"

namespace mpopt {

/// The largest loss scale: 2^64. The loss is multiplied by it in float and the gradients by its
/// reciprocal, so both must stay normal floats with room for the loss; and an fp16 gradient scaled
/// by more than 2^40 overflows unless it is below fp16's smallest subnormal, so no run needs more.
/// dynamic_scale stops growing here (DeepSpeed's has no cap: zero gradients double it without end).
inline constexpr double max_loss_scale = 0x1p64;

namespace checks {
/// (0, 2^64]: a loss scale.
inline constexpr check loss_scale = check{.lo = 0, .hi = max_loss_scale, .lo_open = true};
}  // namespace checks

/// No scaling: bf16 and fp32 training. The scale is always 1.
class no_scaling {
 public:
  struct options {
    static constexpr std::tuple<> fields{};
  };
  /// What a checkpoint keeps of it: nothing.
  struct state {
    static constexpr std::tuple<> fields{};
    bool operator==(const state&) const = default;
  };
  static constexpr std::string_view name = "no_scaling";
  static constexpr bool dynamic = false;
  template <class Grad>
  static constexpr bool serves = true;

  explicit no_scaling(options = {}) {}
  double scale() const { return 1.0; }
  bool raises_on(bool) const { return false; }
  void update(bool) {}
  options config() const { return {}; }
  state save() const { return {}; }
  void load(const state&) {}
};

struct static_scale_options {
  double scale = 1.0;

  static constexpr auto fields = mpopt::fields(field{"scale", &static_scale_options::scale, checks::loss_scale});
};

/// A constant scale S (DeepSpeed's LossScaler). An overflow still skips the step.
class static_scale {
 public:
  using options = static_scale_options;
  static constexpr std::string_view name = "static_scale";
  static constexpr bool dynamic = false;

  /// What a checkpoint keeps of it: the scale.
  struct state {
    double scale = 1.0;
    static constexpr auto fields = mpopt::fields(field{"scale", &state::scale});
    bool operator==(const state&) const = default;
  };

  MPOPT_DECL explicit static_scale(options o = {});
  double scale() const { return scale_; }
  bool raises_on(bool) const { return false; }
  void update(bool) {}
  options config() const { return {scale_}; }
  state save() const { return {scale_}; }
  MPOPT_DECL void load(const state& s);

 private:
  double scale_;
};

/// What the dynamic scaler does when an overflow arrives while the scale is already at its minimum.
enum class at_min_scale {
  raise,          ///< throw mpopt::error naming the non-finite tensors (DeepSpeed ZeRO's behaviour)
  keep_skipping,  ///< skip the step and stay at the minimum (FP16_Optimizer's behaviour)
};
constexpr std::array<std::string_view, 2> choice_names(at_min_scale) { return {"raise", "keep_skipping"}; }

/// Defaults are DeepSpeed's fp16 config defaults.
struct dynamic_scale_options {
  double init_scale = 65536.0;  ///< 2^initial_scale_power, power 16
  std::int64_t window = 1000;   ///< loss_scale_window
  double min_scale = 1.0;       ///< min_loss_scale
  std::int64_t hysteresis = 2;  ///< delayed_shift: overflows tolerated before the first halving
  bool consecutive_hysteresis = false;
  at_min_scale on_min_scale = at_min_scale::raise;

  static constexpr auto fields = mpopt::fields(
      field{"init_scale", &dynamic_scale_options::init_scale, checks::loss_scale},
      field{"window", &dynamic_scale_options::window, checks::at_least(1)},
      field{"min_scale", &dynamic_scale_options::min_scale, checks::loss_scale},
      field{"hysteresis", &dynamic_scale_options::hysteresis, checks::at_least(1)},
      field{"consecutive_hysteresis", &dynamic_scale_options::consecutive_hysteresis},
      field{"on_min_scale", &dynamic_scale_options::on_min_scale});

  MPOPT_DECL void validate(std::string_view where) const;
};

/// DeepSpeed's DynamicLossScaler (runtime/fp16/loss_scaler.py): halve on overflow after `hysteresis`
/// tolerated overflows, double after `window` clean steps since the last overflow.
class dynamic_scale {
 public:
  using options = dynamic_scale_options;
  static constexpr std::string_view name = "dynamic_scale";
  static constexpr bool dynamic = true;
  static constexpr double factor = 2.0;  // DeepSpeed fixes scale_factor at 2

  /// What a checkpoint keeps of it.
  struct state {
    double scale = 0;
    std::int64_t iter = 0;
    std::int64_t last_overflow_iter = -1;
    std::int64_t hysteresis_left = 0;
    static constexpr auto fields = mpopt::fields(
        field{"scale", &state::scale}, field{"iter", &state::iter},
        field{"last_overflow_iter", &state::last_overflow_iter}, field{"hysteresis_left", &state::hysteresis_left});
    bool operator==(const state&) const = default;
  };

  MPOPT_DECL explicit dynamic_scale(options o = {});

  double scale() const { return scale_; }
  const options& config() const { return opt_; }

  /// True when update(overflow) would have to lower a scale that is already at the minimum and the
  /// policy is to raise. The optimizer asks first so it can throw before changing anything.
  bool raises_on(bool overflow) const {
    return overflow && halves_now() && scale_ == opt_.min_scale && opt_.on_min_scale == at_min_scale::raise;
  }

  void update(bool overflow) {
    if (overflow) {
      if (halves_now())
        scale_ = std::max(scale_ / factor, opt_.min_scale);
      else
        --hysteresis_left_;
      last_overflow_iter_ = iter_;
    } else {
      if (opt_.consecutive_hysteresis) hysteresis_left_ = opt_.hysteresis;
      const std::int64_t stable = iter_ - last_overflow_iter_ - 1;
      if (stable > 0 && stable % opt_.window == 0) {
        if (!opt_.consecutive_hysteresis) hysteresis_left_ = opt_.hysteresis;
        scale_ = std::min(scale_ * factor, max_loss_scale);
      }
    }
    ++iter_;
  }

  std::int64_t iteration() const { return iter_; }
  std::int64_t hysteresis_left() const { return hysteresis_left_; }

  state save() const { return {scale_, iter_, last_overflow_iter_, hysteresis_left_}; }
  /// Restores save()d state; the options stay this scaler's own (like DeepSpeed's min_loss_scale).
  /// Checks the state is one the rule can reach before changing anything.
  MPOPT_DECL void load(const state& s);

 private:
  bool halves_now() const { return opt_.hysteresis == 1 || hysteresis_left_ == 1; }

  options opt_;
  double scale_;
  std::int64_t iter_ = 0;
  std::int64_t last_overflow_iter_ = -1;
  std::int64_t hysteresis_left_;
};

/// Whether scaler S serves gradients of type Grad: what S declares as `serves<Grad>`, otherwise
/// fp16 only. Loss scaling exists for fp16's narrow range; a scaler of yours may declare that it
/// serves bf16 or fp32 too (the step still skips on overflow and unscales exactly as for fp16).
namespace detail {
/// Scaler S says whether it serves gradients of type Grad. (A `serves` that is not a template is
/// tested first: naming it as one would be a hard error.)
template <class S, class Grad>
concept says_serves = !requires { S::serves; } && requires {
  { S::template serves<Grad> } -> std::convertible_to<bool>;
};
/// Scaler S counts its updates (what a checkpoint's step count bounds).
template <class S>
concept counts_iterations = requires(const S& s) {
  { s.iteration() } -> std::convertible_to<std::int64_t>;
};
}  // namespace detail

template <class S, class Grad>
inline constexpr bool scaler_serves = [] {
  if constexpr (detail::says_serves<S, Grad>) return bool(S::template serves<Grad>);
  else return std::is_same_v<Grad, half>;
}();

template <class S>
concept loss_scaler_policy = requires(S s, const S cs, bool b, const typename S::state& saved) {
  requires described<typename S::options>;  // fields.hpp
  requires described<typename S::state>;    // what a checkpoint keeps of it
  { cs.scale() } -> std::convertible_to<double>;
  { cs.raises_on(b) } -> std::convertible_to<bool>;
  s.update(b);
  { cs.config() } -> std::convertible_to<typename S::options>;  // the options, compared across ranks
  { cs.save() } -> std::same_as<typename S::state>;
  s.load(saved);  // checks the state, then takes it
  { S::name } -> std::convertible_to<std::string_view>;
};

}  // namespace mpopt

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "loss_scale.ipp"
#endif
