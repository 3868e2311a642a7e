// mpopt benchmark: the time of one optimizer step() against the memory system's limit for the same
// traffic, measured in the same process (protocol: /work/shared/BENCH.md, fields: bench/README.md).
//
//   optimizer_step [--params N] [--repeat R] [--filter SUBSTR] [--quick]
//
// Cases: precision {fp32, fp16, bf16} x rule {adam, lamb} x layout {fused, unfused}, and bf16 Adam
// with stochastic rounding (precision "bf16_stochastic").
//   fused:   one flat group (add_flat_group) holding one tensor of N parameters;
//   unfused: the same N split into 10,000 user-owned tensors (std::vector) registered with add().
// --filter matches a substring of "precision/rule/layout" (e.g. "fp16/adam", "/fused").
//
// Per case: warm-up (every buffer first-touched, one untimed step, one untimed run of each
// reference), then R rounds of (memcpy reference, same-traffic reference, step, naive baseline),
// each timed alone. One JSON line per case on stdout; progress and errors go to stderr.
#include "common.hpp"

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

/// One tensor as the step sees it: the user's (or the flat group's) param and grad, the optimizer's
/// fp32 master (== param for fp32) and moments.
template <class Precision>
struct segment {
  using P = typename Precision::param_type;
  using G = typename Precision::grad_type;
  P* param;
  G* grad;
  float* master;
  float* m;
  float* v;
  std::size_t n;
};

struct chunk {
  std::size_t seg, begin, n;
};

/// Every segment cut into chunks of at most 2^16 elements, in order; threads take them with
/// `omp parallel for schedule(static)`, i.e. contiguous runs, like the step's work list.
template <class S>
std::vector<chunk> make_chunks(const std::vector<S>& segs) {
  constexpr std::size_t max_chunk = std::size_t{1} << 16;
  std::vector<chunk> out;
  for (std::size_t s = 0; s < segs.size(); ++s)
    for (std::size_t b = 0; b < segs[s].n; b += max_chunk) out.push_back({s, b, std::min(max_chunk, segs[s].n - b)});
  return out;
}

/// A runtime zero the compiler cannot see through: x + zero * y keeps the optimizer state bit-exact
/// (the gradients are finite) while every load, FMA and store really happens.
volatile float runtime_zero = 0.0f;

/// The same-traffic kernel on one chunk, pass `Pass` (0: the gradient pre-pass; 1: the Adam pass or
/// LAMB pass 1; 2: LAMB pass 2), in the library's lane type L: its loads, stores and 16-bit
/// conversions, nothing else of the step. Returns the largest lane of what the reductions read.
template <class L, class Precision, class Rule, int Pass>
float traffic_tile(const segment<Precision>& s, std::size_t b, std::size_t n, float k) {
  using mpopt::detail::fma;
  using mpopt::detail::max;
  using V = typename L::vec;
  constexpr bool has_master = Precision::has_master;
  constexpr bool is_lamb = std::is_same_v<Rule, mpopt::lamb>;
  const V kv(k);
  V acc(0.0f);
  mpopt::detail::for_each_vector<L>(n, [&](std::size_t i, auto t) {
    const std::size_t j = b + i;
    if constexpr (Pass == 0) {  // read g (the step: overflow check and sum of squares)
      acc = fma(L::load(s.grad + j, t), kv, acc);
    } else if constexpr (Pass == 1) {  // read g, master, m, v; write m, v (Adam: master and param too)
      const V g = L::load(s.grad + j, t);
      const V w = L::load(s.master + j, t);
      L::store(s.m + j, fma(kv, g, L::load(s.m + j, t)), t);
      L::store(s.v + j, fma(kv, g, L::load(s.v + j, t)), t);
      if constexpr (is_lamb) {
        acc = fma(w, kv, acc);
      } else {
        const V wn = fma(kv, g, w);
        L::store(s.master + j, wn, t);
        if constexpr (has_master) L::store(s.param + j, wn, t);
      }
    } else {  // LAMB pass 2: read master, m, v; write master (and param)
      const V wn = fma(kv, L::load(s.m + j, t) + L::load(s.v + j, t), L::load(s.master + j, t));
      L::store(s.master + j, wn, t);
      if constexpr (has_master) L::store(s.param + j, wn, t);
    }
  });
  return L::max_lane(max(acc, V(0.0f)));
}

template <class Precision, class Rule, int Pass>
using tile_fn = float (*)(const segment<Precision>&, std::size_t, std::size_t, float);

#if MPOPT_X86_SIMD
template <class Precision, class Rule, int Pass>
MPOPT_TARGET_ENTRY(MPOPT_ISA_AVX512) float traffic_tile_avx512(const segment<Precision>& s, std::size_t b, std::size_t n, float k) {
  return traffic_tile<mpopt::detail::avx512_lanes, Precision, Rule, Pass>(s, b, n, k);
}
template <class Precision, class Rule, int Pass>
MPOPT_TARGET_ENTRY(MPOPT_ISA_AVX2) float traffic_tile_avx2(const segment<Precision>& s, std::size_t b, std::size_t n, float k) {
  return traffic_tile<mpopt::detail::avx2_lanes, Precision, Rule, Pass>(s, b, n, k);
}
#endif

/// The tile at the host backend's SIMD level, so the reference vectorizes as the step does.
template <class Precision, class Rule, int Pass>
tile_fn<Precision, Rule, Pass> traffic_tile_at_level() {
#if MPOPT_X86_SIMD
  if (mpopt::host::simd() == mpopt::simd_level::avx512) return traffic_tile_avx512<Precision, Rule, Pass>;
  if (mpopt::host::simd() == mpopt::simd_level::avx2) return traffic_tile_avx2<Precision, Rule, Pass>;
#endif
  return traffic_tile<mpopt::detail::scalar_lanes, Precision, Rule, Pass>;
}

/// One pass of the same-traffic kernel over every chunk, threads taking contiguous runs of chunks.
template <class Precision, class Rule, int Pass>
float traffic_pass(const std::vector<segment<Precision>>& segs, const std::vector<chunk>& chunks, float k) {
  const auto tile = traffic_tile_at_level<Precision, Rule, Pass>();
  const std::ptrdiff_t nc = std::ptrdiff_t(chunks.size());
  float largest = 0.0f;
  BENCH_OMP(omp parallel for schedule(static) reduction(max : largest))
  for (std::ptrdiff_t c = 0; c < nc; ++c) {
    const auto& ch = chunks[std::size_t(c)];
    largest = std::max(largest, tile(segs[ch.seg], ch.begin, ch.n, k));
  }
  return largest;
}

/// The same-traffic kernel: the step's own buffers, read and written as the step does, pass for
/// pass, in place, with trivial arithmetic. Returns a value that depends on everything the
/// reductions read (so they are not dead code).
template <class Precision, class Rule>
float same_traffic(const std::vector<segment<Precision>>& segs, const std::vector<chunk>& chunks) {
  const float k = runtime_zero;
  float r = traffic_pass<Precision, Rule, 0>(segs, chunks, k);
  r += traffic_pass<Precision, Rule, 1>(segs, chunks, k);
  if constexpr (std::is_same_v<Rule, mpopt::lamb>) r += traffic_pass<Precision, Rule, 2>(segs, chunks, k);
  return r;
}

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
void run_case(const config& cfg, std::string_view precision, std::string_view rule, bool fused,
              aligned_bytes& copy_src, aligned_bytes& copy_dst) {
  using P = typename Precision::param_type;
  using G = typename Precision::grad_type;
  using opt_t = mpopt::optimizer<Precision, Scaler, mpopt::replicated, Rule>;
  const std::string_view layout = fused ? "fused" : "unfused";
  const std::string name = case_name(precision, rule, fused);
  if (!cfg.wants(name)) return;
  std::fprintf(stderr, "optimizer_step: %s ...\n", name.c_str());

  const std::size_t n = cfg.params;
  const case_settings<Scaler, Rule> settings;
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

  // The step's own buffers, for the same-traffic kernel. master()/moment() are const views of the
  // optimizer's (non-const) state: writing through them is what the step itself does.
  std::vector<segment<Precision>> segs;
  for (std::size_t t = 0; t < params.size(); ++t) {
    auto w = opt.master(t), m = opt.moment(0, t), v = opt.moment(1, t);
    segs.push_back({params[t].data(), grads[t].data(), const_cast<float*>(w.data()), const_cast<float*>(m.data()),
                    const_cast<float*>(v.data()), params[t].size()});
  }
  const auto chunks = make_chunks(segs);
  float keep = same_traffic<Precision, Rule>(segs, chunks);
  double norms = naive_step<Precision, Rule>(segs, opt.loss_scale(), 2);

  constexpr std::size_t bpp = bytes_per_param<Precision, Rule>();
  const double total = double(bpp) * double(n);
  const std::size_t half_bytes = std::size_t(total / 2);
  threaded_memcpy(copy_dst.p.get(), copy_src.p.get(), half_bytes);

  std::vector<double> t_copy, t_same, t_step, t_naive;
  for (int r = 0; r < cfg.repeat; ++r) {
    auto t0 = clock_type::now();
    threaded_memcpy(copy_dst.p.get(), copy_src.p.get(), half_bytes);
    t_copy.push_back(seconds_since(t0));
    t0 = clock_type::now();
    keep += same_traffic<Precision, Rule>(segs, chunks);
    t_same.push_back(seconds_since(t0));
    t0 = clock_type::now();
    checked_step();
    t_step.push_back(seconds_since(t0));
    t0 = clock_type::now();
    norms += naive_step<Precision, Rule>(segs, opt.loss_scale(), 3 + r);
    t_naive.push_back(seconds_since(t0));
  }
  if (keep == 1234.5f || norms == 0.5) std::fprintf(stderr, " ");  // keeps the references' reductions alive

  const stats step = gbps(t_step, total), copy = gbps(t_copy, total), same = gbps(t_same, total),
              naive = gbps(t_naive, total);
  const double copy_gbps = std::max(copy.median, same.median);
  // The unfused case against the fused one of the same run: step time ratio.
  static std::string fused_case;
  static double fused_seconds = 0;
  const double seconds = summarize(t_step).median;
  std::string vs_fused;
  if (fused) fused_case = std::string(precision) + "/" + std::string(rule), fused_seconds = seconds;
  else if (fused_case == std::string(precision) + "/" + std::string(rule))
    vs_fused = ",\"time_vs_fused\":" + std::to_string(seconds / fused_seconds);
  std::printf(
      "{\"bench\":\"optimizer_step\",\"precision\":\"%.*s\",\"rule\":\"%.*s\",\"layout\":\"%.*s\",\"params\":%zu,"
      "\"tensors\":%zu,\"threads\":%d,\"simd\":\"%s\",\"bytes_per_param\":%zu,\"gbps\":%.2f,\"copy_gbps\":%.2f,"
      "\"ratio\":%.3f,\"baseline_ratio\":%.2f,\"gbps_min\":%.2f,\"gbps_max\":%.2f,\"memcpy_gbps\":%.2f,"
      "\"same_traffic_gbps\":%.2f,\"baseline_gbps\":%.2f%s}\n",
      int(precision.size()), precision.data(), int(rule.size()), rule.data(), int(layout.size()), layout.data(), n,
      params.size(), max_threads(), std::string(mpopt::to_string(mpopt::host::simd())).c_str(), bpp, step.median,
      copy_gbps, step.median / copy_gbps, step.median / naive.median, step.min, step.max, copy.median, same.median,
      naive.median, vs_fused.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const config cfg = parse(argc, argv);

  // memcpy buffers for the largest case (LAMB fp32: 44 B/param), first-touched once.
  aligned_bytes src(cfg.params * largest_bytes_per_param / 2 + 64), dst(cfg.params * largest_bytes_per_param / 2 + 64);

  return run_every_case("optimizer_step", [&]<class P, class S, class R>(std::string_view precision,
                                                                         std::string_view rule, bool fused) {
    run_case<P, S, R>(cfg, precision, rule, fused, src, dst);
  });
}
