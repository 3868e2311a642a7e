// mpopt benchmark: the time of one optimizer step() against the minimal-traffic kernel (one pass
// moving only the bytes the update cannot avoid), measured in the same process, alternated
// (protocol and fields: bench/README.md).
//
//   optimizer_step [--params N] [--repeat R] [--filter SUBSTR] [--quick] [--small-step N]
//
// Cases: precision {fp32, fp16, bf16} x rule {adam, lamb} x layout {fused, unfused}, and bf16 Adam
// with stochastic rounding (precision "bf16_stochastic"), all clipping at 1; then fp32 and bf16
// without clipping or overflow skip ("/noclip"), where nothing must be known before the update.
//   fused:   one flat group (add_flat_group) holding one tensor of N parameters;
//   unfused: the same N split into 10,000 user-owned tensors (std::vector) registered with add().
// --filter matches a substring of "precision/rule/layout[/noclip]" (e.g. "fp16/adam", "/fused").
//
// Per case: warm-up (every buffer first-touched, one untimed step, one untimed run of each
// reference), then R rounds of (memcpy, same-traffic kernel, minimal-traffic kernel, step, naive
// baseline), each timed alone. One JSON line per case on stdout; progress and errors go to stderr.
#include "small_step.hpp"
#include "stored_state.hpp"
#include "traffic.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace {

using namespace bench;

/// The baseline: the step as straightforward code writes it, on one thread in plain scalar loops (the
/// formulas of DeepSpeed's FusedAdam / FusedLamb with the wrapper's unscale, overflow check and
/// global-norm clip), over the step's own buffers. It updates them for real (lr 1e-3, 1e-4 for
/// LAMB), which does not change what the timed steps do. Returns the global norm.
template <class Precision, class Rule>
double naive_step(const std::vector<segment<Precision>>& segs, double loss_scale, int t) {
  using P = typename Precision::param_type;
  constexpr bool is_lamb = std::is_same_v<Rule, mpopt::lamb>;
  const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f, lr = is_lamb ? 1e-4f : 1e-3f;
  const float inv_scale = float(1.0 / loss_scale);
  // Pass 1: overflow check and global norm of the unscaled gradient.
  double ss = 0;
  bool finite = true;
  for (const auto& s : segs)
    for (std::size_t i = 0; i < s.n; ++i) {
      const float g = float(s.grad[i]) * inv_scale;
      finite = finite && std::isfinite(g);
      ss += double(g) * double(g);
    }
  const double norm = std::sqrt(ss);
  if (!finite) return norm;
  const float clip = norm > 1.0 ? float(1.0 / (norm + 1e-6)) : 1.0f;
  const float bc1 = 1.0f - std::pow(b1, float(t)), bc2 = 1.0f - std::pow(b2, float(t));
  for (const auto& s : segs) {
    if constexpr (!is_lamb) {  // AdamW
      for (std::size_t i = 0; i < s.n; ++i) {
        const float g = float(s.grad[i]) * inv_scale * clip;
        s.m[i] = b1 * s.m[i] + (1 - b1) * g;
        s.v[i] = b2 * s.v[i] + (1 - b2) * g * g;
        const float u = (s.m[i] / bc1) / (std::sqrt(s.v[i] / bc2) + eps) + wd * s.master[i];
        s.master[i] -= lr * u;
        if constexpr (Precision::has_master) s.param[i] = P(s.master[i]);
      }
    } else {  // LAMB: moments and the two norms, then the update with the trust ratio
      double ww = 0, uu = 0;
      for (std::size_t i = 0; i < s.n; ++i) {
        const float g = float(s.grad[i]) * inv_scale * clip;
        s.m[i] = b1 * s.m[i] + (1 - b1) * g;
        s.v[i] = b2 * s.v[i] + (1 - b2) * g * g;
        const float u = s.m[i] / (std::sqrt(s.v[i]) + eps) + wd * s.master[i];
        ww += double(s.master[i]) * s.master[i];
        uu += double(u) * u;
      }
      const float ratio = ww > 0 && uu > 0 ? std::clamp(float(std::sqrt(ww / uu)), 0.01f, 10.0f) : 1.0f;
      const float step = lr * std::sqrt(bc2) / bc1 * ratio;
      for (std::size_t i = 0; i < s.n; ++i) {
        const float u = s.m[i] / (std::sqrt(s.v[i]) + eps) + wd * s.master[i];
        s.master[i] -= step * u;
        if constexpr (Precision::has_master) s.param[i] = P(s.master[i]);
      }
    }
  }
  return norm;
}

/// Calls f(begin, end, thread) in each OpenMP thread for its contiguous, cache-line-aligned slice
/// of [0, bytes); the memcpy reference and its buffers' first touch share this slicing.
template <class F>
void for_each_thread_slice(std::size_t bytes, F&& f) {
  BENCH_OMP(omp parallel) {
#if defined(_OPENMP)
    const std::size_t t = std::size_t(omp_get_thread_num()), nt = std::size_t(omp_get_num_threads());
#else
    const std::size_t t = 0, nt = 1;
#endif
    const std::size_t lines = bytes / 64;
    const std::size_t b = lines * t / nt * 64;
    const std::size_t e = t + 1 == nt ? bytes : lines * (t + 1) / nt * 64;
    f(b, e, t);
  }
}

/// memcpy of `bytes` from src to dst, each thread copying one contiguous slice.
void threaded_memcpy(std::byte* dst, const std::byte* src, std::size_t bytes) {
  for_each_thread_slice(bytes, [&](std::size_t b, std::size_t e, std::size_t) { std::memcpy(dst + b, src + b, e - b); });
}

struct aligned_bytes {
  struct release {
    void operator()(std::byte* p) const { ::operator delete(p, std::align_val_t{64}); }
  };
  std::unique_ptr<std::byte, release> p;
  std::size_t size = 0;
  explicit aligned_bytes(std::size_t n)
      : p(static_cast<std::byte*>(::operator new(n, std::align_val_t{64}))), size(n) {
    // First touch by the threads that will copy (same slicing as threaded_memcpy).
    std::byte* d = p.get();
    for_each_thread_slice(n, [&](std::size_t b, std::size_t e, std::size_t t) { std::memset(d + b, int(0x5A + t), e - b); });
  }
};

template <class Precision, class Scaler, class Rule>
void run_case(const config& cfg, std::string_view precision, std::string_view rule, bool fused, bool clipped,
              aligned_bytes& copy_src, aligned_bytes& copy_dst) {
  using P = typename Precision::param_type;
  using G = typename Precision::grad_type;
  using opt_t = mpopt::optimizer<Precision, Scaler, mpopt::replicated, Rule>;
  const std::string_view layout = fused ? "fused" : "unfused";
  const std::string name = case_name(precision, rule, fused, clipped);
  if (!cfg.wants(name)) return;
  std::fprintf(stderr, "optimizer_step: %s ...\n", name.c_str());

  const std::size_t n = cfg.params;
  const case_settings<Scaler, Rule> settings(clipped);
  opt_t opt(settings.optimizer, settings.scaler);
  const auto& ro = settings.rule;

  // Parameters and gradients: the flat group's views, or user-owned vectors.
  std::vector<std::vector<P>> user_params;
  std::vector<std::vector<G>> user_grads;
  std::vector<std::span<P>> params;
  std::vector<std::span<G>> grads;
  if (fused) {
    auto& g = opt.add_flat_group(ro, {{"flat", n}});
    params.push_back(g.param(0));
    grads.push_back(g.grad(0));
  } else {
    auto& g = opt.add_group(ro);
    for (std::size_t sz : unfused_sizes(n, host_unfused_tensors)) {
      user_params.emplace_back(sz);
      user_grads.emplace_back(sz);
    }
    for (std::size_t t = 0; t < user_params.size(); ++t) {
      g.add(user_params[t], user_grads[t], "t" + std::to_string(t));
      params.push_back(user_params[t]);
      grads.push_back(user_grads[t]);
    }
  }
  // Gradients as the user's backward writes them: true gradient * loss scale, rounded to G.
  const float gsigma = grad_sigma * float(opt.loss_scale());
  for (std::size_t t = 0; t < params.size(); ++t) {
    fill_normal(params[t].data(), params[t].size(), param_sigma, 2 * t + 1);
    fill_normal(grads[t].data(), grads[t].size(), gsigma, 2 * t + 2);
  }

  // Warm-up: state allocated and first-touched, one untimed step.
  auto checked_step = [&] {
    const auto st = opt.step();
    if (!st.applied) {
      std::fprintf(stderr, "optimizer_step: %s: step not applied (%s)\n", name.c_str(), std::string(st.reason()).c_str());
      std::exit(1);
    }
  };
  checked_step();

  // The step's own buffers, for the reference kernels, each run once untimed.
  const auto segs = segments_of<Precision>(opt, params, grads);
  const auto chunks = make_chunks(segs);
  const bool prepass = settings.prepass();
  float keep = minimal_traffic<Precision, Rule>(segs, chunks) + same_traffic<Precision, Rule>(segs, chunks, prepass);
  double norms = naive_step<Precision, Rule>(segs, opt.loss_scale(), 2);

  constexpr std::size_t minimal = minimal_bytes_per_param<Precision, Rule>();
  const std::size_t own = minimal + (prepass ? prepass_bytes_per_param<Precision>() : 0);
  const double total = double(minimal) * double(n), own_total = double(own) * double(n);
  const std::size_t half_bytes = std::size_t(own_total / 2);
  threaded_memcpy(copy_dst.p.get(), copy_src.p.get(), half_bytes);

  std::vector<double> t_copy, t_same, t_limit, t_step, t_naive;
  for (int r = 0; r < cfg.repeat; ++r) {
    timed(t_copy, [&] { threaded_memcpy(copy_dst.p.get(), copy_src.p.get(), half_bytes); });
    timed(t_same, [&] { keep += same_traffic<Precision, Rule>(segs, chunks, prepass); });
    timed(t_limit, [&] { keep += minimal_traffic<Precision, Rule>(segs, chunks); });
    timed(t_step, checked_step);
    timed(t_naive, [&] { norms += naive_step<Precision, Rule>(segs, opt.loss_scale(), 3 + r); });
  }
  if (keep == 1234.5f || norms == 0.5) std::fprintf(stderr, " ");  // keeps the references' reductions alive

  const stats step = gbps(t_step, total), limit = gbps(t_limit, total), limit_ratio = paired_ratio(t_limit, t_step),
              own_ratio = paired_ratio(t_same, t_step);
  // The step's own passes against memcpy or the same-traffic kernel (the ratio of earlier runs).
  const stats own_step = gbps(t_step, own_total), copy = gbps(t_copy, own_total), same = gbps(t_same, own_total),
              naive = gbps(t_naive, own_total);
  const double copy_gbps = std::max(copy.median, same.median);
  // The unfused case against the fused one of the same run: step time ratio.
  static std::string fused_case;
  static double fused_seconds = 0;
  const double seconds = summarize(t_step).median;
  const std::string this_case = case_name(precision, rule, true, clipped);
  std::string vs_fused;
  if (fused) fused_case = this_case, fused_seconds = seconds;
  else if (fused_case == this_case) vs_fused = std::string(",\"time_vs_fused\":").append(std::to_string(seconds / fused_seconds));
  std::printf(
      "{\"bench\":\"optimizer_step\",\"precision\":\"%.*s\",\"rule\":\"%.*s\",\"layout\":\"%.*s\",\"clip_grad\":%g,"
      "\"prepass\":%s,\"params\":%zu,\"tensors\":%zu,\"threads\":%d,\"simd\":\"%s\",\"bytes_per_param\":%zu,"
      "\"gbps\":%.2f,\"limit_ratio\":%.3f,\"limit_ratio_min\":%.3f,\"limit_ratio_max\":%.3f,\"limit_gbps\":%.2f,"
      "\"own_bytes_per_param\":%zu,\"own_ratio\":%.3f,\"own_ratio_min\":%.3f,\"own_ratio_max\":%.3f,"
      "\"copy_gbps\":%.2f,\"ratio\":%.3f,\"baseline_ratio\":%.2f,\"gbps_min\":%.2f,\"gbps_max\":%.2f,"
      "\"memcpy_gbps\":%.2f,\"same_traffic_gbps\":%.2f,\"baseline_gbps\":%.2f%s}\n",
      int(precision.size()), precision.data(), int(rule.size()), rule.data(), int(layout.size()), layout.data(),
      settings.optimizer.clip_grad, prepass ? "true" : "false", n, params.size(), max_threads(),
      std::string(mpopt::to_string(mpopt::host::simd())).c_str(), minimal, step.median, limit_ratio.median,
      limit_ratio.min, limit_ratio.max, limit.median, own, own_ratio.median, own_ratio.min, own_ratio.max, copy_gbps,
      own_step.median / copy_gbps, own_step.median / naive.median, step.min, step.max, copy.median, same.median,
      naive.median, vs_fused.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t small_step = 0;
  command_line cl;
  cl.extra.push_back({"--small-step", "N", "instead of the cases: the threads on small steps, at N parameters and "
                      "below (bench/README.md, \"Threads\"), --repeat steps per setting",
                      [&](const std::string& v) { small_step = std::stoull(v); }});
  const config cfg = parse(argc, argv, cl);
  if (small_step) {
    run_small_steps(small_step, cfg.repeat);
    return 0;
  }

  // memcpy buffers for the largest case (LAMB fp32 with its pre-pass: 44 B/param), first-touched once.
  aligned_bytes src(cfg.params * largest_bytes_per_param / 2 + 64), dst(cfg.params * largest_bytes_per_param / 2 + 64);

  return guarded("optimizer_step", [&] {
    for_each_case([&]<class P, class S, class R>(std::string_view precision, std::string_view rule, bool fused, bool clipped) {
      run_case<P, S, R>(cfg, precision, rule, fused, clipped, src, dst);
    });
    run_stored_cases(cfg);
  });
}
