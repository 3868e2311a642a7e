// mpopt — the loss scalers' cold definitions (loss_scale.hpp): inline header-only, else compiled
// once by <mpopt/src.hpp>.
#pragma once

#include "loss_scale.hpp"

#include "detail/options/field_refs.hpp"
#include "detail/options/validate.hpp"

namespace mpopt {

MPOPT_DECL static_scale::static_scale(options o) : scale_(o.scale) { detail::check_options(o, "static_scale"); }

MPOPT_DECL void static_scale::load(const state& s) {
  detail::require_check("saved static_scale.scale", s.scale, checks::loss_scale);
  scale_ = s.scale;
}

MPOPT_DECL void dynamic_scale_options::validate(std::string_view where) const {
  if (min_scale > init_scale) detail::fail(where, ".min_scale (", min_scale, ") must be <= init_scale (", init_scale, ")");
}

MPOPT_DECL dynamic_scale::dynamic_scale(options o) : opt_(o) {
  detail::check_options(o, "dynamic_scale");
  scale_ = o.init_scale;
  hysteresis_left_ = o.hysteresis;
}

MPOPT_DECL void dynamic_scale::load(const state& s) {
  using detail::require_check;
  require_check("saved dynamic_scale.scale", s.scale, checks::loss_scale);
  require_check("saved dynamic_scale.iter", double(s.iter), checks::closed(0, double(detail::max_steps)));
  require_check("saved dynamic_scale.last_overflow_iter", double(s.last_overflow_iter),
                checks::closed(-1, double(s.iter) - 1).because("before iter"));
  require_check("saved dynamic_scale.hysteresis_left", double(s.hysteresis_left),
                checks::closed(1, double(opt_.hysteresis)).because("up to hysteresis"));
  scale_ = s.scale;
  iter_ = s.iter;
  last_overflow_iter_ = s.last_overflow_iter;
  hysteresis_left_ = s.hysteresis_left;
}

}  // namespace mpopt
