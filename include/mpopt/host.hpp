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
#include "detail/onebit_lamb_math.hpp"
#include "detail/sign_compression.hpp"
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

  // ---- 1-bit LAMB, compression stage. `fused[t]` is tensor t's first element in the compressed
  // vector (tensors back to back), `scaling[t]` its momentum scaling coefficient.

  /// worker[fused] += onebit_local_momentum (the error feedback: the worker buffer holds the last
  /// round's error); per chunk, the sum of squares of the new worker values, in double.
  template <class P>
  static void onebit_feed(const detail::step_data<P>& d, const detail::lamb_coefficients* k, const float* scaling,
                          const std::size_t* fused, float* worker, double* partial) {
    for_each_chunk(*d.work, [&](std::size_t ci) {
      const auto s = slice(d, ci);
      const detail::chunk& c = (*d.work)[ci];
      float* w = worker + fused[c.tensor] + c.begin;
      const typename lanes::vec scale(d.grad_scale), sc(scaling[c.tensor]);
      detail::square_sum64<lanes> sum;
      detail::for_each_vector<lanes>(s.n, [&](std::size_t i, auto tail) {
        const auto m = lanes::load(s.m + i, tail);
        const auto x = lanes::load(w + i, tail) + detail::onebit_local_momentum(true_gradient(s, i, tail, scale), m, sc, k[s.group]);
        lanes::store(w + i, x, tail);
        sum.add(i, x, tail);
      });
      partial[ci] = sum.total();
    });
  }

  /// The momentum update once the averaged momentum is known: from `code` (m = code / scaling) or,
  /// with one rank and no code, from the gradient. Writes m and v_fresh; per chunk, the sums of
  /// squares of u (chunk_sum) and u0 (chunk_sum2) and the largest ratio (chunk_max).
  template <class P>
  static void onebit_momentum(const detail::step_data<P>& d, const detail::lamb_coefficients* k, const float* scaling,
                              const std::size_t* fused, const detail::sign_code* code, float* v_fresh,
                              float* chunk_max) {
    for_each_chunk(*d.work, [&](std::size_t ci) {
      const auto s = slice(d, ci);
      const detail::chunk& c = (*d.work)[ci];
      const auto& coef = k[s.group];
      float* vf = v_fresh + c.state;
      const std::size_t f = fused[c.tensor] + c.begin;
      const typename lanes::vec scale(d.grad_scale), sc(scaling[c.tensor]);
      detail::square_sum<lanes> updates, prelims;
      typename lanes::vec largest(0.0f);
      detail::for_each_vector<lanes>(s.n, [&](std::size_t i, auto tail) {
        const auto m = lanes::load(s.m + i, tail);
        const auto m_new = code ? code->template load<lanes>(f + i, tail) / sc
                                : detail::lamb_first_moment(true_gradient(s, i, tail, scale), m, coef);
        auto fresh = lanes::load(vf + i, tail);
        typename lanes::vec u0, ratio;
        const auto u = detail::onebit_lamb_direction(m_new, m, fresh, lanes::load(s.v + i, tail),
                                                     lanes::load(s.master + i, tail), coef, u0, ratio);
        lanes::store(s.m + i, m_new, tail);
        lanes::store(vf + i, fresh, tail);
        updates.add(i, u, tail);
        prelims.add(i, u0, tail);
        largest = detail::max(largest, lanes::keep(ratio, largest, tail));
      });
      d.chunk_sum[ci] = updates.total();
      d.chunk_sum2[ci] = prelims.total();
      chunk_max[ci] = lanes::max_lane(largest);
    });
  }

  /// Per chunk of `w`, the sum of squares of x[c.state ..] in double (the momentum, for the scaling
  /// coefficients).
  static void sum_squares(const detail::work_list& w, const float* x, double* partial) {
    for_each_chunk(w, [&](std::size_t ci) {
      const detail::chunk& c = w[ci];
      detail::square_sum64<lanes> sum;
      detail::for_each_vector<lanes>(c.size, [&](std::size_t i, auto tail) { sum.add(i, lanes::load(x + c.state + i, tail), tail); });
      partial[ci] = sum.total();
    });
  }

  /// dst[c.state ..] = src[c.state ..] over the chunks of `w`.
  static void copy(const detail::work_list& w, float* dst, const float* src) {
    for_each_chunk(w, [&](std::size_t ci) { std::copy_n(src + w[ci].state, w[ci].size, dst + w[ci].state); });
  }

  // ---- the compressed all-reduce (compressed_allreduce.hpp) on flat buffers: `w` covers [0, n) with
  // state = index, chunks starting at multiples of 16.

  /// e += x; per chunk, the sum of squares of the new e, in double.
  static void add_into(const detail::work_list& w, float* e, const float* x, double* partial) {
    for_each_chunk(w, [&](std::size_t ci) {
      const detail::chunk& c = w[ci];
      detail::square_sum64<lanes> sum;
      detail::for_each_vector<lanes>(c.size, [&](std::size_t i, auto tail) {
        const auto v = lanes::load(e + c.state + i, tail) + lanes::load(x + c.state + i, tail);
        lanes::store(e + c.state + i, v, tail);
        sum.add(i, v, tail);
      });
      partial[ci] = sum.total();
    });
  }

  /// Compresses x in place with scale s (compress_sign): the sign of element i goes to bit i of
  /// `bits`, its residual stays in x. Sizes are multiples of 8.
  static void compress_signs(const detail::work_list& w, float* x, float s, std::uint8_t* bits) {
    for_each_chunk(w, [&](std::size_t ci) {
      const detail::chunk& c = w[ci];
      for (std::size_t g = 0; g < c.size; g += 16) {
        const std::size_t count = std::min<std::size_t>(16, c.size - g), at = c.state + g;
        std::uint32_t b = 0;
        detail::for_each_vector<lanes>(count, [&](std::size_t j, auto tail) {
          auto v = lanes::load(x + at + j, tail);
          b |= (lanes::bits_of(detail::compress_sign(v, typename lanes::vec(s))) & lanes::bits_of(tail)) << j;
          lanes::store(x + at + j, v, tail);
        });
        bits[at / 8] = std::uint8_t(b);
        if (count > 8) bits[at / 8 + 1] = std::uint8_t(b >> 8);
      }
    });
  }

  /// The server's average: c[i] += sum over ranks r of ±weight[r], the sign being bit i of block r
  /// (blocks of block_bytes, in rank order); c holds the server error before. Per chunk, sum c^2
  /// in double.
  static void combine_signs(const detail::work_list& w, const std::uint8_t* blocks, std::size_t block_bytes,
                            const float* weight, int ranks, float* c, double* partial) {
    for_each_chunk(w, [&](std::size_t ci) {
      const detail::chunk& k = w[ci];
      detail::square_sum64<lanes> sum;
      detail::for_each_vector<lanes>(k.size, [&](std::size_t i, auto tail) {
        typename lanes::vec acc(0.0f);
        for (int r = 0; r < ranks; ++r) {
          const auto positive = lanes::mask_of(detail::sign_bits_at(blocks + std::size_t(r) * block_bytes, k.state + i));
          acc = acc + detail::signed_scale(positive, typename lanes::vec(weight[r]));
        }
        const auto v = acc + lanes::load(c + k.state + i, tail);
        lanes::store(c + k.state + i, v, tail);
        sum.add(i, v, tail);
      });
      partial[ci] = sum.total();
    });
  }

  /// out[i] = element i of the code.
  static void decode_signs(const detail::work_list& w, const detail::sign_code& code, float* out) {
    for_each_chunk(w, [&](std::size_t ci) {
      const detail::chunk& c = w[ci];
      detail::for_each_vector<lanes>(c.size, [&](std::size_t i, auto tail) {
        lanes::store(out + c.state + i, code.template load<lanes>(c.state + i, tail), tail);
      });
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
