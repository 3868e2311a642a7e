// The stored-state cases of optimizer_step (bench/README.md, "Stored state"): bf16 AdamW without
// clipping on one flat group, its master and moments stored as with_state names them
// (state_precision.hpp). Each case's step is timed in the same rounds as its own minimal-traffic
// kernel and as a step of today's storage (fp32 master and moments), so both ratios are paired.
#pragma once

#include "common.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace bench {

/// One moment element in State, with its share of its block's scale.
template <class State>
constexpr double state_bytes() {
  if constexpr (std::is_same_v<State, mpopt::fp32_state>) return 4;
  else if constexpr (mpopt::detail::quantized_in_blocks<State>) return State::bits / 8.0 + 4.0 / State::block;
  else return 2;  // bf16
}

/// A buffer a bf16 Adam step must move: `bytes` per parameter, read, written, or both, once each.
struct stream_bytes {
  double bytes;
  bool read, written;
};

/// bf16 Adam's unavoidable traffic with its master stored as Master and each moment as State: the
/// gradient read; the parameter written (read too where it is half the master); the master, or its
/// remainder, read and written; each moment read and written.
template <class State, class Master>
constexpr std::array<stream_bytes, 5> stored_streams() {
  constexpr bool remainder = std::is_same_v<Master, mpopt::remainder16>;
  constexpr double moment = state_bytes<State>();
  return {{{2, true, false}, {2, remainder, true}, {remainder ? 2.0 : 4.0, true, true}, {moment, true, true},
           {moment, true, true}}};
}

/// The bytes those streams move per parameter.
template <class State, class Master>
constexpr double stored_traffic() {
  double total = 0;
  for (const auto& s : stored_streams<State, Master>()) total += s.bytes * (s.read + s.written);
  return total;
}
static_assert(stored_traffic<mpopt::fp32_state, mpopt::fp32_master>() == 28);
static_assert(stored_traffic<mpopt::blockwise8_state, mpopt::remainder16>() == 14 + 4 * 4.0 / 256);

/// A buffer the minimal-traffic kernel streams.
struct byte_stream {
  stream_bytes what;
  std::unique_ptr<std::uint64_t[]> words{};
};

/// The minimal-traffic kernel of a stored case: one pass over buffers of the sizes the step's own
/// have (those are the optimizer's, not exposed), reading and writing each once in 8-byte words,
/// threads taking contiguous chunks of 2^16 parameters as the step's do. The written words are the
/// read ones plus a run-time zero, so nothing is folded away.
class stored_traffic_kernel {
 public:
  template <class State, class Master>
  static stored_traffic_kernel of(std::size_t params) {
    std::vector<byte_stream> s;
    for (const auto& what : stored_streams<State, Master>()) s.push_back({what});
    return stored_traffic_kernel(params, std::move(s));
  }

  /// One pass; returns what it read, folded, so that the reads stay.
  std::uint64_t run() { return pass(false); }

 private:
  static constexpr std::size_t chunk = std::size_t{1} << 16;
  static inline volatile std::uint64_t runtime_zero_word = 0;
  std::size_t params_;
  std::vector<byte_stream> streams_;

  stored_traffic_kernel(std::size_t params, std::vector<byte_stream> streams) : params_(params), streams_(std::move(streams)) {
    for (auto& s : streams_) s.words = std::make_unique_for_overwrite<std::uint64_t[]>(word_index(s, params_) + 1);
    pass(true);  // first touch (zeros), by the threads that will stream each chunk
  }
  std::uint64_t pass(bool first_touch) {
    const std::uint64_t zero = runtime_zero_word;
    const std::ptrdiff_t chunks = std::ptrdiff_t((params_ + chunk - 1) / chunk);
    std::uint64_t folded = 0;
    BENCH_OMP(omp parallel for schedule(static) reduction(^ : folded))
    for (std::ptrdiff_t c = 0; c < chunks; ++c) {
      for (auto& s : streams_) {
        const auto [begin, end] = words_of(s, std::size_t(c));
        std::uint64_t* w = s.words.get();
        if (first_touch || !s.what.read) {
          for (std::size_t i = begin; i < end; ++i) w[i] = zero;
        } else if (s.what.written) {
          for (std::size_t i = begin; i < end; ++i) w[i] += zero;
        } else {
          for (std::size_t i = begin; i < end; ++i) folded ^= w[i];
        }
      }
    }
    return folded;
  }
  static std::size_t word_index(const byte_stream& s, std::size_t param) { return std::size_t(double(param) * s.what.bytes) / 8; }
  std::pair<std::size_t, std::size_t> words_of(const byte_stream& s, std::size_t c) const {
    const std::size_t b = c * chunk, e = std::min(params_, b + chunk);
    return {word_index(s, b), word_index(s, e)};
  }
};

/// An optimizer of one flat group of `params` bf16 parameters, stored as Precision names, with
/// gradients filled once; step() stops the benchmark if a step is not applied.
template <class Precision>
struct stored_case_run {
  using opt_t = mpopt::optimizer<Precision, mpopt::no_scaling, mpopt::replicated, mpopt::adam>;
  case_settings<mpopt::no_scaling, mpopt::adam> settings{false};
  opt_t opt{settings.optimizer, settings.scaler};

  explicit stored_case_run(std::size_t params) {
    auto& g = opt.add_flat_group(settings.rule, {{"flat", params}});
    fill_normal(g.param(0).data(), params, param_sigma, 1);
    fill_normal(g.grad(0).data(), params, grad_sigma, 2);
    step();
  }
  void step() {
    if (const auto st = opt.step(); !st.applied) {
      std::fprintf(stderr, "optimizer_step: stored state: step not applied (%s)\n", std::string(st.reason()).c_str());
      std::exit(1);
    }
  }
};

template <class State, class Master>
using stored_precision = mpopt::with_state<mpopt::bf16, State, Master>;

using today_run = std::unique_ptr<stored_case_run<mpopt::bf16>>;

/// One stored case against today's storage (`today`, made for the first case run, stepped in the same
/// rounds).
template <class State, class Master>
void run_stored_case(const config& cfg, today_run& today) {
  const std::string name = std::string("bf16/adam/fused/noclip/").append(State::name).append("+").append(Master::name);
  if (!cfg.wants(name)) return;
  std::fprintf(stderr, "optimizer_step: %s ...\n", name.c_str());
  if (!today) today = std::make_unique<stored_case_run<mpopt::bf16>>(cfg.params);
  stored_case_run<stored_precision<State, Master>> run(cfg.params);
  auto limit = stored_traffic_kernel::of<State, Master>(cfg.params);
  std::uint64_t keep = 0;
  std::vector<double> t_limit, t_step, t_today;
  for (int r = 0; r < cfg.repeat; ++r) {
    timed(t_limit, [&] { keep ^= limit.run(); });
    timed(t_step, [&] { run.step(); });
    timed(t_today, [&] { today->step(); });
  }
  if (keep == 12345) std::fprintf(stderr, " ");  // keeps the kernel's reads alive
  constexpr double bytes = stored_traffic<State, Master>();
  const stats step = gbps(t_step, bytes * double(cfg.params)), lim = paired_ratio(t_limit, t_step),
              fast = paired_ratio(t_today, t_step);
  std::printf(
      "{\"bench\":\"optimizer_step\",\"precision\":\"bf16\",\"rule\":\"adam\",\"layout\":\"fused\",\"clip_grad\":0,"
      "\"state\":\"%.*s\",\"master\":\"%.*s\",\"params\":%zu,\"threads\":%d,\"simd\":\"%s\",\"bytes_per_param\":%.3f,"
      "\"gbps\":%.2f,\"limit_ratio\":%.3f,\"limit_ratio_min\":%.3f,\"limit_ratio_max\":%.3f,"
      "\"speedup_vs_fp32_state\":%.3f,\"speedup_min\":%.3f,\"speedup_max\":%.3f}\n",
      int(State::name.size()), State::name.data(), int(Master::name.size()), Master::name.data(), cfg.params,
      max_threads(), std::string(mpopt::to_string(mpopt::host::simd())).c_str(), bytes, step.median,
      lim.median, lim.min, lim.max, fast.median, fast.min, fast.max);
  std::fflush(stdout);
}

/// Every stored case: today's storage against itself (the rounds' noise), then with remainder16
/// masters: bf16 moments, and the moments quantized in blocks.
inline void run_stored_cases(const config& cfg) {
  today_run today;
  run_stored_case<mpopt::fp32_state, mpopt::fp32_master>(cfg, today);
  run_stored_case<mpopt::bf16_state<>, mpopt::remainder16>(cfg, today);
  run_stored_case<mpopt::blockwise8_state, mpopt::remainder16>(cfg, today);
  run_stored_case<mpopt::blockwise4_state, mpopt::remainder16>(cfg, today);
  run_stored_case<mpopt::fp8_state, mpopt::remainder16>(cfg, today);
}

}  // namespace bench
