// mpopt — the host backend: OpenMP threads over the multi-tensor work list, SIMD lanes within a
// chunk. It only decides how to run the element math of detail/*_math.hpp; it owns no formula.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "detail/adam_math.hpp"
#include "detail/config.hpp"
#include "detail/lamb_math.hpp"
#include "detail/lanes.hpp"
#include "detail/square_sum.hpp"
#include "detail/step_data.hpp"
#include "tensor.hpp"

namespace mpopt {

struct host {
  static constexpr std::string_view name = "host";
  static constexpr memory_space space = memory_space::host;
  using lanes = detail::host_lanes;

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

  /// master = param, moments = 0, written by the threads that will update them (first touch).
  template <class P>
  static void initialize_state(const detail::step_data<P>& d) {
    for_each_chunk(*d.work, [&](std::size_t ci) {
      const auto s = slice(d, ci);
      for (std::size_t i = 0; i < s.n; ++i) {
        if constexpr (P::has_master) s.master[i] = static_cast<float>(s.param[i]);
        s.m[i] = 0.0f;
        s.v[i] = 0.0f;
      }
    });
  }

  /// A micro-step: accum = grad * scale (first) or (accum + grad) * scale.
  template <class P>
  static void accumulate(const detail::step_data<P>& d, bool first, float scale = 1.0f) {
    for_each_chunk(*d.work, [&](std::size_t ci) {
      const auto s = slice(d, ci);
      const typename lanes::vec k(scale);
      detail::for_each_vector<lanes>(s.n, [&](std::size_t i, auto tail) {
        auto g = lanes::load(s.grad + i, tail);
        if (!first) g = g + lanes::load(s.accum + i, tail);
        lanes::store(s.accum + i, g * k, tail);
      });
    });
  }

  /// Per chunk: sum of squares of the true gradient and whether any element is inf or NaN.
  template <class P>
  static void gradient_norm(const detail::step_data<P>& d) {
    for_each_chunk(*d.work, [&](std::size_t ci) {
      const auto s = slice(d, ci);
      detail::square_sum<lanes> sum;
      bool bad = false;
      detail::for_each_vector<lanes>(s.n, [&](std::size_t i, auto tail) {
        const auto x = true_gradient(s, i, tail, typename lanes::vec(d.grad_scale));
        bad |= detail::any_nonfinite(x, tail);
        sum.add(i, x, tail);
      });
      d.chunk_sum[ci] = sum.total();
      d.chunk_nonfinite[ci] = bad;
    });
  }

  /// One Adam pass; k[g] are the coefficients of group g.
  template <class P>
  static void adam_update(const detail::step_data<P>& d, const detail::adam_coefficients* k) {
    for_each_chunk(*d.work, [&](std::size_t ci) {
      const auto s = slice(d, ci);
      const auto& c = k[s.group];
      const typename lanes::vec scale(d.grad_scale);
      detail::for_each_vector<lanes>(s.n, [&](std::size_t i, auto tail) {
        auto m = lanes::load(s.m + i, tail);
        auto v = lanes::load(s.v + i, tail);
        const auto p = detail::adam_update(true_gradient(s, i, tail, scale), m, v, lanes::load(s.master + i, tail), c);
        lanes::store(s.m + i, m, tail);
        lanes::store(s.v + i, v, tail);
        store_param(s, i, p, tail);
      });
    });
  }

  /// LAMB pass 1: moments, and per chunk the sums of squares of the weights and of the direction.
  template <class P>
  static void lamb_moments(const detail::step_data<P>& d, const detail::lamb_coefficients* k) {
    for_each_chunk(*d.work, [&](std::size_t ci) {
      const auto s = slice(d, ci);
      const auto& c = k[s.group];
      const typename lanes::vec scale(d.grad_scale);
      detail::square_sum<lanes> weights, updates;
      detail::for_each_vector<lanes>(s.n, [&](std::size_t i, auto tail) {
        auto m = lanes::load(s.m + i, tail);
        auto v = lanes::load(s.v + i, tail);
        const auto p = lanes::load(s.master + i, tail);
        const auto u = detail::lamb_moments(true_gradient(s, i, tail, scale), m, v, p, c);
        lanes::store(s.m + i, m, tail);
        lanes::store(s.v + i, v, tail);
        weights.add(i, p, tail);
        updates.add(i, u, tail);
      });
      d.chunk_sum[ci] = weights.total();
      d.chunk_sum2[ci] = updates.total();
    });
  }

  /// LAMB pass 2: recompute the direction from the stored moments and apply alpha[tensor] * u.
  template <class P>
  static void lamb_apply(const detail::step_data<P>& d, const detail::lamb_coefficients* k, const float* alpha) {
    for_each_chunk(*d.work, [&](std::size_t ci) {
      const auto s = slice(d, ci);
      const auto& c = k[s.group];
      const float a = alpha[(*d.work)[ci].tensor];
      detail::for_each_vector<lanes>(s.n, [&](std::size_t i, auto tail) {
        const auto p = lanes::load(s.master + i, tail);
        const auto u = detail::lamb_direction(lanes::load(s.m + i, tail), lanes::load(s.v + i, tail), p, c);
        store_param(s, i, detail::lamb_apply(u, p, a), tail);
      });
    });
  }

  /// grad = 0 for every tensor.
  template <class P>
  static void zero_grad(const detail::step_data<P>& d) {
    for_each_chunk(*d.work, [&](std::size_t ci) {
      const auto s = slice(d, ci);
      for (std::size_t i = 0; i < s.n; ++i) s.grad[i] = typename P::grad_type(0.0f);
    });
  }

  /// Packs gradient pieces into a contiguous bucket for a collective: out[c.state + i] =
  /// T((accum + grad) * scale), accum (indexed like out) being null when nothing was accumulated.
  template <class P, class T>
  static void pack_gradients(const detail::step_data<P>& d, const detail::work_list& pieces, T* out,
                             const typename P::accumulate_type* accum, float scale) {
    for_each_chunk(pieces, [&](std::size_t ci) {
      const detail::chunk& c = pieces[ci];
      const auto* grad = d.tensors[c.tensor].grad + c.begin;
      const auto* acc = accum ? accum + c.state : nullptr;
      const typename lanes::vec s(scale);
      detail::for_each_vector<lanes>(c.size, [&](std::size_t i, auto tail) {
        auto g = lanes::load(grad + i, tail);
        if (acc) g = lanes::load(acc + i, tail) + g;
        lanes::store(out + c.state + i, g * s, tail);
      });
    });
  }

  /// dst = src (add: dst + src), computed in fp32 and rounded to dst's type: a received piece folded
  /// into the shard's gradient, or gradients converted to and from the communication type.
  template <class D, class S>
  static void fold(D* dst, const S* src, std::size_t n, bool add) {
    detail::for_each_vector<lanes>(n, [&](std::size_t i, auto tail) {
      auto g = lanes::load(src + i, tail);
      if (add) g = lanes::load(dst + i, tail) + g;
      lanes::store(dst + i, g, tail);
    });
  }

  /// grad = in[c.state - in_offset + i]: my reduced pieces of a bucket (in holds the bucket from
  /// offset in_offset on) back into the gradient tensors.
  template <class P, class T>
  static void unpack_gradients(const detail::step_data<P>& d, const detail::work_list& pieces, const T* in,
                               std::size_t in_offset) {
    for_each_chunk(pieces, [&](std::size_t ci) {
      const detail::chunk& c = pieces[ci];
      fold(d.tensors[c.tensor].grad + c.begin, in + (c.state - in_offset), c.size, false);
    });
  }

  /// out[c.state + i] = param: this rank's updated pieces, to be gathered.
  template <class P>
  static void pack_params(const detail::step_data<P>& d, const detail::work_list& pieces, typename P::param_type* out) {
    for_each_chunk(pieces, [&](std::size_t ci) {
      const detail::chunk& c = pieces[ci];
      std::copy_n(d.tensors[c.tensor].param + c.begin, c.size, out + c.state);
    });
  }

  /// param = in[c.state + i]: every rank's pieces back into the parameter tensors.
  template <class P>
  static void unpack_params(const detail::step_data<P>& d, const detail::work_list& pieces,
                            const typename P::param_type* in) {
    for_each_chunk(pieces, [&](std::size_t ci) {
      const detail::chunk& c = pieces[ci];
      std::copy_n(in + c.state, c.size, d.tensors[c.tensor].param + c.begin);
    });
  }

 private:
  /// One chunk's pointers, already offset to its first element.
  template <class P>
  struct chunk_slice {
    typename P::param_type* param;
    typename P::grad_type* grad;
    float* master;  // == param for fp32
    float* m;
    float* v;
    typename P::accumulate_type* accum;
    bool reduced;  // the gradient is accum alone (already summed over ranks)
    std::size_t n;
    std::uint32_t group;
  };

  template <class P>
  static chunk_slice<P> slice(const detail::step_data<P>& d, std::size_t ci) {
    const detail::chunk& c = (*d.work)[ci];
    const auto& t = d.tensors[c.tensor];
    const std::size_t o = c.state;
    auto at = [o](auto* p) { return p ? p + o : nullptr; };  // a pass may leave buffers out
    float* master;
    if constexpr (P::has_master)
      master = at(d.master);
    else
      master = t.param + c.begin;
    return {t.param + c.begin, t.grad + c.begin, master, at(d.m), at(d.v), at(d.accum), d.grads_reduced, c.size, t.group};
  }

  template <class S, class Tail>
  static typename lanes::vec true_gradient(const S& s, std::size_t i, Tail tail, typename lanes::vec scale) {
    if (s.reduced) return lanes::load(s.accum + i, tail) * scale;
    auto g = lanes::load(s.grad + i, tail);
    if (s.accum) g = lanes::load(s.accum + i, tail) + g;
    return g * scale;
  }

  template <class S, class Tail>
  static void store_param(const S& s, std::size_t i, typename lanes::vec p, Tail tail) {
    lanes::store(s.master + i, p, tail);
    if constexpr (!std::is_same_v<decltype(s.param), float*>) lanes::store(s.param + i, p, tail);
  }
};

}  // namespace mpopt
