// mpopt benchmark: the time of one optimizer step() against the memory system's limit for the same
// traffic, measured in the same process (protocol: /work/shared/BENCH.md, fields: bench/README.md).
//
//   optimizer_step [--params N] [--repeat R] [--filter SUBSTR] [--quick]
//
// Cases: precision {fp32, fp16, bf16} x rule {adam, lamb} x layout {fused, unfused}.
//   fused:   one flat group (add_flat_group) holding one tensor of N parameters;
//   unfused: the same N split into 1000 user-owned tensors (std::vector) registered with add().
// --filter matches a substring of "precision/rule/layout" (e.g. "fp16/adam", "/fused").
//
// Per case: warm-up (every buffer first-touched, one untimed step, one untimed run of each
// reference), then R rounds of (memcpy reference, same-traffic reference, step), each timed alone.
// One JSON line per case on stdout; progress and errors go to stderr.
#include "common.hpp"

#include <algorithm>
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

#if defined(__AVX512F__)
#include <immintrin.h>
#define BENCH_AVX512 1
#else
#define BENCH_AVX512 0
#endif

// GCC 12's AVX-512 intrinsics (the conversions and reductions below) start from self-initialized
// "undefined" vectors, which -Wmaybe-uninitialized reports once inlined (GCC PR105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace {

using namespace bench;

constexpr const char* simd_name = BENCH_AVX512 ? "avx512" : "scalar";

// ---------------------------------------------------------------------------------------------
// Element access for the same-traffic kernel: 16 lanes at a time (AVX-512) with conversions like the
// step's (fp16 via VCVTPH2PS/VCVTPS2PH, bf16 by shifting; narrowing bf16 truncates: trivial
// arithmetic), and one element at a time for tails and non-AVX-512 builds.
// ---------------------------------------------------------------------------------------------
inline float to_float(float x) { return x; }
inline float to_float(mpopt::half x) { return static_cast<float>(x); }
inline float to_float(mpopt::bfloat16 x) { return static_cast<float>(x); }

#if BENCH_AVX512
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const mpopt::half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load16(const mpopt::bfloat16* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
inline void store16(mpopt::half* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline void store16(mpopt::bfloat16* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16)));
}
#endif

inline std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

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

/// The same-traffic kernel: the step's own buffers, read and written as the step does, pass for
/// pass, in place, with trivial arithmetic. Returns a value that depends on everything read by the
/// reductions (so they are not dead code).
template <class Precision, class Rule>
std::uint32_t same_traffic(const std::vector<segment<Precision>>& segs, const std::vector<chunk>& chunks,
                           std::vector<std::uint32_t>& sink) {
  using P = typename Precision::param_type;
  using G = typename Precision::grad_type;
  constexpr bool has_master = Precision::has_master;
  constexpr bool is_lamb = std::is_same_v<Rule, mpopt::lamb>;
  const float k = runtime_zero;
  const std::ptrdiff_t nc = std::ptrdiff_t(chunks.size());

  // Pre-pass: read every gradient once (the step: overflow check and sum of squares).
  BENCH_OMP(omp parallel for schedule(static))
  for (std::ptrdiff_t c = 0; c < nc; ++c) {
    const auto& ch = chunks[std::size_t(c)];
    const G* g = segs[ch.seg].grad + ch.begin;
    std::uint32_t r = 0;
    std::size_t i = 0;
#if BENCH_AVX512
    __m512i acc = _mm512_setzero_si512();
    for (; i + 16 <= ch.n; i += 16) acc = _mm512_or_si512(acc, _mm512_castps_si512(load16(g + i)));
    r = std::uint32_t(_mm512_reduce_or_epi32(acc));
#else
    BENCH_OMP(omp simd reduction(| : r))
    for (std::size_t j = 0; j < ch.n; ++j) r |= float_bits(to_float(g[j]));
    i = ch.n;
#endif
    for (; i < ch.n; ++i) r |= float_bits(to_float(g[i]));
    sink[std::size_t(c)] = r;
  }

  // Adam: one pass, read g, master, m, v; write m, v, master (+ param).
  // LAMB pass 1: read g, master, m, v; write m, v (the step also sums squares of master and u).
  BENCH_OMP(omp parallel for schedule(static))
  for (std::ptrdiff_t c = 0; c < nc; ++c) {
    const auto& ch = chunks[std::size_t(c)];
    const auto& s = segs[ch.seg];
    const G* g = s.grad + ch.begin;
    float* w = s.master + ch.begin;
    float* m = s.m + ch.begin;
    float* v = s.v + ch.begin;
    P* p = s.param + ch.begin;
    std::uint32_t r = 0;
    std::size_t i = 0;
#if BENCH_AVX512
    const __m512 kv = _mm512_set1_ps(k);
    __m512i acc = _mm512_setzero_si512();
    for (; i + 16 <= ch.n; i += 16) {
      const __m512 gi = load16(g + i);
      const __m512 wi = load16(w + i);
      store16(m + i, _mm512_fmadd_ps(kv, gi, load16(m + i)));
      store16(v + i, _mm512_fmadd_ps(kv, gi, load16(v + i)));
      if constexpr (is_lamb) {
        acc = _mm512_or_si512(acc, _mm512_castps_si512(wi));
      } else {
        const __m512 wn = _mm512_fmadd_ps(kv, gi, wi);
        store16(w + i, wn);
        if constexpr (has_master) store16(p + i, wn);
      }
    }
    r = std::uint32_t(_mm512_reduce_or_epi32(acc));
#endif
    for (; i < ch.n; ++i) {
      const float gi = to_float(g[i]);
      const float wi = w[i];
      m[i] = k * gi + m[i];
      v[i] = k * gi + v[i];
      if constexpr (is_lamb) {
        r |= float_bits(wi);
      } else {
        const float wn = k * gi + wi;
        w[i] = wn;
        if constexpr (has_master) p[i] = from_float<P>(wn);
      }
    }
    (void)p;
    sink[std::size_t(c)] |= r;
  }

  // LAMB pass 2: read master, m, v; write master (+ param).
  if constexpr (is_lamb) {
    BENCH_OMP(omp parallel for schedule(static))
    for (std::ptrdiff_t c = 0; c < nc; ++c) {
      const auto& ch = chunks[std::size_t(c)];
      const auto& s = segs[ch.seg];
      float* w = s.master + ch.begin;
      const float* m = s.m + ch.begin;
      const float* v = s.v + ch.begin;
      P* p = s.param + ch.begin;
      std::size_t i = 0;
#if BENCH_AVX512
      const __m512 kv = _mm512_set1_ps(k);
      for (; i + 16 <= ch.n; i += 16) {
        const __m512 wn = _mm512_fmadd_ps(kv, _mm512_add_ps(load16(m + i), load16(v + i)), load16(w + i));
        store16(w + i, wn);
        if constexpr (has_master) store16(p + i, wn);
      }
#endif
      for (; i < ch.n; ++i) {
        const float wn = k * (m[i] + v[i]) + w[i];
        w[i] = wn;
        if constexpr (has_master) p[i] = from_float<P>(wn);
      }
      (void)p;
    }
  }

  std::uint32_t all = 0;
  for (auto x : sink) all |= x;
  return all;
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
    for (std::size_t sz : unfused_sizes(n)) {
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
  std::vector<std::uint32_t> sink(chunks.size());
  std::uint32_t keep = same_traffic<Precision, Rule>(segs, chunks, sink);

  constexpr std::size_t bpp = bytes_per_param<Precision, Rule>();
  const double total = double(bpp) * double(n);
  const std::size_t half_bytes = std::size_t(total / 2);
  threaded_memcpy(copy_dst.p.get(), copy_src.p.get(), half_bytes);

  std::vector<double> t_copy, t_same, t_step;
  for (int r = 0; r < cfg.repeat; ++r) {
    auto t0 = clock_type::now();
    threaded_memcpy(copy_dst.p.get(), copy_src.p.get(), half_bytes);
    t_copy.push_back(seconds_since(t0));
    t0 = clock_type::now();
    keep ^= same_traffic<Precision, Rule>(segs, chunks, sink);
    t_same.push_back(seconds_since(t0));
    t0 = clock_type::now();
    checked_step();
    t_step.push_back(seconds_since(t0));
  }
  if (keep == 0x12345678u) std::fprintf(stderr, " ");  // keeps the reference reductions alive

  const stats step = gbps(t_step, total), copy = gbps(t_copy, total), same = gbps(t_same, total);
  const double copy_gbps = std::max(copy.median, same.median);
  std::printf(
      "{\"bench\":\"optimizer_step\",\"precision\":\"%.*s\",\"rule\":\"%.*s\",\"layout\":\"%.*s\",\"params\":%zu,"
      "\"threads\":%d,\"simd\":\"%s\",\"bytes_per_param\":%zu,\"gbps\":%.2f,\"copy_gbps\":%.2f,\"ratio\":%.3f,"
      "\"gbps_min\":%.2f,\"gbps_max\":%.2f,\"memcpy_gbps\":%.2f,\"same_traffic_gbps\":%.2f}\n",
      int(precision.size()), precision.data(), int(rule.size()), rule.data(), int(layout.size()), layout.data(), n,
      max_threads(), simd_name, bpp, step.median, copy_gbps, step.median / copy_gbps, step.min, step.max,
      copy.median, same.median);
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
