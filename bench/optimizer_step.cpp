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
#include <mpopt/mpopt.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#define BENCH_OMP(x) _Pragma(#x)
#else
#define BENCH_OMP(x)
#endif

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

using clock_type = std::chrono::steady_clock;

int max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

constexpr const char* simd_name = BENCH_AVX512 ? "avx512" : "scalar";

// ---------------------------------------------------------------------------------------------
// Bytes per parameter. What the step must read plus what it must write, once each, per pass it makes
// (the library's host backend: a gradient pre-pass, then one Adam pass or two LAMB passes).
//   gs = sizeof(grad) (4 fp32, 2 fp16/bf16), ps = sizeof(param); master/m/v are fp32 (4 each).
//   fp32 has no separate master: the param (4 B) is the master, read and written once.
//
//   pre-pass (all cases): read g                                     -> gs
//   Adam update pass:     read g, master, m, v; write m, v, master   -> gs + 12 + 12
//                         + write param when it is not the master    -> + ps (fp16/bf16)
//   LAMB pass 1:          read g, master, m, v; write m, v           -> gs + 12 + 8
//   LAMB pass 2:          read master, m, v; write master            -> 12 + 4
//                         + write param when it is not the master    -> + ps (fp16/bf16)
//
//   fp32 adam: 4 + (4+4+4+4 + 4+4+4)             = 32   fp32 lamb: 4 + (4+12+8) + (12+4)     = 44
//   fp16 adam: 2 + (2+4+4+4 + 4+4+4 + 2)         = 30   fp16 lamb: 2 + (2+12+8) + (12+4+2)   = 42
//   bf16 adam: 2 + (2+4+4+4 + 4+4+4 + 2)         = 30   bf16 lamb: 2 + (2+12+8) + (12+4+2)   = 42
// ---------------------------------------------------------------------------------------------
template <class Precision, class Rule>
constexpr std::size_t bytes_per_param() {
  constexpr std::size_t gs = sizeof(typename Precision::grad_type);
  constexpr std::size_t ps = Precision::has_master ? sizeof(typename Precision::param_type) : 0;
  constexpr std::size_t pre = gs;
  if constexpr (std::is_same_v<Rule, mpopt::adam>) {
    return pre + (gs + 12 + 12 + ps);
  } else {
    return pre + (gs + 12 + 8) + (12 + 4 + ps);
  }
}
static_assert(bytes_per_param<mpopt::fp32, mpopt::adam>() == 32);
static_assert(bytes_per_param<mpopt::fp16, mpopt::adam>() == 30);
static_assert(bytes_per_param<mpopt::bf16, mpopt::adam>() == 30);
static_assert(bytes_per_param<mpopt::fp32, mpopt::lamb>() == 44);
static_assert(bytes_per_param<mpopt::fp16, mpopt::lamb>() == 42);
static_assert(bytes_per_param<mpopt::bf16, mpopt::lamb>() == 42);

// ---------------------------------------------------------------------------------------------
// Element access for the same-traffic kernel: 16 lanes at a time (AVX-512) with conversions like the
// step's (fp16 via VCVTPH2PS/VCVTPS2PH, bf16 by shifting; narrowing bf16 truncates: trivial
// arithmetic), and one element at a time for tails and non-AVX-512 builds.
// ---------------------------------------------------------------------------------------------
inline float to_float(float x) { return x; }
inline float to_float(mpopt::half x) { return static_cast<float>(x); }
inline float to_float(mpopt::bfloat16 x) { return static_cast<float>(x); }
template <class T>
inline T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return T(x);
}

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

/// Deterministic, thread-count independent fill: x[i] = T(sigma * N(0, 1)) from a generator seeded
/// per block of 2^16 elements.
template <class T>
void fill_normal(T* x, std::size_t n, float sigma, std::uint64_t seed) {
  constexpr std::size_t block = std::size_t{1} << 16;
  const std::ptrdiff_t nb = std::ptrdiff_t((n + block - 1) / block);
  BENCH_OMP(omp parallel for schedule(static))
  for (std::ptrdiff_t b = 0; b < nb; ++b) {
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + std::uint64_t(b));
    std::normal_distribution<float> dist(0.0f, sigma);
    const std::size_t e = std::min(n, std::size_t(b + 1) * block);
    for (std::size_t i = std::size_t(b) * block; i < e; ++i) x[i] = from_float<T>(dist(rng));
  }
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct stats {
  double median, min, max;
};
stats summarize(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const std::size_t n = x.size();
  const double med = n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
  return {med, x.front(), x.back()};
}

struct config {
  std::size_t params = std::size_t{1} << 26;
  int repeat = 7;
  std::string filter;
};

constexpr std::size_t unfused_tensors = 1000;
constexpr float grad_sigma = 1e-3f;   // true gradient ~ N(0, 1e-3): global norm ~ 8 at 2^26 (clipped to 1)
constexpr float param_sigma = 0.02f;  // initial weights ~ N(0, 0.02)

template <class Precision, class Scaler, class Rule>
void run_case(const config& cfg, std::string_view precision, std::string_view rule, bool fused,
              aligned_bytes& copy_src, aligned_bytes& copy_dst) {
  using P = typename Precision::param_type;
  using G = typename Precision::grad_type;
  using opt_t = mpopt::optimizer<Precision, Scaler, mpopt::replicated, Rule>;
  const std::string_view layout = fused ? "fused" : "unfused";
  const std::string name = std::string(precision) + "/" + std::string(rule) + "/" + std::string(layout);
  if (!cfg.filter.empty() && name.find(cfg.filter) == std::string::npos) return;
  std::fprintf(stderr, "optimizer_step: %s ...\n", name.c_str());

  const std::size_t n = cfg.params;
  mpopt::optimizer_options oo;
  oo.clip_grad = 1.0;
  oo.accumulation_steps = 1;
  typename Scaler::options so{};
  if constexpr (std::is_same_v<Scaler, mpopt::static_scale>) so.scale = 1024.0;
  opt_t opt(oo, so);

  typename Rule::options ro;
  ro.lr = 1e-3;
  ro.weight_decay = 0.01;

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
    const std::size_t nt = std::min(unfused_tensors, n);
    for (std::size_t t = 0; t < nt; ++t) {
      const std::size_t sz = n / nt + (t < n % nt ? 1 : 0);
      user_params.emplace_back(sz);
      user_grads.emplace_back(sz);
    }
    for (std::size_t t = 0; t < nt; ++t) {
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

  auto gbps = [&](std::vector<double> ts) {
    for (auto& t : ts) t = total / t / 1e9;
    return summarize(ts);
  };
  const stats step = gbps(t_step), copy = gbps(t_copy), same = gbps(t_same);
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

[[noreturn]] void usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: optimizer_step [--params N] [--repeat R] [--filter SUBSTR] [--quick]\n"
               "  --params N      parameters per case (default 2^26 = 67108864)\n"
               "  --repeat R      timed rounds per case (default 7); the median is reported\n"
               "  --filter SUBSTR run only cases whose \"precision/rule/layout\" contains SUBSTR\n"
               "  --quick         smoke test: 2^20 parameters, 3 rounds\n");
  std::exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  config cfg;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(2);
      return argv[++i];
    };
    try {
      if (a == "--params") {
        cfg.params = std::stoull(value());
      } else if (a == "--repeat") {
        cfg.repeat = std::stoi(value());
      } else if (a == "--filter") {
        cfg.filter = value();
      } else if (a == "--quick") {
        cfg.params = std::size_t{1} << 20;
        cfg.repeat = 3;
      } else if (a == "--help" || a == "-h") {
        usage(0);
      } else {
        usage(2);
      }
    } catch (const std::exception&) {
      usage(2);
    }
  }
  if (cfg.params == 0 || cfg.repeat < 1) usage(2);

  // memcpy buffers for the largest case (LAMB fp32: 44 B/param), first-touched once.
  aligned_bytes src(cfg.params * 22 + 64), dst(cfg.params * 22 + 64);

  try {
    run_case<mpopt::fp32, mpopt::no_scaling, mpopt::adam>(cfg, "fp32", "adam", true, src, dst);
    run_case<mpopt::fp32, mpopt::no_scaling, mpopt::adam>(cfg, "fp32", "adam", false, src, dst);
    run_case<mpopt::fp32, mpopt::no_scaling, mpopt::lamb>(cfg, "fp32", "lamb", true, src, dst);
    run_case<mpopt::fp32, mpopt::no_scaling, mpopt::lamb>(cfg, "fp32", "lamb", false, src, dst);
    run_case<mpopt::fp16, mpopt::static_scale, mpopt::adam>(cfg, "fp16", "adam", true, src, dst);
    run_case<mpopt::fp16, mpopt::static_scale, mpopt::adam>(cfg, "fp16", "adam", false, src, dst);
    run_case<mpopt::fp16, mpopt::static_scale, mpopt::lamb>(cfg, "fp16", "lamb", true, src, dst);
    run_case<mpopt::fp16, mpopt::static_scale, mpopt::lamb>(cfg, "fp16", "lamb", false, src, dst);
    run_case<mpopt::bf16, mpopt::no_scaling, mpopt::adam>(cfg, "bf16", "adam", true, src, dst);
    run_case<mpopt::bf16, mpopt::no_scaling, mpopt::adam>(cfg, "bf16", "adam", false, src, dst);
    run_case<mpopt::bf16, mpopt::no_scaling, mpopt::lamb>(cfg, "bf16", "lamb", true, src, dst);
    run_case<mpopt::bf16, mpopt::no_scaling, mpopt::lamb>(cfg, "bf16", "lamb", false, src, dst);
  } catch (const mpopt::error& e) {
    std::fprintf(stderr, "optimizer_step: mpopt::error: %s\n", e.what());
    return 1;
  }
  return 0;
}
