// A float64 reference of 1-bit LAMB, 1-bit Adam, 0/1 Adam and their compressed all-reduce, written
// from docs/design.md §3.7-§3.10 (and the decisions in docs/compressed-rules.md), NOT from the library's code. It
// includes nothing from mpopt. W ranks are simulated in one process.
//
// Arithmetic is double; values are rounded to float only where the algorithm keeps them in fp32
// buffers and where a sign is taken from them (the worker's compensated vector, the errors, the
// scales, the server's sums), so that the reference decides the same signs as any fp32
// implementation except within float rounding of zero. Such elements are recorded (`tie`).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ref {

inline double f32(double x) { return double(float(x)); }

/// The error-compensated 1-bit all-reduce (DeepSpeed compressed_allreduce), all ranks at once.
/// Either one scale per worker and per server chunk over the whole vector (padded with zeros to a
/// multiple of 8 W, the padding taking part), or per segment (docs/compressed-rules.md, "Compression options"): each
/// segment placed at a multiple of 16, the vector padded to a multiple of 16 W, a worker scale per
/// segment over its elements and a server scale per segment's piece of the server's chunk; the
/// padding then takes no part. Vectors come and go in element order; `place` maps them.
struct compressed_sim {
  std::size_t w = 1, n = 0, padded = 0, chunk = 0;
  bool segmented = false;
  std::vector<std::size_t> starts, sizes;  // per segment (one: the whole vector)
  std::vector<std::size_t> places;         // per element: its place in the padded vector
  std::vector<std::vector<double>> worker_error, server_error;  // per rank: padded, chunk places
  std::vector<double> result;                                    // per place: the average every rank gets
  std::vector<char> tie;  // places whose sign was ever decided within float rounding of zero

  compressed_sim() = default;
  compressed_sim(std::size_t ranks, std::size_t elements)
      : w(ranks), n(elements), padded((elements + 8 * ranks - 1) / (8 * ranks) * (8 * ranks)), starts{0}, sizes{padded} {
    for (std::size_t i = 0; i < n; ++i) places.push_back(i);
    allocate();
  }
  /// Segments of these sizes, each with its own scales.
  compressed_sim(std::size_t ranks, const std::vector<std::size_t>& segment_sizes) : w(ranks), segmented(true) {
    for (std::size_t size : segment_sizes) {
      starts.push_back(padded);
      sizes.push_back(size);
      for (std::size_t i = 0; i < size; ++i) places.push_back(padded + i);
      padded += (size + 15) / 16 * 16;
      n += size;
    }
    padded = (padded + 16 * ranks - 1) / (16 * ranks) * (16 * ranks);
    allocate();
  }

  std::size_t place(std::size_t i) const { return places[i]; }
  /// The average of element i after run().
  double average(std::size_t i) const { return result[places[i]]; }
  bool tied_at(std::size_t i) const { return tie[places[i]] != 0; }

  /// Whether element k of tensor i (of `tensors`, back to back) has had a tied sign.
  bool tied(const std::vector<std::vector<double>>& tensors, std::size_t i, std::size_t k) const {
    std::size_t at = k;
    for (std::size_t j = 0; j < i; ++j) at += tensors[j].size();
    return tied_at(at);
  }

  /// One round: x[r] is rank r's vector (n elements); result = the compressed average.
  void run(const std::vector<std::vector<double>>& x) {
    const double near_zero = 1e-6;  // relative to the scale
    const std::size_t segs = starts.size();
    std::vector<std::vector<int>> sign(w, std::vector<int>(padded, 1));
    std::vector<std::vector<double>> scale(w, std::vector<double>(segs, 0.0));
    for (std::size_t r = 0; r < w; ++r) {
      // worker: y = x + e (kept in the fp32 error buffer), s = ||y|| / sqrt(N), e = y - s sign(y)
      std::vector<double> y(padded, 0.0);
      for (std::size_t i = 0; i < n; ++i) y[places[i]] = x[r][i];
      for (std::size_t k = 0; k < segs; ++k) {
        double sumsq = 0;
        for (std::size_t i = starts[k]; i < starts[k] + sizes[k]; ++i) {
          y[i] = f32(y[i] + worker_error[r][i]);
          sumsq += y[i] * y[i];
        }
        scale[r][k] = sizes[k] ? f32(std::sqrt(sumsq / double(sizes[k]))) : 0.0;
        for (std::size_t i = starts[k]; i < starts[k] + sizes[k]; ++i) {
          sign[r][i] = y[i] >= 0 ? 1 : -1;  // zero counts as positive
          if (std::fabs(y[i]) <= near_zero * scale[r][k]) tie[i] = 1;
          worker_error[r][i] = f32(y[i] - scale[r][k] * sign[r][i]);
        }
      }
    }
    for (std::size_t j = 0; j < w; ++j)  // server j: chunk j, c = sum_r sign * s_r / W + e_s, per segment's piece
      for (std::size_t k = 0; k < segs; ++k) {
        const std::size_t lo = std::max(starts[k], j * chunk), hi = std::min(starts[k] + sizes[k], (j + 1) * chunk);
        if (hi <= lo) continue;
        std::vector<double> c(hi - lo);
        double sumsq = 0;
        for (std::size_t i = lo; i < hi; ++i) {
          double sum = 0;
          for (std::size_t r = 0; r < w; ++r) sum += sign[r][i] * f32(scale[r][k] * f32(1.0 / double(w)));
          c[i - lo] = f32(sum + server_error[j][i - j * chunk]);
          sumsq += c[i - lo] * c[i - lo];
        }
        const double s = f32(std::sqrt(sumsq / double(hi - lo)));
        for (std::size_t i = lo; i < hi; ++i) {
          const int b = c[i - lo] >= 0 ? 1 : -1;
          if (std::fabs(c[i - lo]) <= near_zero * s) tie[i] = 1;
          server_error[j][i - j * chunk] = f32(c[i - lo] - s * b);
          result[i] = s * b;
        }
      }
  }

 private:
  void allocate() {
    chunk = padded / w;
    worker_error.assign(w, std::vector<double>(padded, 0.0));
    server_error.assign(w, std::vector<double>(chunk, 0.0));
    result.assign(padded, 0.0);
    tie.assign(padded, 0);
  }
};

/// Which averages a compressing rule keeps (docs/compressed-rules.md, "Compression options"): where the user's mask
/// (exp_avg_mask; empty: none) is 1 and, with exclude_zero_variance, the element's variance is above
/// `ratio` times its tensor's mean variance.
struct kept_averages {
  bool exclude_zero_variance = false;
  double ratio = 0;
  std::vector<char> mask;      // per element, every tensor back to back
  std::vector<double> zero;    // per tensor: the variance that counts as zero (prepare)
  /// The thresholds for variances v (per tensor), before keeps().
  void prepare(const std::vector<std::vector<double>>& v) {
    zero.clear();
    for (const auto& t : v) {
      double sum = 0;
      for (double x : t) sum += x;
      zero.push_back(t.empty() ? 0.0 : ratio * (sum / double(t.size())));
    }
  }
  /// Element `at` of all, of tensor i, whose variance is `variance`.
  bool keeps(std::size_t at, std::size_t i, double variance) const {
    return (mask.empty() || mask[at]) && !(exclude_zero_variance && variance <= zero[i]);
  }
};

/// The simulated exchange of `sizes` tensors on `ranks` ranks: per tensor or over all of them.
inline compressed_sim sim_for(std::size_t ranks, const std::vector<std::size_t>& sizes, bool per_tensor) {
  if (per_tensor) return compressed_sim(ranks, sizes);
  std::size_t total = 0;
  for (std::size_t s : sizes) total += s;
  return compressed_sim(ranks, total);
}

struct onebit_hyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double min_coeff = 0.01, max_coeff = 10.0;
  std::uint64_t freeze_step = 100000;
  double coeff_beta = 0.9, factor_max = 4.0, factor_min = 0.5, factor_threshold = 0.1;
  bool per_tensor = false;  // compression scales per tensor
};

/// 1-bit LAMB over W ranks, one parameter group, no loss scaling, gradients clipped by the global
/// norm (warm-up: of the average over ranks; compression stage: the root mean square of the ranks'
/// local norms, the same on every rank).
struct onebit_model {
  std::size_t world = 1;
  double clip_grad = 1.0;
  onebit_hyper h;
  std::vector<std::vector<double>> p, m, v, v_fresh;  // per tensor
  std::vector<double> coeff_freeze, last_factor, scaling, coeffs;
  std::uint64_t t = 0, compression_step = 0;
  double grad_norm = 0;
  compressed_sim sim;
  kept_averages kept;

  onebit_model(std::size_t ranks, const onebit_hyper& hyper, std::vector<std::vector<double>> init)
      : world(ranks), h(hyper), p(std::move(init)) {
    for (const auto& x : p) {
      m.emplace_back(x.size(), 0.0);
      v.emplace_back(x.size(), 0.0);
      v_fresh.emplace_back(x.size(), 0.0);
    }
    coeff_freeze.assign(p.size(), 0.0);
    last_factor.assign(p.size(), 1.0);
    scaling.assign(p.size(), 1.0);
    coeffs.assign(p.size(), 1.0);
    sim = sim_for(ranks, sizes(), h.per_tensor);
  }

  std::vector<std::size_t> sizes() const {
    std::vector<std::size_t> out;
    for (const auto& x : p) out.push_back(x.size());
    return out;
  }

  static double norm(const std::vector<double>& x) {
    double s = 0;
    for (double e : x) s += e * e;
    return std::sqrt(s);
  }

  /// One applied step; g[r][i] is rank r's true gradient of tensor i.
  void step(const std::vector<std::vector<std::vector<double>>>& g) {
    ++t;
    kept.prepare(v);  // the variance the step starts from (frozen, or the last variance step's)
    if (t <= h.freeze_step) warm_up(g);
    else compress(g);
  }

  void warm_up(const std::vector<std::vector<std::vector<double>>>& g) {
    std::vector<std::vector<double>> avg(p.size());
    double ss = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      avg[i].assign(p[i].size(), 0.0);
      for (std::size_t r = 0; r < world; ++r)
        for (std::size_t k = 0; k < p[i].size(); ++k) avg[i][k] += g[r][i][k] / double(world);
      for (double x : avg[i]) ss += x * x;
    }
    grad_norm = std::sqrt(ss);
    const double clip = clip_factor();
    for (std::size_t i = 0; i < p.size(); ++i) {
      std::vector<double> u(p[i].size());
      for (std::size_t k = 0; k < p[i].size(); ++k) {
        const double gk = avg[i][k] * clip;
        m[i][k] = h.beta1 * m[i][k] + (1 - h.beta1) * gk;
        v[i][k] = h.beta2 * v[i][k] + (1 - h.beta2) * gk * gk;
        u[k] = m[i][k] / (std::sqrt(v[i][k]) + h.eps) + h.weight_decay * p[i][k];
      }
      if (t == h.freeze_step) v_fresh[i] = v[i];
      const double wn = norm(p[i]), un = norm(u);
      double coeff = 1.0;
      if (wn != 0 && un != 0) coeff = std::clamp(wn / un, h.min_coeff, h.max_coeff);
      if (coeff != 1.0) coeff_freeze[i] = h.coeff_beta * coeff_freeze[i] + (1 - h.coeff_beta) * coeff;
      coeffs[i] = coeff;
      for (std::size_t k = 0; k < p[i].size(); ++k) p[i][k] -= h.lr * coeff * u[k];
    }
  }

  void compress(const std::vector<std::vector<std::vector<double>>>& g) {
    if (compression_step == 0) {  // momentum scaling coefficients, once
      compression_step = t;
      std::vector<double> s(p.size());
      double mean = 0;
      for (std::size_t i = 0; i < p.size(); ++i) {
        s[i] = norm(m[i]) / std::sqrt(double(p[i].size()));
        mean += s[i] / double(p.size());
      }
      for (std::size_t i = 0; i < p.size(); ++i) scaling[i] = f32(s[i] > 0 ? mean / s[i] : 1.0);  // an fp32 multiplier
    }
    double ss = 0;
    for (std::size_t r = 0; r < world; ++r)
      for (std::size_t i = 0; i < p.size(); ++i)
        for (double x : g[r][i]) ss += x * x;
    grad_norm = std::sqrt(ss / double(world));
    const double clip = clip_factor();
    // The averaged momentum: exact with one rank, else the compressed average of the ranks' scaled ones.
    std::vector<std::vector<double>> m_new(p.size());
    if (world == 1) {
      for (std::size_t i = 0; i < p.size(); ++i)
        for (std::size_t k = 0; k < p[i].size(); ++k)
          m_new[i].push_back(h.beta1 * m[i][k] + (1 - h.beta1) * g[0][i][k] * clip);
    } else {
      std::vector<std::vector<double>> x(world);
      for (std::size_t r = 0; r < world; ++r)
        for (std::size_t i = 0; i < p.size(); ++i)
          for (std::size_t k = 0; k < p[i].size(); ++k)
            x[r].push_back(scaling[i] * (h.beta1 * m[i][k] + (1 - h.beta1) * g[r][i][k] * clip));
      sim.run(x);
      // The momentum is an fp32 buffer: what the next round compresses starts from its float value.
      std::size_t at = 0;
      for (std::size_t i = 0; i < p.size(); ++i)
        for (std::size_t k = 0; k < p[i].size(); ++k) m_new[i].push_back(f32(sim.average(at++) / scaling[i]));
    }
    std::size_t at = 0;
    for (std::size_t i = 0; i < p.size(); ++i)
      for (std::size_t k = 0; k < p[i].size(); ++k, ++at)
        if (!kept.keeps(at, i, v[i][k])) m_new[i][k] = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      const std::size_t n = p[i].size();
      std::vector<double> u0(n), u(n);
      double largest = 0;
      for (std::size_t k = 0; k < n; ++k) {
        const double rg = (m_new[i][k] - h.beta1 * m[i][k]) / (1 - h.beta1);  // reconstructed gradient
        v_fresh[i][k] = h.beta2 * v_fresh[i][k] + (1 - h.beta2) * rg * rg;
        const double den = std::sqrt(v[i][k]) + h.eps;  // v frozen
        u0[k] = m_new[i][k] / den;
        u[k] = u0[k] + h.weight_decay * p[i][k];
        largest = std::max(largest, den / (std::sqrt(v_fresh[i][k]) + h.eps));
        m[i][k] = m_new[i][k];
      }
      double f = largest;
      if (h.weight_decay > 0) {
        const double un = norm(u), r = un > 0 ? std::min(1.0, norm(u0) / un) : 1.0;
        f = f * r + (1 - r);
      }
      f = std::clamp(f, h.factor_min, h.factor_max);
      f = std::clamp(f, last_factor[i] * (1 - h.factor_threshold), last_factor[i] * (1 + h.factor_threshold));
      last_factor[i] = f;
      coeffs[i] = coeff_freeze[i] * f;
      for (std::size_t k = 0; k < n; ++k) p[i][k] -= h.lr * coeffs[i] * u[k];
    }
  }

  double clip_factor() const { return clip_grad > 0 ? std::min(1.0, clip_grad / (grad_norm + 1e-6)) : 1.0; }

  /// Whether element k of tensor i has had a sign decided within rounding of zero.
  bool tied(std::size_t i, std::size_t k) const { return world > 1 && sim.tied(p, i, k); }
};

/// 1-bit Adam over W ranks (docs/design.md §3.8), one parameter group, no loss scaling, no
/// clipping. Warm-up (applied steps 1..freeze_step): gradients averaged over ranks, m and v
/// advanced, uncorrected. Then v is frozen and each rank's momentum beta1 m + (1 - beta1) g_r goes
/// through the compressed all-reduce. Both stages: p -= lr (m / (sqrt(v) + eps) + wd p).
struct onebit_adam_model {
  struct hyper {
    double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
    std::uint64_t freeze_step = 100000;
    bool per_tensor = false;  // compression scales per tensor
  };
  std::size_t world = 1;
  hyper h;
  std::vector<std::vector<double>> p, m, v;  // per tensor
  std::uint64_t t = 0, compression_step = 0;
  compressed_sim sim;
  kept_averages kept;

  onebit_adam_model(std::size_t ranks, const hyper& hy, std::vector<std::vector<double>> init)
      : world(ranks), h(hy), p(std::move(init)) {
    for (const auto& x : p) {
      m.emplace_back(x.size(), 0.0);
      v.emplace_back(x.size(), 0.0);
    }
    std::vector<std::size_t> sizes;
    for (const auto& x : p) sizes.push_back(x.size());
    sim = sim_for(ranks, sizes, h.per_tensor);
  }

  /// One applied step; g[r][i][k] is rank r's gradient of tensor i.
  void step(const std::vector<std::vector<std::vector<double>>>& g) {
    ++t;
    kept.prepare(v);  // the variance the step starts from (frozen, or the last variance step's)
    if (t <= h.freeze_step) {
      for (std::size_t i = 0; i < p.size(); ++i)
        for (std::size_t k = 0; k < p[i].size(); ++k) {
          double avg = 0;
          for (std::size_t r = 0; r < world; ++r) avg += g[r][i][k] / double(world);
          m[i][k] = h.beta1 * m[i][k] + (1 - h.beta1) * avg;
          v[i][k] = h.beta2 * v[i][k] + (1 - h.beta2) * avg * avg;
        }
    } else {
      if (compression_step == 0) compression_step = t;
      std::vector<std::vector<double>> x(world);
      for (std::size_t r = 0; r < world; ++r)
        for (std::size_t i = 0; i < p.size(); ++i)
          for (std::size_t k = 0; k < p[i].size(); ++k) x[r].push_back(h.beta1 * m[i][k] + (1 - h.beta1) * g[r][i][k]);
      if (world > 1) sim.run(x);
      std::size_t at = 0;
      for (std::size_t i = 0; i < p.size(); ++i)
        for (std::size_t k = 0; k < p[i].size(); ++k, ++at)
          m[i][k] = !kept.keeps(at, i, v[i][k]) ? 0.0 : world > 1 ? f32(sim.average(at)) : x[0][at];
    }
    for (std::size_t i = 0; i < p.size(); ++i)
      for (std::size_t k = 0; k < p[i].size(); ++k)
        p[i][k] -= h.lr * (m[i][k] / (std::sqrt(v[i][k]) + h.eps) + h.weight_decay * p[i][k]);
  }
};

/// 0/1 Adam over W ranks (docs/design.md §3.9), one parameter group, no loss scaling, no clipping;
/// the schedule in DeepSpeed's count s = t + 1 (its set-up call is s = 1). Phase 2 lets the ranks'
/// parameters, momenta and accumulators part between syncs, so those are kept per rank.
struct zero_one_adam_model {
  struct hyper {
    double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
    std::uint64_t var_freeze_step = 100000, var_update_scaler = 16, local_step_scaler = 32678, local_step_clipper = 16;
    bool per_tensor = false;  // compression scales per tensor
  };
  using tensors = std::vector<std::vector<double>>;
  std::size_t world = 1;
  hyper h;
  std::vector<tensors> p, m, a;  // per rank, per tensor
  tensors v;                     // the same on every rank
  double lr_sum = 0;
  // DeepSpeed's schedule state, advanced as its code does.
  std::uint64_t t = 0, var_interval = 1, var_counter = 0, local_interval = 1, local_counter = 0;
  bool variance = false, exchanged = false;  // what the last step was
  compressed_sim sim;
  kept_averages kept;

  zero_one_adam_model(std::size_t ranks, const hyper& hy, const tensors& init)
      : world(ranks), h(hy), p(ranks, init), m(ranks), a(ranks) {
    for (const auto& x : init) v.emplace_back(x.size(), 0.0);
    for (std::size_t r = 0; r < ranks; ++r)
      for (const auto& x : init) m[r].emplace_back(x.size(), 0.0), a[r].emplace_back(x.size(), 0.0);
    std::vector<std::size_t> sizes;
    for (const auto& x : init) sizes.push_back(x.size());
    sim = sim_for(ranks, sizes, h.per_tensor);
  }

  /// One applied step; g[r][i][k] is rank r's gradient of tensor i.
  void step(const std::vector<tensors>& g) {
    ++t;
    kept.prepare(v);  // the variance the step starts from (frozen, or the last variance step's)
    const std::uint64_t s = t + 1;
    exchanged = false;
    auto update = [&](std::size_t r, std::size_t i, std::size_t k) {
      const double u = m[r][i][k] / (std::sqrt(v[i][k]) + h.eps) + h.weight_decay * p[r][i][k];
      p[r][i][k] -= h.lr * u;
      return u;
    };
    if (t <= h.var_freeze_step) {  // phase 1
      variance = s % var_interval == 0;
      std::vector<double> avg;  // the gradient every rank's momentum takes
      if (variance || world == 1) {
        for (std::size_t i = 0; i < v.size(); ++i)
          for (std::size_t k = 0; k < v[i].size(); ++k) {
            double x = 0;
            for (std::size_t r = 0; r < world; ++r) x += g[r][i][k] / double(world);
            avg.push_back(x);
          }
      } else {
        std::vector<std::vector<double>> x(world);
        for (std::size_t r = 0; r < world; ++r)
          for (const auto& gi : g[r]) x[r].insert(x[r].end(), gi.begin(), gi.end());
        sim.run(x);
        for (std::size_t at = 0; at < sim.n; ++at) avg.push_back(sim.average(at));
        exchanged = true;
      }
      std::size_t at = 0;
      for (std::size_t i = 0; i < v.size(); ++i)
        for (std::size_t k = 0; k < v[i].size(); ++k, ++at) {
          if (!variance && !kept.keeps(at, i, v[i][k])) avg[at] = 0;
          if (variance) v[i][k] = h.beta2 * v[i][k] + (1 - h.beta2) * avg[at] * avg[at];
          for (std::size_t r = 0; r < world; ++r) {
            m[r][i][k] = h.beta1 * m[r][i][k] + (1 - h.beta1) * avg[at];
            update(r, i, k);
          }
        }
      if (variance && ++var_counter == h.var_update_scaler) var_counter = 0, var_interval *= 2;
      if (t == h.var_freeze_step)  // after the step with s > V: the errors restart for phase 2
        for (std::size_t r = 0; r < world; ++r) {
          std::fill(sim.worker_error[r].begin(), sim.worker_error[r].end(), 0.0);
          std::fill(sim.server_error[r].begin(), sim.server_error[r].end(), 0.0);
        }
      return;
    }
    variance = false;  // phase 2
    lr_sum += h.lr;
    for (std::size_t r = 0; r < world; ++r)
      for (std::size_t i = 0; i < v.size(); ++i)
        for (std::size_t k = 0; k < v[i].size(); ++k) {
          m[r][i][k] = h.beta1 * m[r][i][k] + (1 - h.beta1) * g[r][i][k];
          a[r][i][k] -= h.lr * update(r, i, k);
        }
    if (s % local_interval == 0) {  // sync
      std::vector<std::vector<double>> x(world);
      for (std::size_t r = 0; r < world; ++r)
        for (std::size_t i = 0; i < v.size(); ++i)
          for (std::size_t k = 0; k < v[i].size(); ++k) {
            p[r][i][k] -= a[r][i][k];
            a[r][i][k] *= std::sqrt(v[i][k]) + h.eps;
            x[r].push_back(a[r][i][k]);
          }
      std::vector<double> avg = x[0];
      if (world > 1) {
        sim.run(x);
        for (std::size_t at = 0; at < sim.n; ++at) avg[at] = sim.average(at);
        exchanged = true;
      }
      std::size_t at = 0;
      for (std::size_t i = 0; i < v.size(); ++i)
        for (std::size_t k = 0; k < v[i].size(); ++k, ++at)
          if (!kept.keeps(at, i, v[i][k])) avg[at] = 0;
      const double lrs = f32(lr_sum);  // the divisor is an fp32 scalar
      for (std::size_t r = 0; r < world; ++r) {
        std::size_t at = 0;
        for (std::size_t i = 0; i < v.size(); ++i)
          for (std::size_t k = 0; k < v[i].size(); ++k, ++at) {
            m[r][i][k] = -avg[at] / lrs;
            p[r][i][k] += avg[at] / (std::sqrt(v[i][k]) + h.eps);
            a[r][i][k] = 0;
          }
      }
      lr_sum = 0;
    }
    if (++local_counter == h.local_step_scaler) local_counter = 0, local_interval = std::min(h.local_step_clipper, 2 * local_interval);
  }
};

}  // namespace ref
