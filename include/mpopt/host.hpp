// mpopt — the host backend: OpenMP threads over the multi-tensor work list, SIMD lanes within a
// chunk (AVX-512, AVX2 or scalar, chosen at run time: simd.hpp; how a chunk runs in them:
// host_passes.hpp). It only decides how to run the passes of detail/passes/passes.hpp; it owns no
// formula.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "detail/config.hpp"
#include "detail/backend/aligned_buffer.hpp"
#include "detail/passes/backend_passes.hpp"
#include "detail/backend/host_threads.hpp"
#include "detail/passes/passes.hpp"
#include "detail/passes/square_sum.hpp"
#include "detail/passes/step_data.hpp"
#include "detail/options/validate.hpp"
#include "detail/passes/work_list.hpp"
#include "simd.hpp"
#include "tensor.hpp"

namespace mpopt {

struct host : detail::backend_passes<host> {
  static constexpr std::string_view name = "host";
  static constexpr memory_space space = memory_space::host;

  /// The SIMD level passes run at: the best this CPU has, or MPOPT_SIMD's (simd.hpp).
  static simd_level simd() { return detail::simd_setting().load(std::memory_order_relaxed); }
  /// Runs the passes at level s from now on, in every thread. Throws mpopt::error, changing
  /// nothing, if this CPU cannot run it.
  static void use_simd(simd_level s) {
    detail::require_simd(s, "host::use_simd");
    detail::simd_setting().store(s, std::memory_order_relaxed);
  }

  /// The most threads a pass runs on: what use_threads() set, else OpenMP's omp_get_max_threads()
  /// (OMP_NUM_THREADS); 1 in a build without OpenMP.
  static int threads() { return detail::host_thread_cap(); }
  /// From now on, passes run on at most `threads` threads (0: OpenMP's count again), in every
  /// optimizer of the process, without touching the engine's own OpenMP setting; and on one thread
  /// per `elements_per_thread` elements begun (0: the measured default, detail/backend/host_threads.hpp),
  /// so that a smaller step runs on the calling thread alone. On cores shared with other busy
  /// threads (a data loader, a communication thread), fewer threads than cores keep a preempted one
  /// from stalling the step (bench/README.md, "Threads"). No setting changes a bit of the results.
  /// Throws mpopt::error, changing nothing, on a negative count.
  static void use_threads(int threads, std::size_t elements_per_thread = 0) {
    if (threads < 0) detail::fail("host::use_threads: ", threads, " threads (0 is OpenMP's count)");
    detail::host_thread_setting().threads.store(threads, std::memory_order_relaxed);
    detail::host_thread_setting().elements_per_thread.store(elements_per_thread, std::memory_order_relaxed);
  }

  /// Optimizer state (masters, moments, accumulators, buckets): aligned, zeroed by `zeroed(n)`.
  template <class T>
  using buffer = detail::aligned_buffer<T>;
  /// Small arrays both the passes and the host's step logic read and write (per-chunk sums,
  /// coefficients, trust ratios).
  template <class T>
  using shared_vector = std::vector<T>;

  /// Passes run on the calling thread: they are done when they return.
  static void synchronize() {}
  template <class T>
  static void to_host(T* dst, const T* src, std::size_t n) {
    std::copy_n(src, n, dst);
  }
  template <class T>
  static void to_device(T* dst, const T* src, std::size_t n) {
    std::copy_n(src, n, dst);
  }
  template <class T>
  static void zero(T* p, std::size_t n) {
    std::fill_n(p, n, T{});
  }
  static constexpr bool accepts(memory_space s) { return s == memory_space::host; }

  /// Calls f(chunk index) for every chunk; each thread takes one contiguous, element-balanced run
  /// (the pages of state it first touched: aligned_buffer::zeroed, the initialize pass). Small steps
  /// run on the calling thread alone (detail/backend/host_threads.hpp): no parallel region, no spinning pool.
  template <class F>
  static void for_each_chunk(const detail::work_list& work, F&& f) {
#if defined(_OPENMP)
    const int threads = detail::host_threads(work.elements());
    if (threads > 1) {
      MPOPT_PRAGMA_OMP(omp parallel num_threads(threads)) {
        const auto [first, last] = work.range(std::size_t(omp_get_thread_num()), std::size_t(omp_get_num_threads()));
        for (std::size_t c = first; c < last; ++c) f(c);
      }
      return;
    }
#endif
    for (std::size_t c = 0; c < work.size(); ++c) f(c);
  }

  // ---- How the passes run (detail/passes/backend_passes.hpp): host memory is where they read everything.

  /// Every chunk of `work`: each chunk on one thread, its vectors in order, its sums written per
  /// chunk. Host lanes load any address: alignment does not matter.
  /// Defined in host_passes.hpp, with the SIMD lanes: the separately compiled mode compiles
  /// mpopt's own passes once (detail/backend/host_instances.hpp), and its units need not read them.
  template <class Pass>
  static void run(const detail::work_list& work, const Pass& pass, bool aligned = true);
  /// One flat range, on the calling thread.
  template <class Pass>
  static void run_flat(const Pass& pass, bool aligned);
  template <class F>
  static void for_each_index(std::size_t n, const F& f) {
    for (std::size_t i = 0; i < n; ++i) f(i);
  }
  template <class T>
  static void sum_segments(const T* x, const std::size_t* offsets, std::size_t segments, double* sums) {
    for_each_index(segments, detail::segment_sum<T>{x, offsets, sums});
  }
  template <class T>
  static void sum_all(const T* x, std::size_t n, double* sum) {
    *sum = detail::sum_in_order(x, 0, n);
  }
  static const detail::chunk* chunks(const detail::work_list& w) { return w.data(); }
  template <class P>
  static const detail::step_data<P>& placed(const detail::step_data<P>& d) {
    return d;
  }
  template <class P>
  static bool aligned(const detail::step_data<P>&) {
    return true;
  }
};

}  // namespace mpopt

namespace mpopt::detail {

template <class T>
struct type_tag {};
/// host_passes.hpp is included in this unit: argument-dependent lookup finds its marker.
template <class B>
concept host_passes_included = requires { host_passes_defined(type_tag<B>{}); };
/// The rules and precisions whose host passes the separately compiled mode compiles once
/// (detail/backend/host_instances.hpp); none in header-only builds.
template <class Rule>
inline constexpr bool host_rule_compiled = false;
template <class P>
inline constexpr bool host_precision_compiled = false;
/// An optimizer of precision P and rule Rule on backend B finds in this unit every host pass it
/// runs: compiled once, or defined here.
template <class B, class P, class Rule>
concept host_passes_at_hand =
    !std::is_same_v<B, host> || (host_precision_compiled<P> && host_rule_compiled<Rule>) || host_passes_included<B>;

}  // namespace mpopt::detail

#if defined(MPOPT_SEPARATE_COMPILATION)
#include "detail/backend/host_instances.hpp"  // mpopt's own passes, compiled once
#else
#include "host_passes.hpp"
#endif
