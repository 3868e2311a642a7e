// Test harness shared by adam.cpp, lamb.cpp, layout.cpp and pipeline.cpp: drives an mpopt optimizer
// and the float64 reference (reference.hpp) with the same gradients and compares them.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <mpopt/mpopt.hpp>

#include "bits.hpp"
#include "harness_data.hpp"
#include "test_backend.hpp"

#include "reference.hpp"

namespace harness {

using harness_data::append_bits;

// ---------------------------------------------------------------- options -> reference

inline ref::hyper to_ref(const mpopt::adam::options& o) {
  ref::hyper h;
  h.lr = o.lr;
  h.beta1 = o.beta1;
  h.beta2 = o.beta2;
  h.eps = o.eps;
  h.weight_decay = o.weight_decay;
  h.decoupled = o.decoupled_weight_decay;
  h.bias_correction = o.bias_correction;
  return h;
}
inline ref::hyper to_ref(const mpopt::lamb::options& o) {
  ref::hyper h;
  h.lr = o.lr;
  h.beta1 = o.beta1;
  h.beta2 = o.beta2;
  h.eps = o.eps;
  h.weight_decay = o.weight_decay;
  h.bias_correction = o.bias_correction;
  h.eps_inside_sqrt = o.eps_inside_sqrt;
  h.min_coeff = o.min_coeff;
  h.max_coeff = o.max_coeff;
  return h;
}
/// 1-bit LAMB's warm-up is LAMB without bias correction, eps outside the square root.
inline ref::hyper to_ref(const mpopt::onebit_lamb::options& o) {
  ref::hyper h;
  h.lr = o.lr;
  h.beta1 = o.beta1;
  h.beta2 = o.beta2;
  h.eps = o.eps;
  h.weight_decay = o.weight_decay;
  h.bias_correction = false;
  h.eps_inside_sqrt = false;
  h.min_coeff = o.min_coeff;
  h.max_coeff = o.max_coeff;
  return h;
}
inline ref::scaler to_ref(const mpopt::no_scaling::options&) { return ref::scaler::none(); }
inline ref::scaler to_ref(const mpopt::static_scale_options& o) { return ref::scaler::fixed(o.scale); }
inline ref::scaler to_ref(const mpopt::dynamic_scale_options& o) {
  return ref::scaler::dynamic(o.init_scale, o.window, o.min_scale, o.hysteresis, o.consecutive_hysteresis,
                              o.on_min_scale == mpopt::at_min_scale::raise);
}
template <class Rule>
constexpr ref::rule rule_of = std::is_same_v<Rule, mpopt::adam> ? ref::rule::adam : ref::rule::lamb;

inline mpopt::step_result to_lib(ref::outcome o) {
  switch (o) {
    case ref::outcome::applied: return mpopt::step_result::applied;
    case ref::outcome::skipped_nonfinite: return mpopt::step_result::skipped_nonfinite;
    default: return mpopt::step_result::accumulating;
  }
}

// ---------------------------------------------------------------- element helpers

/// |a - b| <= rtol * |b| (NaN only equals NaN). doctest::Approx is not relative: it adds 1 to the scale.
inline bool close(double a, double b, double rtol) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::abs(a - b) <= rtol * std::abs(b);
}

template <class T>
T from_double(double x) {
  if constexpr (std::is_same_v<T, float>) return float(x);
  else return T(x);  // mpopt::half / mpopt::bfloat16: round to nearest even
}
template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return T(x);
}

/// Configuration of a typed test case: precision x scaler x variant x layout.
enum class layout { unfused, flat };

template <class Precision, class Scaler, int Variant, layout Layout>
struct cfg {
  using precision = Precision;
  using scaler = Scaler;
  static constexpr int variant = Variant;
  static constexpr layout lay = Layout;
};

template <class Scaler>
typename Scaler::options default_scaler_options() {
  if constexpr (std::is_same_v<Scaler, mpopt::static_scale>) return {256.0};
  else if constexpr (std::is_same_v<Scaler, mpopt::dynamic_scale>) {
    mpopt::dynamic_scale_options o;
    o.init_scale = 1024;  // small window: the scale doubles several times within a test
    o.window = 4;
    return o;
  } else return {};
}

/// How the library's float32 results may differ from the float64 reference (see `bounds`).
struct tolerance {
  double norm = 1e-5;   // relative: grad_norm, clip_coef, grad_norm_clipped; the block-float norm sums
  double safety = 2.0;  // masters, moments and trust ratios must lie within safety * the forward bound
};

// ---------------------------------------------------------------- forward error bounds

/// A first-order forward error bound of a float32 evaluation of the contract, propagated element by
/// element alongside the reference: after every applied step it bounds |float result - exact result|
/// of every master, moment and trust ratio. It assumes only what the contract says: element math in
/// float (each operation rounds by at most u = 2^-24 relative), gradients unscaled as
/// float(grad) * float(1/(S*N) * clip), micro-steps summed in float, and global and per-tensor norms
/// within `tolerance::norm` relative (float sums per block). Constants count roundings generously.
/// Errors entering through the data flow (the clip coefficient, an L2 decay term that cancels the
/// gradient, m cancelling to ~0, v ~ 0 where eps dominates) are amplified by the exact sensitivities,
/// so ill-conditioned elements get a wide bound and well-conditioned ones a tight one.
struct bounds {
  static constexpr double u = 0x1p-24;
  std::vector<ref::tensor> p, m, v;  // absolute error bounds
  std::vector<double> coeff;         // absolute error bound of the last trust ratio

  void add_tensor(std::size_t n) {
    p.emplace_back(n, 0.0);  // the library starts from exactly the reference's inputs
    m.emplace_back(n, 0.0);
    v.emplace_back(n, 0.0);
    coeff.push_back(0.0);
  }

  // |sqrt(x) - sqrt(x + e)| for |e| <= ex
  static double sqrt_err(double x, double ex) {
    return x > 0 ? std::min(ex / (2 * std::sqrt(x)), std::sqrt(ex)) : std::sqrt(ex);
  }

  /// After an applied reference step. `old_*`: reference state before it; `gabs`: per element the
  /// sum over micro-steps of |float(grad)|; `scale`: S * N (the unscale divisor); `d_clip`: relative
  /// error bound of the clip coefficient; `n_micro`: micro-steps summed.
  void applied(const ref::model& md, const std::vector<ref::tensor>& old_p, const std::vector<ref::tensor>& old_m,
               const std::vector<ref::tensor>& old_v, const std::vector<ref::tensor>& gabs, double scale,
               double clip, double d_clip, int n_micro, double d_norm) {
    for (std::size_t i = 0; i < md.p.size(); ++i) {
      const ref::group& gr = md.groups[md.group_of[i]];
      const ref::hyper& h = gr.h;
      const double t = double(gr.t);
      // the bias corrections: Adam's per element, LAMB's in its step size
      const double bc1 = h.bias_correction ? 1 - std::pow(h.beta1, t) : 1;
      const double bc2 = h.bias_correction ? 1 - std::pow(h.beta2, t) : 1;
      const std::size_t n = md.p[i].size();
      ref::tensor eu(n), uu(n);
      double ssu = 0, ssp = 0, sseu = 0, ssep = 0;
      for (std::size_t k = 0; k < n; ++k) {
        const double g = md.g_applied[i][k], po = old_p[i][k], mo = old_m[i][k], vo = old_v[i][k];
        // gradient: float sum of micro-steps, times float(unscale*clip), product rounded
        double eg = (d_clip + 3 * u) * std::abs(g) + (n_micro - 1) * u * gabs[i][k] * clip / scale;
        double ge = g;
        if (gr.r == ref::rule::adam && !h.decoupled) {  // L2: g + wd*p, with p carrying its error
          ge = g + h.weight_decay * po;
          eg += h.weight_decay * p[i][k] + 3 * u * (std::abs(g) + h.weight_decay * std::abs(po));
        }
        const double mn = md.m[i][k], vn = md.v[i][k];
        m[i][k] = h.beta1 * m[i][k] + (1 - h.beta1) * eg + 4 * u * (h.beta1 * std::abs(mo) + (1 - h.beta1) * std::abs(ge));
        v[i][k] = h.beta2 * v[i][k] + (1 - h.beta2) * (2 * std::abs(ge) * eg + eg * eg) +
                  5 * u * (h.beta2 * vo + (1 - h.beta2) * ge * ge);
        if (gr.r == ref::rule::adam) {
          const double mh = mn / bc1, emh = m[i][k] / bc1 + 3 * u * std::abs(mh);
          const double vh = vn / bc2, evh = v[i][k] / bc2 + 3 * u * vh;
          const double den = std::sqrt(vh) + h.eps;
          const double eden = sqrt_err(vh, evh) + 3 * u * den;
          const double den_lo = std::max(den - eden, 0.5 * h.eps);
          const double q = mh / den;
          double e = emh / den_lo + std::abs(mh) * eden / (den * den_lo) + 2 * u * std::abs(q);
          double upd = q;
          if (h.decoupled) {
            upd += h.weight_decay * po;
            e += h.weight_decay * p[i][k] + 3 * u * (std::abs(q) + h.weight_decay * std::abs(po));
          }
          p[i][k] += h.lr * e + 3 * u * h.lr * std::abs(upd) + u * std::abs(md.p[i][k]);
        } else {
          const double den = h.eps_inside_sqrt ? std::sqrt(vn + h.eps) : std::sqrt(vn) + h.eps;
          const double eden = (h.eps_inside_sqrt ? sqrt_err(vn + h.eps, v[i][k]) : sqrt_err(vn, v[i][k])) + 3 * u * den;
          const double den_lo = std::max(den - eden, 0.5 * std::min(h.eps, den));
          const double q = mn / den;
          eu[k] = m[i][k] / den_lo + std::abs(mn) * eden / (den * den_lo) + 2 * u * std::abs(q) +
                  h.weight_decay * p[i][k] + 3 * u * (std::abs(q) + h.weight_decay * std::abs(po));
          uu[k] = q + h.weight_decay * po;
          ssu += uu[k] * uu[k];
          ssp += po * po;
          sseu += eu[k] * eu[k];
          ssep += p[i][k] * p[i][k];
        }
      }
      if (gr.r == ref::rule::lamb) {
        // trust ratio ||p|| / ||u||: errors of both norms (element errors plus the float sums), then
        // the clamp, which is 1-Lipschitz
        const double w = std::sqrt(ssp), un = std::sqrt(ssu);
        const double c = md.coeffs[i];
        double ec = 0;
        if (w > 0 && un > 0) {
          const double ew = std::sqrt(ssep) + d_norm * w, eun = std::sqrt(sseu) + d_norm * un;
          ec = (w / un) * (ew / w + eun / std::max(un - eun, 0.5 * un)) + 2 * u * (w / un);
        }
        coeff[i] = ec;
        const double ss = h.bias_correction ? h.lr * std::sqrt(bc2) / bc1 : h.lr;
        for (std::size_t k = 0; k < n; ++k)
          p[i][k] += ss * (ec * std::abs(uu[k]) + c * eu[k]) + 4 * u * ss * c * std::abs(uu[k]) + u * std::abs(md.p[i][k]);
      }
    }
  }
};

// ---------------------------------------------------------------- the rig

/// One optimizer, its tensors (user-owned or in flat groups) and the reference fed the same data.
template <class Opt>
class rig {
 public:
  using P = typename Opt::param_type;
  using G = typename Opt::grad_type;
  using rule = typename Opt::rule;
  using group_options = typename Opt::group_options;

  Opt opt;
  ref::model model;
  bounds err;
  std::string last_error;  // what() of the mpopt::error the last step threw
  tolerance tol;
  std::vector<std::span<P>> params;  // registration order
  std::vector<std::span<G>> grads;
  std::vector<std::string> names;
  std::vector<std::size_t> sizes;

  explicit rig(layout l, mpopt::optimizer_options oo = {}, typename Opt::scaler_options so = {})
      : opt(oo, so), lay_(l) {
    model.clip_grad = oo.clip_grad;
    model.accumulation_steps = oo.accumulation_steps;
    model.mean = oo.combine == mpopt::accumulation::mean;
    model.skip_nonfinite = oo.skip_nonfinite;
    model.max_consecutive_skips = oo.max_consecutive_skips;
    model.sc = to_ref(so);
  }

  /// A group of tensors with the given sizes, parameters ~ N(0, sigma^2) rounded to the param type.
  void add_group(const group_options& o, const std::vector<std::size_t>& group_sizes, std::uint64_t seed,
                 double sigma = 0.5) {
    const std::size_t gi = model.add_group(rule_of<rule>, to_ref(o));
    const std::size_t first = params.size();
    for (std::size_t i = 0; i < group_sizes.size(); ++i)
      names.push_back(std::string("g") + std::to_string(gi) + ".tensor" + std::to_string(i) + "_n" + std::to_string(group_sizes[i]));
    if (lay_ == layout::flat) {
      std::vector<mpopt::tensor_spec> specs;
      for (std::size_t i = 0; i < group_sizes.size(); ++i) specs.push_back({names[first + i], group_sizes[i]});
      auto& g = opt.add_flat_group(o, std::span<const mpopt::tensor_spec>(specs));
      for (std::size_t i = 0; i < group_sizes.size(); ++i) {
        params.push_back(g.param(i));
        grads.push_back(g.grad(i));
      }
    } else {
      auto& g = opt.add_group(o);
      for (std::size_t i = 0; i < group_sizes.size(); ++i) {
        own_p_.push_back(std::make_unique<std::vector<P>>(group_sizes[i], P(0.0f)));
        own_g_.push_back(std::make_unique<std::vector<G>>(group_sizes[i], G(0.0f)));
        g.add(*own_p_.back(), *own_g_.back(), names[first + i]);
        params.push_back(std::span<P>(*own_p_.back()));
        grads.push_back(std::span<G>(*own_g_.back()));
      }
    }
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal(0.0, sigma);
    for (std::size_t i = first; i < params.size(); ++i) {
      ref::tensor init(params[i].size());
      for (std::size_t k = 0; k < init.size(); ++k) {
        params[i][k] = from_double<P>(normal(rng));
        init[k] = double(float(params[i][k]));  // the reference starts from what the library stores
      }
      model.add_tensor(gi, std::move(init));
      err.add_tensor(params[i].size());
      sizes.push_back(params[i].size());
    }
  }

  /// Sets an initial parameter (before the first step) in the library and the reference alike.
  void set_param(std::size_t i, std::size_t k, double x) {
    params[i][k] = from_double<P>(x);
    model.p[i][k] = double(float(params[i][k]));
  }

  /// Writes (true gradient * loss scale) rounded to the grad type, as a backward would.
  void write_grads(const std::vector<ref::tensor>& truth) {
    const double s = opt.loss_scale();
    seen_.resize(grads.size());
    gabs_.resize(grads.size());
    for (std::size_t i = 0; i < grads.size(); ++i) {
      seen_[i].resize(grads[i].size());
      gabs_[i].resize(grads[i].size(), 0.0);
      for (std::size_t k = 0; k < grads[i].size(); ++k) {
        grads[i][k] = from_double<G>(truth[i][k] * s);
        seen_[i][k] = double(float(grads[i][k]));  // exactly the value the library reads
        gabs_[i][k] += std::abs(seen_[i][k]);
      }
    }
  }

  struct result {
    mpopt::step_status lib;
    ref::status ref;
  };
  /// One step() of both, the gradients written from `truth`. When the reference says the step must
  /// fail, the library must throw mpopt::error.
  result step(const std::vector<ref::tensor>& truth) {
    write_grads(truth);
    return step_written();
  }
  /// One step() of both with the gradients already in the grad tensors (seen_ set by write_grads).
  result step_written() {
    result r;
    const auto old_p = model.p, old_m = model.m, old_v = model.v;
    const int n_micro = model.accumulation_steps;
    const double scale = model.sc.scale * (model.mean ? model.accumulation_steps : 1);
    r.ref = model.step(seen_);
    last_error.clear();
    if (r.ref.result == ref::outcome::error) {
      try {
        opt.step();
        FAIL_CHECK("step() returned; the reference says it must throw mpopt::error");
      } catch (const mpopt::error& e) {
        last_error = e.what();
      }
    } else {
      r.lib = opt.step();
    }
    if (r.ref.result == ref::outcome::applied) {
      const double near = r.ref.grad_norm * (1 + tol.norm) + 1e-6;
      const double d_clip = (model.clip_grad > 0 && near > model.clip_grad) ? tol.norm : 0.0;
      err.applied(model, old_p, old_m, old_v, gabs_, scale, r.ref.clip_coef, d_clip, n_micro, tol.norm);
    }
    if (r.ref.result != ref::outcome::accumulating)
      for (auto& t : gabs_) std::fill(t.begin(), t.end(), 0.0);
    return r;
  }

  // ------------------------------------------------------------ comparisons

  void check_status(const result& r) const {
    const auto& st = r.lib;
    const auto& rs = r.ref;
    if (rs.result == ref::outcome::error) return;
    CHECK(st.result == to_lib(rs.result));
    CHECK(st.applied == (rs.result == ref::outcome::applied));
    CHECK(st.scale_before == rs.scale_before);
    CHECK(st.scale_after == rs.scale_after);
    CHECK(st.step == rs.step);
    CHECK(st.skipped_steps == rs.skipped_steps);
    CHECK(st.consecutive_skips == rs.consecutive_skips);
    CHECK(st.micro_step == rs.micro_step);
    for (std::size_t g = 0; g < model.groups.size(); ++g)
      CHECK(const_cast<Opt&>(opt).group(g).step() == model.groups[g].t);
    CHECK(opt.loss_scale() == model.sc.scale);
    if (rs.result == ref::outcome::applied && std::isfinite(rs.grad_norm)) {
      CHECK(close(st.grad_norm, rs.grad_norm, tol.norm));
      CHECK(close(st.clip_coef, rs.clip_coef, tol.norm));
      CHECK(close(st.grad_norm_clipped, rs.grad_norm_clipped, tol.norm));
      worst_norm = std::max(worst_norm, std::abs(st.grad_norm - rs.grad_norm) / rs.grad_norm);
    }
  }

  /// max over elements of |lib - ref| / (safety * bound); <= 1 passes. NaN must match NaN.
  static double ratio(double lib, double r, double bound, double safety) {
    if (std::isnan(r) || std::isnan(lib)) return (std::isnan(r) && std::isnan(lib)) ? 0 : INFINITY;
    const double d = std::abs(lib - r);
    if (d == 0) return 0;
    const double b = safety * bound;
    return b > 0 ? d / b : INFINITY;  // a NaN or zero bound admits no difference
  }

  double master_error() const {
    double worst = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto lib = opt.master(i);
      for (std::size_t k = 0; k < lib.size(); ++k) {
        const double e = ratio(lib[k], model.p[i][k], err.p[i][k], tol.safety);
        worst = std::max(worst, e);
      }
    }
    return worst;
  }

  double moment_error() const {
    double worst = 0;
    for (std::size_t i = 0; i < params.size(); ++i)
      for (std::size_t j = 0; j < 2; ++j) {
        const auto lib = opt.moment(j, i);
        const auto& r = j == 0 ? model.m[i] : model.v[i];
        const auto& b = j == 0 ? err.m[i] : err.v[i];
        for (std::size_t k = 0; k < lib.size(); ++k) worst = std::max(worst, ratio(lib[k], r[k], b[k], tol.safety));
      }
    return worst;
  }

  double coeff_error() const {
    double worst = 0;
    if constexpr (!std::is_same_v<rule, mpopt::adam>) {
      const auto c = opt.lamb_coeffs();
      REQUIRE(c.size() == model.coeffs.size());
      for (std::size_t i = 0; i < c.size(); ++i) worst = std::max(worst, ratio(c[i], model.coeffs[i], err.coeff[i], tol.safety));
    }
    return worst;
  }

  /// Number of params that are not bit-for-bit their master rounded to the param type.
  std::size_t param_mismatches() const {
    std::size_t bad = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto ms = opt.master(i);
      for (std::size_t k = 0; k < ms.size(); ++k) {
        if (std::isnan(ms[k])) bad += !std::isnan(float(params[i][k]));
        else bad += bits(params[i][k]) != bits(from_float<P>(ms[k]));
      }
    }
    return bad;
  }

  /// Everything the library exposes against the reference after a step.
  void check(const result& r) const {
    check_status(r);
    const double me = master_error(), mo = moment_error(), ce = coeff_error();
    CHECK_MESSAGE(me <= 1.0, "masters off the reference: worst error / (safety * bound) = " << me);
    CHECK_MESSAGE(mo <= 1.0, "moments off the reference: worst error / (safety * bound) = " << mo);
    CHECK_MESSAGE(ce <= 1.0, "lamb_coeffs off the reference: worst error / (safety * bound) = " << ce);
    CHECK(param_mismatches() == 0);
    worst_master = std::max(worst_master, me);
    worst_moment = std::max(worst_moment, mo);
    worst_coeff = std::max(worst_coeff, ce);
  }
  mutable double worst_norm = 0, worst_master = 0, worst_moment = 0, worst_coeff = 0;


 private:
  layout lay_;
  std::vector<std::unique_ptr<std::vector<P>>> own_p_;
  std::vector<std::unique_ptr<std::vector<G>>> own_g_;
  std::vector<ref::tensor> seen_;  // float(grad) of the last write_grads
  std::vector<ref::tensor> gabs_;  // sum of |float(grad)| over the micro-steps of this window
};

// ---------------------------------------------------------------- snapshots

/// Every bit of observable optimizer state, to prove a skipped or failed step changed nothing.
struct snapshot {
  std::vector<std::uint32_t> params, masters, m, v;
  std::vector<std::uint64_t> coeffs;  // LAMB trust ratios (bits of the doubles)
  std::vector<std::uint64_t> group_steps;
  double scale = 0;
  bool operator==(const snapshot&) const = default;
};

template <class Opt>
snapshot take(const Opt& opt_c, const std::vector<std::span<typename Opt::param_type>>& params) {
  auto& opt = const_cast<Opt&>(opt_c);
  opt.finalize();  // masters and moments exist from finalize() on (step() calls it too)
  snapshot s;
  for (std::size_t i = 0; i < params.size(); ++i) {
    append_bits(s.params, params[i]);
    append_bits(s.masters, opt.master(i));
    append_bits(s.m, opt.moment(0, i));
    append_bits(s.v, opt.moment(1, i));
  }
  if constexpr (requires { opt.lamb_coeffs(); })
    for (double c : opt.lamb_coeffs()) s.coeffs.push_back(std::bit_cast<std::uint64_t>(c));
  for (std::size_t g = 0; g < opt.group_count(); ++g) s.group_steps.push_back(opt.group(g).step());
  s.scale = opt.loss_scale();
  return s;
}

// ---------------------------------------------------------------- data

/// Random true gradients: per tensor a random magnitude (log-uniform over 1e-2..1), then the whole
/// step rescaled to the global L2 norm `target` (so the test decides whether clipping binds).
inline std::vector<ref::tensor> random_grads(const std::vector<std::size_t>& sizes, std::mt19937_64& rng,
                                             double target) {
  std::uniform_real_distribution<double> u(-1.0, 1.0), lg(-2.0, 0.0);
  std::vector<ref::tensor> g(sizes.size());
  double ss = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const double mag = std::pow(10.0, lg(rng));
    g[i].resize(sizes[i]);
    for (double& x : g[i]) {
      x = mag * u(rng);
      ss += x * x;
    }
  }
  const double f = target / std::sqrt(ss);
  for (auto& t : g)
    for (double& x : t) x *= f;
  return g;
}

/// Sizes with the features the tests need: 1, small odd sizes, and one tensor over 65536 elements
/// (so it spans several internal chunks) in the first group.
inline std::vector<std::vector<std::size_t>> random_sizes(std::mt19937_64& rng) {
  std::uniform_int_distribution<std::size_t> small(1, 64), mid(100, 2000), big(65537, 90000), med(2000, 5000);
  return {{1, 7, mid(rng) | 1, big(rng) | 1}, {small(rng), 3, 1023, med(rng)}};
}

// ---------------------------------------------------------------- the adam/lamb reference run

template <class Cfg>
std::string describe() {
  std::string s(Cfg::precision::name);
  s += "+";
  s += std::string(Cfg::scaler::name);
  s += Cfg::lay == layout::flat ? "+flat" : "+unfused";
  s += "+variant" + std::to_string(Cfg::variant);
  return s;
}

struct run_stats {
  int applied = 0, skipped = 0, clipped = 0, unclipped = 0;
  int at_min_coeff = 0, at_max_coeff = 0;  // LAMB trust ratios clamped (tensor-steps)
};

/// `steps` steps of random data on two groups (options g0, g1), compared with the reference after every
/// step. Steps 1, 4, 7, ... have a true gradient norm of 4 (clipping at 1 binds), the others 0.5; on
/// steps 7, 8 and 16 one element of the big tensor is set to 7e4 / S, which overflows fp16 at any scale
/// (two in a row: the dynamic scaler's hysteresis first, then a halving) and makes clipping bind hard
/// for bf16 and fp32.
template <class Opt>
run_stats run_against_reference(layout lay, typename Opt::scaler_options so, const typename Opt::group_options& g0,
                                const typename Opt::group_options& g1, std::uint64_t seed, int steps = 24) {
  std::mt19937_64 rng(seed);
  const auto sz = random_sizes(rng);
  rig<Opt> r(lay, {}, so);
  r.add_group(g0, sz[0], seed + 1);
  r.add_group(g1, sz[1], seed + 2);
  run_stats st;
  auto& [applied, skipped, clipped, unclipped, at_min, at_max] = st;
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    auto truth = random_grads(r.sizes, rng, s % 3 == 1 ? 4.0 : 0.5);
    if (s == 7 || s == 8 || s == 16) truth[3][rng() % truth[3].size()] = 7e4 / r.opt.loss_scale();
    const auto res = r.step(truth);
    r.check(res);
    if (res.ref.result == ref::outcome::applied) {
      ++applied;
      (res.ref.clip_coef < 1 ? clipped : unclipped) += 1;
      if (!std::is_same_v<typename Opt::rule, mpopt::adam>)
        for (std::size_t i = 0; i < r.model.coeffs.size(); ++i) {
          const auto& h = r.model.groups[r.model.group_of[i]].h;
          at_min += r.model.coeffs[i] == h.min_coeff;
          at_max += r.model.coeffs[i] == h.max_coeff;
        }
    } else {
      ++skipped;
    }
  }
  CHECK(applied >= 20);
  CHECK(clipped > 0);
  CHECK(unclipped > 0);
  if (std::is_same_v<typename Opt::precision, mpopt::fp16>) CHECK(skipped == 3);
  if (doctest::getContextOptions()->success)  // with -s: how close the library came to the bounds
    MESSAGE("worst grad_norm relative error " << r.worst_norm << "; worst error / (safety * bound): masters "
                                             << r.worst_master << ", moments " << r.worst_moment << ", trust ratios "
                                             << r.worst_coeff << "; clamped trust ratios: " << at_min << " at min, "
                                             << at_max << " at max");
  return st;
}

}  // namespace harness
