// mpopt — the host backend: OpenMP threads over the multi-tensor work list, SIMD lanes within a
// chunk (AVX-512, AVX2 or scalar, chosen at run time: simd.hpp). It only decides how to run the
// passes of detail/passes/passes.hpp; it owns no formula.
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
#if MPOPT_X86_SIMD
#include <immintrin.h>  // _mm256_zeroupper
#endif

#include "detail/backend/aligned_buffer.hpp"
#include "detail/lanes/avx2_lanes.hpp"
#include "detail/lanes/avx512_lanes.hpp"
#include "detail/passes/backend_passes.hpp"
#include "detail/backend/host_threads.hpp"
#include "detail/lanes/lanes.hpp"
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
  /// Defined below the class, not inline: the separately compiled mode compiles mpopt's own passes
  /// once (detail/backend/host_instances.hpp).
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

 private:
  /// One chunk of a pass at the current SIMD level.
  template <class Pass>
  static auto chunk_runner() -> void (*)(const Pass&, std::size_t) {
    switch (simd()) {
#if MPOPT_X86_SIMD
      case simd_level::avx512: return run_chunk_avx512<Pass>;
      case simd_level::avx2: return run_chunk_avx2<Pass>;
#endif
      default: return run_chunk<detail::scalar_lanes, Pass>;
    }
  }
#if MPOPT_X86_SIMD
  // The pass compiled for each instruction set: everything it calls is inlined into these. Each
  // clears the vector registers' upper halves on leaving (vzeroupper): g++ does so itself only from
  // -O2 on, and without it the caller's SSE code (the default target's floating point, libm) runs
  // two to three times slower after every pass in -O1, -Og and -Os builds.
  template <class Pass>
  MPOPT_TARGET_ENTRY(MPOPT_ISA_AVX512) static void run_chunk_avx512(const Pass& pass, std::size_t ci) {
    run_chunk<detail::avx512_lanes>(pass, ci);
    _mm256_zeroupper();
  }
  template <class Pass>
  MPOPT_TARGET_ENTRY(MPOPT_ISA_AVX2) static void run_chunk_avx2(const Pass& pass, std::size_t ci) {
    run_chunk<detail::avx2_lanes>(pass, ci);
    _mm256_zeroupper();
  }
#endif

  /// One chunk of a pass in lanes L: its vectors in order (or 16-element granules), then its sums.
  template <class L, class Pass>
  static void run_chunk(const Pass& pass, std::size_t ci) {
    const auto s = pass.at(ci);
    const std::size_t n = pass.size(ci);
    detail::host_sums<L> sums;
    if constexpr (requires { Pass::granule; }) {
      for (std::size_t g = 0; g < n; g += Pass::granule)
        pass.template apply_granule<L>(s, g, std::min(Pass::granule, n - g), sums);
    } else {
      detail::for_each_vector<L>(n, [&](std::size_t i, auto tail) { pass.template apply<L>(s, i, tail, sums); });
    }
    sums.write(pass.out, ci);
  }
};

template <class Pass>
void host::run(const detail::work_list& work, const Pass& pass, bool) {
  const auto chunk = chunk_runner<Pass>();
  for_each_chunk(work, [&](std::size_t ci) { chunk(pass, ci); });
}

template <class Pass>
void host::run_flat(const Pass& pass, bool) {
  const auto chunk = chunk_runner<Pass>();
  for (std::size_t ci = 0; ci < pass.count(); ++ci) chunk(pass, ci);
}

}  // namespace mpopt

#if defined(MPOPT_SEPARATE_COMPILATION)
#include "detail/backend/host_instances.hpp"  // mpopt's own passes, compiled once
#endif
