// What the host and the device benchmark share: the bytes a step must move, the data they step on,
// the command line and the summary of timed rounds (protocol: bench/README.md).
#pragma once

#include <mpopt/mpopt.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <random>
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

namespace bench {

using clock_type = std::chrono::steady_clock;

inline int max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// ---------------------------------------------------------------------------------------------
// Bytes per parameter that an update cannot avoid: each state element read and written once.
//   gs = sizeof(grad) (4 fp32, 2 fp16/bf16), ps = sizeof(param) when it is not the master (2), else 0;
//   master, m and v are fp32 (fp32 has no separate master: the parameter is the master).
//
//   Adam, one pass:   read g, master, m, v; write m, v, master, param     gs + 12 + 12 + ps = 28
//   LAMB, two passes: the trust ratio needs the norms of the weights and of the whole update before
//                     any weight moves, so the update is applied in a second pass, which reads back
//                     the moments it needs rather than keeping them:
//     pass 1          read g, master, m, v; write m, v                    gs + 12 + 8
//     pass 2          read master, m, v; write master, param              12 + 4 + ps       = 40
//   (Recomputing the moments in pass 2 instead costs more: 16 + 28 = 44 in fp32.)
//
// The gradient pre-pass (overflow check and global norm, read g once) is needed only when the
// update depends on it: clipping, or skipping a non-finite step. It is counted apart.
// ---------------------------------------------------------------------------------------------
template <class Precision, class Rule>
constexpr std::size_t minimal_bytes_per_param() {
  constexpr std::size_t gs = sizeof(typename Precision::grad_type);
  constexpr std::size_t ps = Precision::has_master ? sizeof(typename Precision::param_type) : 0;
  if constexpr (std::is_same_v<Rule, mpopt::lamb>) return (gs + 12 + 8) + (12 + 4 + ps);
  else return gs + 12 + 12 + ps;
}
template <class Precision>
constexpr std::size_t prepass_bytes_per_param() {
  return sizeof(typename Precision::grad_type);
}
static_assert(minimal_bytes_per_param<mpopt::fp32, mpopt::adam>() == 28);
static_assert(minimal_bytes_per_param<mpopt::fp16, mpopt::adam>() == 28);
static_assert(minimal_bytes_per_param<mpopt::bf16, mpopt::adam>() == 28);
static_assert(minimal_bytes_per_param<mpopt::fp32, mpopt::lamb>() == 40);
static_assert(minimal_bytes_per_param<mpopt::bf16, mpopt::lamb>() == 40);
constexpr std::size_t largest_bytes_per_param = 44;  // fp32 LAMB with its pre-pass

template <class T>
inline T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return T(x);
}

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

constexpr std::size_t host_unfused_tensors = 10000;   // ~6,700 elements each at 2^26 (optimizer_step)
constexpr std::size_t device_unfused_tensors = 1000;  // device buffers (device_step)
constexpr float grad_sigma = 1e-3f;   // true gradient ~ N(0, 1e-3): global norm ~ 8 at 2^26 (clipped to 1)
constexpr float param_sigma = 0.02f;  // initial weights ~ N(0, 0.02)

/// n parameters as the unfused cases split them: `tensors` sizes differing by at most one.
inline std::vector<std::size_t> unfused_sizes(std::size_t n, std::size_t tensors) {
  const std::size_t nt = std::min(tensors, n);
  std::vector<std::size_t> sizes;
  for (std::size_t t = 0; t < nt; ++t) sizes.push_back(n / nt + (t < n % nt ? 1 : 0));
  return sizes;
}

inline double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// A runtime zero the compiler cannot see through: x + zero * y keeps the optimizer state bit-exact
/// (the gradients are finite) while every load, FMA and store really happens.
inline volatile float runtime_zero = 0.0f;

struct stats {
  double median, min, max;
};
inline stats summarize(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const std::size_t n = x.size();
  const double med = n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
  return {med, x.front(), x.back()};
}
/// Rounds' times as GB/s for `bytes` moved per round.
inline stats gbps(std::vector<double> seconds, double bytes) {
  for (auto& t : seconds) t = bytes / t / 1e9;
  return summarize(seconds);
}
/// Per-round ratios ref[r] / step[r] of two kernels timed back to back: median, min, max.
inline stats paired_ratio(const std::vector<double>& ref, const std::vector<double>& step) {
  std::vector<double> r;
  for (std::size_t i = 0; i < step.size(); ++i) r.push_back(ref[i] / step[i]);
  return summarize(r);
}
/// Runs f and adds its seconds to `into`.
template <class F>
void timed(std::vector<double>& into, F&& f) {
  const auto t0 = clock_type::now();
  f();
  into.push_back(seconds_since(t0));
}

/// What every case steps with (bench/README, "Cases"): no accumulation, fp16's static loss scale 1024,
/// lr 1e-3 and weight decay 0.01 (AdamW, LAMB); clipping at 1, or (`clipped` false: the "noclip"
/// cases) no clipping and, where no loss scale asks for it, no overflow skip, so that nothing needs
/// to be known before the update.
template <class Scaler, class Rule>
struct case_settings {
  mpopt::optimizer_options optimizer;
  typename Scaler::options scaler{};
  typename Rule::options rule;

  explicit case_settings(bool clipped) {
    optimizer.clip_grad = clipped ? 1.0 : 0.0;
    optimizer.skip_nonfinite = clipped || !std::is_same_v<Scaler, mpopt::no_scaling>;
    optimizer.accumulation_steps = 1;
    if constexpr (std::is_same_v<Scaler, mpopt::static_scale>) scaler.scale = 1024.0;
    rule.lr = 1e-3;
    rule.weight_decay = 0.01;
  }
  /// Whether the step must read every gradient before it updates anything.
  bool prepass() const { return optimizer.clip_grad > 0 || optimizer.skip_nonfinite; }
};

/// "precision/rule/layout", and "/noclip" for the cases without clipping: what --filter matches.
inline std::string case_name(std::string_view precision, std::string_view rule, bool fused, bool clipped) {
  return std::string(precision).append("/").append(rule).append(fused ? "/fused" : "/unfused").append(clipped ? "" : "/noclip");
}

/// run.template operator()<Precision, Scaler, Rule>(precision, rule, fused, clipped) for every case,
/// fused then unfused: fp32 and bf16 unscaled, fp16 with a static loss scale, and bf16 Adam with
/// stochastic rounding, all clipped; then fp32 and bf16 again without clipping.
template <class Run>
void for_each_case(Run&& run) {
  auto both = [&]<class P, class S, class R>(std::string_view precision, std::string_view rule, bool clipped) {
    run.template operator()<P, S, R>(precision, rule, true, clipped);
    run.template operator()<P, S, R>(precision, rule, false, clipped);
  };
  for (const bool clipped : {true, false}) {
    both.template operator()<mpopt::fp32, mpopt::no_scaling, mpopt::adam>("fp32", "adam", clipped);
    both.template operator()<mpopt::fp32, mpopt::no_scaling, mpopt::lamb>("fp32", "lamb", clipped);
    if (clipped) {  // a loss-scaled step always checks for overflow first
      both.template operator()<mpopt::fp16, mpopt::static_scale, mpopt::adam>("fp16", "adam", clipped);
      both.template operator()<mpopt::fp16, mpopt::static_scale, mpopt::lamb>("fp16", "lamb", clipped);
    }
    both.template operator()<mpopt::bf16, mpopt::no_scaling, mpopt::adam>("bf16", "adam", clipped);
    both.template operator()<mpopt::bf16, mpopt::no_scaling, mpopt::lamb>("bf16", "lamb", clipped);
    // What stochastic rounding costs: the same bf16 Adam step, its parameters stochastically rounded.
    if (clipped)
      both.template operator()<mpopt::bf16_stochastic, mpopt::no_scaling, mpopt::adam>("bf16_stochastic", "adam", clipped);
  }
}

/// f() as a benchmark's main ends with it: exit status 0, or 1 after printing the mpopt::error that
/// stopped it.
template <class F>
int guarded(const char* bench, F&& f) {
  try {
    f();
  } catch (const mpopt::error& e) {
    std::fprintf(stderr, "%s: mpopt::error: %s\n", bench, e.what());
    return 1;
  }
  return 0;
}

/// for_each_case(run), guarded.
template <class Run>
int run_every_case(const char* bench, Run&& run) {
  return guarded(bench, [&] { for_each_case(run); });
}

#if defined(MPOPT_DEVICE_IS_GPU) && MPOPT_DEVICE_IS_GPU
/// The GPU build on a machine without a GPU says so; the benchmark then exits 77 (skipped).
inline bool no_gpu(const char* program) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e == cudaSuccess && devices > 0) return false;
  std::printf("%s: built for the GPU; no GPU here (%s): skipped\n", program, e != cudaSuccess ? cudaGetErrorString(e) : "no device");
  return true;
}
#endif

struct config {
  std::size_t params = std::size_t{1} << 26;
  int repeat = 11;
  std::string filter;

  /// Whether "precision/rule/layout" is a case to run.
  bool wants(const std::string& name) const { return filter.empty() || name.find(filter) != std::string::npos; }
};

/// A benchmark's own option, `--flag VALUE`: `set` stores the value and throws std::exception on a
/// bad one (the usage is printed then).
struct extra_option {
  std::string_view flag, value, help;  // "--layers", "N", "layers (default 24)"
  std::function<void(const std::string&)> set;
};

/// What a benchmark's command line takes besides --params, --repeat, --filter and --quick.
struct command_line {
  config defaults{};
  std::size_t quick_params = std::size_t{1} << 18;  // what --quick sets: a smoke run, not a measurement
  int quick_repeat = 3;
  std::string_view cases = "\"precision/rule/layout[/noclip]\"";  // what --filter matches
  std::vector<extra_option> extra{};
};

[[noreturn]] inline void usage(const char* program, int code, const command_line& cl = {}) {
  std::FILE* out = code ? stderr : stdout;
  std::string line = std::string("usage: ") + program + " [--params N] [--repeat R] [--filter SUBSTR] [--quick]";
  int width = 15;  // of "--flag VALUE" in the list below
  for (const auto& o : cl.extra) {
    line.append(" [").append(o.flag).append(" ").append(o.value).append("]");
    width = std::max(width, int(o.flag.size() + 1 + o.value.size()));
  }
  auto item = [&](std::string_view flag, std::string_view value, const std::string& help) {
    const std::string fv = std::string(flag).append(value.empty() ? "" : " ").append(value);
    std::fprintf(out, "  %-*s %s\n", width, fv.c_str(), help.c_str());
  };
  std::fprintf(out, "%s\n", line.c_str());
  item("--params", "N", "parameters per case (default " + std::to_string(cl.defaults.params) + ")");
  item("--repeat", "R", "timed rounds per case (default " + std::to_string(cl.defaults.repeat) + "); the median is reported");
  item("--filter", "SUBSTR", "run only cases whose " + std::string(cl.cases) + " contains SUBSTR");
  item("--quick", "", "smoke test: " + std::to_string(cl.quick_params) + " parameters, " + std::to_string(cl.quick_repeat) + " rounds");
  for (const auto& o : cl.extra) item(o.flag, o.value, std::string(o.help));
  std::exit(code);
}

inline config parse(int argc, char** argv, const command_line& cl = {}) {
  config cfg = cl.defaults;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0], 2, cl);
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
        cfg.params = cl.quick_params;
        cfg.repeat = cl.quick_repeat;
      } else if (a == "--help" || a == "-h") {
        usage(argv[0], 0, cl);
      } else {
        const auto o = std::find_if(cl.extra.begin(), cl.extra.end(), [&](const extra_option& e) { return a == e.flag; });
        if (o == cl.extra.end()) usage(argv[0], 2, cl);
        o->set(value());
      }
    } catch (const std::exception&) {
      usage(argv[0], 2, cl);
    }
  }
  if (cfg.params == 0 || cfg.repeat < 1) usage(argv[0], 2, cl);
  return cfg;
}

}  // namespace bench
