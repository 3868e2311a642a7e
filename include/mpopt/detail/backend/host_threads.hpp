// mpopt — how many threads the host backend gives a pass of n elements: one per
// elements_per_thread elements begun, at most host::threads(), so that a step too small to pay for
// waking threads runs on the calling thread. Sums are per chunk and combined in chunk order
// (square_sum.hpp), so no thread count changes a bit.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <string_view>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace mpopt::detail {

/// Where a second thread starts to pay, measured with `optimizer_step --small-step` on 2 cores
/// (bench/README.md, "Threads"). OpenMP threads that spin while idle (libgomp's default) join a
/// pass in about a microsecond, and a second thread paid from the second chunk on (2^16 elements
/// each): one thread per 2^16 elements begun. Threads that sleep while idle
/// (OMP_WAIT_POLICY=passive) take 10-20 us to wake, and a second one paid only beyond about 2^19.
inline std::size_t default_elements_per_thread() {
  static const std::size_t n = [] {
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    const std::string_view p = policy ? policy : "";
    return p == "passive" || p == "PASSIVE" ? std::size_t{1} << 19 : std::size_t{1} << 16;
  }();
  return n;
}

struct thread_setting {
  std::atomic<int> threads{0};                    ///< 0: omp_get_max_threads()
  std::atomic<std::size_t> elements_per_thread{0};  ///< 0: default_elements_per_thread()
};

/// For the whole process, as the SIMD level: a change while another thread steps changes no bit.
inline thread_setting& host_thread_setting() {
  static thread_setting s;
  return s;
}

/// The most threads a pass runs on: what host::use_threads() set, else omp_get_max_threads() (1
/// without OpenMP).
inline int host_thread_cap() {
#if defined(_OPENMP)
  const int set = host_thread_setting().threads.load(std::memory_order_relaxed);
  return set > 0 ? set : omp_get_max_threads();
#else
  return 1;
#endif
}

/// The threads the host backend gives n elements of work (1 without OpenMP).
inline int host_threads(std::size_t n) {
#if defined(_OPENMP)
  const thread_setting& s = host_thread_setting();
  const std::size_t most = std::size_t(host_thread_cap());
  std::size_t per = s.elements_per_thread.load(std::memory_order_relaxed);
  if (per == 0) per = default_elements_per_thread();
  return int(std::clamp<std::size_t>((n + per - 1) / per, 1, most));
#else
  (void)n;
  return 1;
#endif
}

}  // namespace mpopt::detail
