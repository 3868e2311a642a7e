// A float64 reference of mpopt's step pipeline, written straight from the contract (docs/design.md
// §2 and §3.1-§3.6) and NOT from the library's code. It includes nothing from mpopt: it is a
// specification to test the library against, so it favours plain loops over speed.
//
// Inputs are exactly what the library sees: the gradient values float(grad) of the low-precision
// gradients the test wrote (already multiplied by the loss scale) and the initial parameters as the
// library stores them (float(param)). Everything after that is computed in double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace ref {

using tensor = std::vector<double>;

enum class rule { adam, lamb };

/// Per-group hyperparameters (the union of Adam's and LAMB's options).
struct hyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = true;         // Adam: AdamW; false: L2 decay added to the gradient
  bool bias_correction = true;   // Adam: bc1, bc2; LAMB: only the step size
  bool eps_inside_sqrt = false;  // LAMB
  double min_coeff = 0.01;       // LAMB trust-ratio clamp
  double max_coeff = 10.0;
};

/// The loss scalers. `dynamic` is DeepSpeed's DynamicLossScaler.update_scale with factor 2.
struct scaler {
  enum class kind { none, fixed, dynamic };
  kind k = kind::none;
  double scale = 1.0;
  std::int64_t window = 1000;
  double min_scale = 1.0;
  std::int64_t hysteresis = 2;  // delayed_shift
  bool consecutive_hysteresis = false;
  bool raise_at_min = true;     // at_min_scale::raise (false: keep_skipping)

  std::int64_t cur_iter = 0;
  std::int64_t last_overflow_iter = -1;
  std::int64_t cur_hysteresis = 2;

  static scaler none() { return {}; }
  static scaler fixed(double s) {
    scaler r;
    r.k = kind::fixed;
    r.scale = s;
    return r;
  }
  static scaler dynamic(double init, std::int64_t window, double min_scale, std::int64_t hysteresis,
                        bool consecutive_hysteresis, bool raise_at_min) {
    scaler r;
    r.k = kind::dynamic;
    r.scale = init;
    r.window = window;
    r.min_scale = min_scale;
    r.hysteresis = r.cur_hysteresis = hysteresis;
    r.consecutive_hysteresis = consecutive_hysteresis;
    r.raise_at_min = raise_at_min;
    return r;
  }

  bool halves_now() const { return hysteresis == 1 || cur_hysteresis == 1; }
  /// DeepSpeed raises when an overflow must halve a scale that already equals the minimum.
  bool would_raise(bool overflow) const {
    return k == kind::dynamic && overflow && halves_now() && scale == min_scale && raise_at_min;
  }
  void update(bool overflow) {
    if (k != kind::dynamic) return;  // no_scaling and static_scale never change
    if (overflow) {
      if (halves_now()) scale = std::max(scale / 2, min_scale);
      else --cur_hysteresis;
      last_overflow_iter = cur_iter;
    } else {
      if (consecutive_hysteresis) cur_hysteresis = hysteresis;
      const std::int64_t stable = cur_iter - last_overflow_iter - 1;
      if (stable > 0 && stable % window == 0) {
        if (!consecutive_hysteresis) cur_hysteresis = hysteresis;
        scale *= 2;
      }
    }
    ++cur_iter;
  }
};

enum class outcome { applied, accumulating, skipped_nonfinite, error };

struct status {
  outcome result = outcome::accumulating;
  double scale_before = 1, scale_after = 1;
  double grad_norm = 0, grad_norm_clipped = 0, clip_coef = 1;
  std::uint64_t step = 0;  // group 0's applied steps after the call
  std::uint64_t skipped_steps = 0, consecutive_skips = 0;
  int micro_step = 0;
  std::size_t bad_tensor = 0;  // outcome::error: the first tensor holding a non-finite gradient
};

struct group {
  rule r = rule::adam;
  hyper h;
  std::uint64_t t = 0;  // applied steps
};

/// Parameter groups of tensors, the scaler and the pipeline options. Tensors are numbered in
/// registration order over all groups.
struct model {
  // pipeline options (mpopt::optimizer_options)
  double clip_grad = 1.0;
  int accumulation_steps = 1;
  bool mean = true;  // accumulation::mean; false: sum
  bool skip_nonfinite = true;
  std::uint64_t max_consecutive_skips = 0;
  scaler sc;

  std::vector<group> groups;
  std::vector<std::size_t> group_of;  // per tensor
  std::vector<tensor> p, m, v, acc;   // master, exp_avg, exp_avg_sq, micro-step accumulator
  std::vector<double> coeffs;         // LAMB trust ratios of the last applied step
  std::vector<tensor> g_applied;      // the clipped true gradient of the last applied step
  int micro = 0;
  std::uint64_t skipped = 0, consecutive = 0;

  std::size_t add_group(rule r, const hyper& h) {
    groups.push_back({r, h, 0});
    return groups.size() - 1;
  }
  void add_tensor(std::size_t g, tensor initial) {
    group_of.push_back(g);
    m.emplace_back(initial.size(), 0.0);
    v.emplace_back(initial.size(), 0.0);
    acc.emplace_back(initial.size(), 0.0);
    p.push_back(std::move(initial));
    coeffs.push_back(1.0);
  }

  /// One step() call: `grads[i]` holds float(grad) of tensor i, as written by the user's backward.
  status step(const std::vector<tensor>& grads) {
    status st;
    st.scale_before = st.scale_after = sc.scale;
    st.step = groups.at(0).t;
    st.skipped_steps = skipped;
    st.consecutive_skips = consecutive;

    for (std::size_t i = 0; i < p.size(); ++i)
      for (std::size_t k = 0; k < p[i].size(); ++k) acc[i][k] += grads[i][k];
    if (++micro < accumulation_steps) {
      st.micro_step = micro;
      return st;
    }
    micro = 0;

    // True gradient: combined / S with S the scale the gradients were made with.
    const double divisor = mean ? accumulation_steps : 1;
    std::vector<tensor> g(p.size());
    bool nonfinite = false;
    double sumsq = 0;
    std::size_t bad = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      g[i].resize(p[i].size());
      for (std::size_t k = 0; k < p[i].size(); ++k) {
        g[i][k] = acc[i][k] / divisor / sc.scale;
        acc[i][k] = 0;
        if (!std::isfinite(g[i][k]) && !nonfinite) {
          nonfinite = true;
          bad = i;
        }
        sumsq += g[i][k] * g[i][k];
      }
    }
    const bool check = skip_nonfinite || sc.k != scaler::kind::none;
    if (check && nonfinite) {
      st.result = outcome::skipped_nonfinite;
      st.grad_norm = st.grad_norm_clipped = std::sqrt(sumsq);
      if (sc.would_raise(true) || (max_consecutive_skips && consecutive + 1 >= max_consecutive_skips)) {
        st.result = outcome::error;  // nothing changes
        st.bad_tensor = bad;
        return st;
      }
      sc.update(true);
      ++skipped;
      ++consecutive;
      st.scale_after = sc.scale;
      st.skipped_steps = skipped;
      st.consecutive_skips = consecutive;
      return st;
    }

    const double norm = std::sqrt(sumsq);
    const double clip = clip_grad > 0 ? std::min(1.0, clip_grad / (norm + 1e-6)) : 1.0;
    for (auto& gr : groups) ++gr.t;
    for (auto& t : g)
      for (double& x : t) x *= clip;
    g_applied = g;
    for (std::size_t i = 0; i < p.size(); ++i) {
      const group& gr = groups[group_of[i]];
      if (gr.r == rule::adam) adam_update(gr.h, gr.t, p[i], m[i], v[i], g[i]);
      else coeffs[i] = lamb_update(gr.h, gr.t, p[i], m[i], v[i], g[i]);
    }
    sc.update(false);
    consecutive = 0;

    st.result = outcome::applied;
    st.grad_norm = norm;
    st.clip_coef = clip;
    st.grad_norm_clipped = norm * clip;
    st.scale_after = sc.scale;
    st.step = groups[0].t;
    st.consecutive_skips = 0;
    return st;
  }

  // FusedAdam (docs/design.md §3.5), step t of the group.
  static void adam_update(const hyper& h, std::uint64_t t, tensor& p, tensor& m, tensor& v, const tensor& grad) {
    const double bc1 = h.bias_correction ? 1 - std::pow(h.beta1, double(t)) : 1;
    const double bc2 = h.bias_correction ? 1 - std::pow(h.beta2, double(t)) : 1;
    for (std::size_t k = 0; k < p.size(); ++k) {
      double g = grad[k];
      if (!h.decoupled) g += h.weight_decay * p[k];
      m[k] = h.beta1 * m[k] + (1 - h.beta1) * g;
      v[k] = h.beta2 * v[k] + (1 - h.beta2) * g * g;
      double u = (m[k] / bc1) / (std::sqrt(v[k] / bc2) + h.eps);
      if (h.decoupled) u += h.weight_decay * p[k];
      p[k] -= h.lr * u;
    }
  }

  // FusedLamb (docs/design.md §3.6): returns the tensor's trust ratio.
  static double lamb_update(const hyper& h, std::uint64_t t, tensor& p, tensor& m, tensor& v, const tensor& grad) {
    tensor u(p.size());
    double pp = 0, uu = 0;
    for (std::size_t k = 0; k < p.size(); ++k) {
      m[k] = h.beta1 * m[k] + (1 - h.beta1) * grad[k];
      v[k] = h.beta2 * v[k] + (1 - h.beta2) * grad[k] * grad[k];
      const double den = h.eps_inside_sqrt ? std::sqrt(v[k] + h.eps) : std::sqrt(v[k]) + h.eps;
      u[k] = m[k] / den + h.weight_decay * p[k];
      pp += p[k] * p[k];
      uu += u[k] * u[k];
    }
    const double w = std::sqrt(pp), un = std::sqrt(uu);
    const double coeff = (w == 0 || un == 0) ? 1.0 : std::clamp(w / un, h.min_coeff, h.max_coeff);
    const double step_size = h.bias_correction
                                 ? h.lr * std::sqrt(1 - std::pow(h.beta2, double(t))) / (1 - std::pow(h.beta1, double(t)))
                                 : h.lr;
    for (std::size_t k = 0; k < p.size(); ++k) p[k] -= step_size * coeff * u[k];
    return coeff;
  }
};

}  // namespace ref
