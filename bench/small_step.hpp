// The host backend's threads on small steps (bench/README.md, "Threads"), run by
// `optimizer_step --small-step N`: fp32 AdamW over one flat group, as llm.c's CPU trainer steps its
// model.
//   sweep:     for sizes from 4,096 up to 6 N (powers of two and halfway between), a step on one thread against a step on every thread
//              (host::use_threads(threads, 1): split whatever the size): where threads start to pay;
//   busy core: N parameters under three settings, each step timed alone after about a millisecond
//              of the engine's own work on every OpenMP thread, with the machine idle and with a
//              thread spinning on the last core: the median and the worst of the rounds.
//              "before": a thread per 65,536 elements begun (the rule before host::use_threads);
//              "after": the default (detail/backend/host_threads.hpp); "one_thread": host::use_threads(1).
// One JSON line per size and per setting, with OMP_WAIT_POLICY (the default depends on it).
#pragma once

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <cstdio>
#include <thread>
#include <vector>

#include "common.hpp"

namespace bench {

/// One fp32 AdamW optimizer over a flat group of n parameters, gradients filled, one step taken.
class small_model {
 public:
  explicit small_model(std::size_t n) {
    auto& g = opt_.add_flat_group({.lr = 1e-3, .weight_decay = 0.01}, {{"flat", n}});
    fill_normal(g.param(0).data(), n, 0.02f, 1);
    fill_normal(g.grad(0).data(), n, 1e-3f, 2);
    opt_.step();
  }
  /// Seconds of one step.
  double step() {
    const auto t0 = clock_type::now();
    opt_.step();
    return seconds_since(t0);
  }

 private:
  mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::adam> opt_;
};

/// A thread that spins on the last core until destroyed: another process's busy thread.
class busy_core {
 public:
  busy_core()
      : spinner_([this] {
          volatile double x = 1;
          while (!stop_.load(std::memory_order_relaxed)) x = x * 1.0000001 + 1e-9;
        }) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(std::thread::hardware_concurrency() - 1, &set);
    pthread_setaffinity_np(spinner_.native_handle(), sizeof(set), &set);
  }
  ~busy_core() {
    stop_ = true;
    spinner_.join();
  }
  busy_core(const busy_core&) = delete;
  busy_core& operator=(const busy_core&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread spinner_;
};

/// The engine's own work between steps (its forward and backward): every OpenMP thread computes for
/// about a millisecond, as llm.c's trainer keeps its threads busy.
inline double engine_work() {
  double total = 0;
  BENCH_OMP(omp parallel reduction(+ : total)) {
    double x = 1;
    for (int i = 0; i < 300000; ++i) x = x * 1.0000001 + 1e-9;
    total += x;
  }
  return total;
}

inline void run_small_steps(std::size_t n, int rounds) {
  const int threads = max_threads();
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const std::string wait_policy = policy ? policy : "default";
  std::vector<std::size_t> sizes;  // powers of two from 4,096, and halfway between
  for (std::size_t size = 4096; size <= 4 * n; size *= 2) sizes.insert(sizes.end(), {size, size + size / 2});
  for (const std::size_t size : sizes) {
    small_model m(size);
    std::vector<double> one, all;
    for (int r = 0; r < rounds; ++r) {
      mpopt::host::use_threads(1);
      one.push_back(m.step());
      mpopt::host::use_threads(threads, 1);
      all.push_back(m.step());
    }
    const double t1 = summarize(one).median, tn = summarize(all).median;
    std::printf("{\"bench\":\"small_step_sweep\",\"omp_wait_policy\":\"%s\",\"params\":%zu,\"threads\":%d,"
                "\"one_thread_us\":%.1f,\"threads_us\":%.1f,\"speedup\":%.3f}\n",
                wait_policy.c_str(), size, threads, t1 * 1e6, tn * 1e6, t1 / tn);
    std::fflush(stdout);
  }

  struct setting {
    const char* name;
    int threads;
    std::size_t elements_per_thread;
  };
  const setting settings[] = {{"before", 0, std::size_t{1} << 16},
                              {"after", 0, 0}, {"one_thread", 1, 0}};
  small_model m(n);
  std::vector<double> seconds[2][3];
  int used[3] = {};  // the threads a step of n takes under each setting
  double work = 0;
  for (int busy = 0; busy < 2; ++busy) {
    std::unique_ptr<busy_core> spinning = busy ? std::make_unique<busy_core>() : nullptr;
    for (int r = 0; r < rounds; ++r)
      for (int s = 0; s < 3; ++s) {
        mpopt::host::use_threads(settings[s].threads, settings[s].elements_per_thread);
        used[s] = mpopt::detail::host_threads(n);
        work += engine_work();
        seconds[busy][s].push_back(m.step());
      }
  }
  mpopt::host::use_threads(0);
  if (work == 0.5) std::fprintf(stderr, " ");  // keeps the engine's work alive
  for (int s = 0; s < 3; ++s) {
    const stats idle = summarize(seconds[0][s]), busy = summarize(seconds[1][s]);
    std::printf("{\"bench\":\"small_step_busy_core\",\"omp_wait_policy\":\"%s\",\"setting\":\"%s\","
                "\"params\":%zu,\"threads\":%d,"
                "\"steps\":%d,\"idle_median_ms\":%.3f,\"idle_worst_ms\":%.3f,\"busy_median_ms\":%.3f,"
                "\"busy_worst_ms\":%.3f}\n",
                wait_policy.c_str(), settings[s].name, n, used[s], rounds, idle.median * 1e3, idle.max * 1e3, busy.median * 1e3,
                busy.max * 1e3);
  }
  std::fflush(stdout);
}

}  // namespace bench
