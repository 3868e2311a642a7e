// mpopt — the host backend: OpenMP threads over the multi-tensor work list, SIMD lanes within a
// chunk. It only decides how to run the passes of detail/passes.hpp; it owns no formula.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "detail/aligned_buffer.hpp"
#include "detail/config.hpp"
#include "detail/lanes.hpp"
#include "detail/passes.hpp"
#include "detail/square_sum.hpp"
#include "detail/step_data.hpp"
#include "detail/work_list.hpp"
#include "tensor.hpp"

namespace mpopt {

struct host {
  static constexpr std::string_view name = "host";
  static constexpr memory_space space = memory_space::host;
  using lanes = detail::host_lanes;

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

  /// Below this many elements per thread a fork/join costs more than the work it shares.
  static constexpr std::size_t min_elements_per_thread = std::size_t{1} << 16;

  /// Calls f(chunk index) for every chunk; each thread takes one contiguous, element-balanced run.
  /// Small steps run on the calling thread alone: no parallel region, no spinning pool.
  template <class F>
  static void for_each_chunk(const detail::work_list& work, F&& f) {
#if defined(_OPENMP)
    const std::size_t wanted = (work.elements() + min_elements_per_thread - 1) / min_elements_per_thread;
    const int threads = int(std::min<std::size_t>(wanted, std::size_t(omp_get_max_threads())));
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

  /// Runs a pass (detail/passes.hpp) over the chunks of `work`: each chunk on one thread, its
  /// vectors in order, its sums written per chunk.
  template <class Pass>
  static void run(const detail::work_list& work, const Pass& pass) {
    for_each_chunk(work, [&](std::size_t ci) { run_chunk(pass, ci); });
  }

  template <class P>
  static void initialize_state(const detail::step_data<P>& d) {
    run(*d.work, detail::initialize_pass<P>{{d, d.work->data()}});
  }

  template <class P>
  static void accumulate(const detail::step_data<P>& d, bool first, float scale = 1.0f) {
    run(*d.work, detail::accumulate_pass<P>{{d, d.work->data()}, first, scale});
  }

  template <class P>
  static void gradient_norm(const detail::step_data<P>& d) {
    run(*d.work, detail::gradient_norm_pass<P>{{d, d.work->data(), {.sum = d.chunk_sum, .nonfinite = d.chunk_nonfinite}}});
  }

  template <class P>
  static void adam_update(const detail::step_data<P>& d, const detail::adam_coefficients* k) {
    run(*d.work, detail::adam_pass<P>{{{d, d.work->data()}, k}});
  }

  template <class P>
  static void lamb_moments(const detail::step_data<P>& d, const detail::lamb_coefficients* k) {
    run(*d.work, detail::lamb_moments_pass<P>{{{d, d.work->data(), {.sum = d.chunk_sum, .sum2 = d.chunk_sum2}}, k}});
  }

  template <class P>
  static void lamb_apply(const detail::step_data<P>& d, const detail::lamb_coefficients* k, const float* alpha) {
    run(*d.work, detail::lamb_apply_pass<P>{{{d, d.work->data()}, k}, alpha});
  }

  template <class P>
  static void zero_grad(const detail::step_data<P>& d) {
    run(*d.work, detail::zero_grad_pass<P>{{d, d.work->data()}});
  }

  template <class P, class T>
  static void pack_gradients(const detail::step_data<P>& d, const detail::work_list& pieces, T* out,
                             const typename P::accumulate_type* accum, float scale) {
    run(pieces, detail::pack_gradients_pass<P, T>{{d.tensors, pieces.data()}, out, accum, scale});
  }

  /// dst = src (add: dst + src) over n elements, on the calling thread.
  template <class D, class S>
  static void fold(D* dst, const S* src, std::size_t n, bool add) {
    const detail::fold_pass<D, S> pass{dst, src, n, add};
    for (std::size_t ci = 0; ci < pass.count(); ++ci) run_chunk(pass, ci);
  }

  template <class P, class T>
  static void unpack_gradients(const detail::step_data<P>& d, const detail::work_list& pieces, const T* in,
                               std::size_t in_offset) {
    run(pieces, detail::unpack_gradients_pass<P, T>{{d.tensors, pieces.data()}, in, in_offset});
  }

  template <class P>
  static void pack_params(const detail::step_data<P>& d, const detail::work_list& pieces, typename P::param_type* out) {
    run(pieces, detail::copy_params_pass<P>{{d.tensors, pieces.data()}, out, true});
  }

  template <class P>
  static void unpack_params(const detail::step_data<P>& d, const detail::work_list& pieces,
                            const typename P::param_type* in) {
    run(pieces, detail::copy_params_pass<P>{{d.tensors, pieces.data()}, const_cast<typename P::param_type*>(in), false});
  }

  // ---- 1-bit LAMB (detail/passes.hpp says what each computes).

  template <class P>
  static void onebit_feed(const detail::step_data<P>& d, const detail::lamb_coefficients* k, const float* scaling,
                          const std::size_t* fused, float* worker, double* partial) {
    run(*d.work, detail::onebit_feed_pass<P>{{{{d, d.work->data(), {.sum64 = partial}}, k}, scaling, fused}, worker});
  }

  template <class P>
  static void onebit_momentum(const detail::step_data<P>& d, const detail::lamb_coefficients* k, const float* scaling,
                              const std::size_t* fused, const detail::sign_code* code, float* v_fresh,
                              float* chunk_max) {
    const detail::pass_outputs out{.sum = d.chunk_sum, .sum2 = d.chunk_sum2, .largest = chunk_max};
    run(*d.work, detail::onebit_momentum_pass<P>{{{{d, d.work->data(), out}, k}, scaling, fused, v_fresh},
                                                  code ? *code : detail::sign_code{}});
  }

  static void sum_squares(const detail::work_list& w, const float* x, double* partial) {
    run(w, detail::sum_squares_pass{{w.data(), {.sum64 = partial}}, x});
  }

  static void copy(const detail::work_list& w, float* dst, const float* src) {
    run(w, detail::copy_pass{{w.data()}, dst, src});
  }

  // ---- the compressed all-reduce (compressed_allreduce.hpp) on flat buffers: `w` covers [0, n) with
  // state = index, chunks starting at multiples of 16.

  static void add_into(const detail::work_list& w, float* e, const float* x, double* partial) {
    run(w, detail::add_into_pass{{w.data(), {.sum64 = partial}}, e, x});
  }

  static void compress_signs(const detail::work_list& w, float* x, float s, std::uint8_t* bits) {
    run(w, detail::compress_signs_pass{{w.data()}, x, s, bits});
  }

  static void combine_signs(const detail::work_list& w, const std::uint8_t* blocks, std::size_t block_bytes,
                            const float* weight, int ranks, float* c, double* partial) {
    run(w, detail::combine_signs_pass{{w.data(), {.sum64 = partial}}, blocks, block_bytes, weight, ranks, c});
  }

  static void decode_signs(const detail::work_list& w, const detail::sign_code& code, float* out) {
    run(w, detail::decode_signs_pass{{w.data()}, code, out});
  }

 private:
  /// One chunk of a pass: its vectors in order (or 16-element granules), then its sums.
  template <class Pass>
  static void run_chunk(const Pass& pass, std::size_t ci) {
    const auto s = pass.at(ci);
    const std::size_t n = pass.size(ci);
    detail::host_sums<lanes> sums;
    if constexpr (requires { Pass::granule; }) {
      for (std::size_t g = 0; g < n; g += Pass::granule)
        pass.template apply_granule<lanes>(s, g, std::min(Pass::granule, n - g), sums);
    } else {
      detail::for_each_vector<lanes>(n, [&](std::size_t i, auto tail) { pass.template apply<lanes>(s, i, tail, sums); });
    }
    sums.write(pass.out, ci);
  }
};

}  // namespace mpopt
