// mpopt — the element passes of the compressing rules' drivers: 1-bit LAMB (onebit_lamb_driver.hpp,
// over the math of onebit_lamb_math.hpp), 1-bit Adam (onebit_adam_driver.hpp) and 0/1 Adam
// (zero_one_adam_driver.hpp). Each tensor has a place in the compressed vector (`place.start`: every
// tensor back to back, or each at a multiple of 16 where tensors have scales of their own), and
// `place.keep` has a bit per place: an average whose bit is clear is taken as 0 (a 1-bit code cannot
// carry a zero). `scaling[t]` is tensor t's momentum scaling coefficient (1-bit LAMB; null: 1). They
// run through backend_passes::tensor_pass, like any pass of a rule's driver.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../config.hpp"
#include "../math/onebit_lamb_math.hpp"
#include "passes.hpp"
#include "../math/sign_compression.hpp"
#include "work_list.hpp"

namespace mpopt::detail {

/// Where the compressed vector holds each tensor, and which averages it keeps.
struct compressed_place {
  const std::uint64_t* start = nullptr;  ///< per tensor: the place of its element 0
  const std::uint8_t* keep = nullptr;    ///< a bit per place (null: keep every average)
};

template <class P>
struct compressed_slice : coefficient_slice<P, lamb_coefficients> {
  std::size_t place;  ///< the place of the slice's element 0 in the compressed vector
  const std::uint8_t* keep;
  /// x where the average at element i may be kept, else 0.
  template <class L, class V>
  MPOPT_HOST_DEVICE V kept(std::size_t i, V x) const {
    return detail::kept<L>(keep, place + i, x);
  }
  /// Element i's average from `code`, kept or 0.
  template <class L, class Tail>
  MPOPT_HOST_DEVICE typename L::vec average(const sign_code& code, std::size_t i, Tail tail) const {
    return kept<L>(i, code.template load<L>(this->tensor, place + i, tail));
  }
};

template <class P>
struct compressed_pass : coefficient_pass<P, lamb_coefficients> {
  compressed_place where;
  MPOPT_HOST_DEVICE compressed_slice<P> at(std::size_t ci) const {
    const auto s = coefficient_pass<P, lamb_coefficients>::at(ci);
    const chunk& c = this->chunks[ci];
    return {s, std::size_t(where.start[c.tensor] + c.begin), where.keep};
  }
};

template <class P>
struct onebit_slice : compressed_slice<P> {
  float scaling;
  padded<float> v_fresh;
};

template <class P>
struct onebit_pass : compressed_pass<P> {
  const float* scaling;  // per tensor; null: 1
  float* v_fresh = nullptr;  // state-indexed, when the pass uses it
  MPOPT_HOST_DEVICE onebit_slice<P> at(std::size_t ci) const {
    const auto s = compressed_pass<P>::at(ci);
    const chunk& c = this->chunks[ci];
    return {s, scaling ? scaling[c.tensor] : 1.0f, {v_fresh ? v_fresh + c.state : nullptr}};
  }
};

/// worker[place] += onebit_local_momentum (the error feedback: the worker buffer holds the last
/// round's error); per chunk, the sum of squares of the new worker values (square64).
template <class P>
struct onebit_feed_pass : onebit_pass<P> {
  float* worker;
  template <class L, class S, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const S& s, std::size_t i, Tail tail, R& r) const {
    float* w = worker + s.place + i;
    const auto g = true_gradient<L>(s, i, tail, typename L::vec(s.scale));
    const auto x = vload<L>(w, tail) + onebit_local_momentum(g, vload<L>(s.state[0] + i, tail), typename L::vec(s.scaling), s.c);
    vstore<L>(w, x, tail);
    r.square64(i, x, tail);
  }
};

/// The momentum update once the averaged momentum is known: from `code` (m = code / scaling) or,
/// with one rank and no code, from the gradient; kept or 0 as `where.keep` says (so in every pass
/// below that takes an average). Writes m and v_fresh (state-indexed); per chunk
/// the sums of squares of u (square) and u0 (square2) and the largest ratio.
template <class P>
struct onebit_momentum_pass : onebit_pass<P> {
  sign_code code;  // code.bits null: no code, take the gradient
  template <class L, class S, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const S& s, std::size_t i, Tail tail, R& r) const {
    const auto m = vload<L>(s.state[0] + i, tail);
    const auto m_new = s.template kept<L>(
        i, code.bits ? code.template load<L>(s.tensor, s.place + i, tail) / typename L::vec(s.scaling)
                     : lamb_first_moment(true_gradient<L>(s, i, tail, typename L::vec(s.scale)), m, s.c));
    auto fresh = vload<L>(s.v_fresh + i, tail);
    typename L::vec u0, ratio;
    const auto u = onebit_lamb_direction(m_new, m, fresh, vload<L>(s.state[1] + i, tail), vload<L>(s.master + i, tail),
                                         s.c, u0, ratio);
    vstore<L>(s.state[0] + i, m_new, tail);
    vstore<L>(s.v_fresh + i, fresh, tail);
    r.square(i, u, tail);
    r.square2(i, u0, tail);
    r.largest(ratio, tail);
  }
};

/// 1-bit Adam's update once the averaged momentum is known: from `code`, or with one rank and no
/// code from the gradient; m is stored and applied with the frozen variance, p -= lr u.
template <class P>
struct onebit_adam_pass : compressed_pass<P> {
  sign_code code;  // code.bits null: no code, take the gradient
  template <class L, class S, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const S& s, std::size_t i, Tail tail, R&) const {
    const auto m = code.bits ? s.template average<L>(code, i, tail)
                             : s.template kept<L>(i, lamb_first_moment(true_gradient<L>(s, i, tail, typename L::vec(s.scale)),
                                                                       vload<L>(s.state[0] + i, tail), s.c));
    const auto p = vload<L>(s.master + i, tail);
    vstore<L>(s.state[0] + i, m, tail);
    store_param<L>(s, i, lamb_apply(lamb_direction(m, vload<L>(s.state[1] + i, tail), p, s.c), p, float(s.c.step_size)), tail);
  }
};

/// 0/1 Adam, phase 1, a step that compresses the gradient: worker[place] += g; per chunk the sum of
/// squares of the new worker values (square64).
template <class P>
struct gradient_feed_pass : compressed_pass<P> {
  float* worker;
  template <class L, class S, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const S& s, std::size_t i, Tail tail, R& r) const {
    float* w = worker + s.place + i;
    const auto x = vload<L>(w, tail) + true_gradient<L>(s, i, tail, typename L::vec(s.scale));
    vstore<L>(w, x, tail);
    r.square64(i, x, tail);
  }
};

/// 0/1 Adam, phase 1, once the averaged gradient is known (from `code`, or with one rank and no
/// code the gradient itself): the momentum moves, the variance does not, p -= lr u.
template <class P>
struct averaged_gradient_pass : compressed_pass<P> {
  sign_code code;  // code.bits null: no code, take the gradient
  template <class L, class S, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const S& s, std::size_t i, Tail tail, R&) const {
    const auto g = code.bits ? s.template average<L>(code, i, tail)
                             : s.template kept<L>(i, true_gradient<L>(s, i, tail, typename L::vec(s.scale)));
    const auto m = lamb_first_moment(g, vload<L>(s.state[0] + i, tail), s.c);
    const auto p = vload<L>(s.master + i, tail);
    vstore<L>(s.state[0] + i, m, tail);
    store_param<L>(s, i, lamb_apply(lamb_direction(m, vload<L>(s.state[1] + i, tail), p, s.c), p, float(s.c.step_size)), tail);
  }
};

/// 0/1 Adam, phase 2: a step on the local gradient, p -= lr u, and the accumulator a -= lr u. On a
/// sync step the parameter goes back to the last synchronised point (p -= a) and a is scaled by
/// sqrt(v) + eps; with a `worker` buffer a is also added into it (the exchange follows), with per
/// chunk the sum of squares of the new worker values (square64).
template <class P>
struct local_step_pass : compressed_pass<P> {
  bool sync;
  float* worker;  // null: no exchange
  template <class L, class S, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const S& s, std::size_t i, Tail tail, R& r) const {
    using V = typename L::vec;
    const auto m = lamb_first_moment(true_gradient<L>(s, i, tail, V(s.scale)), vload<L>(s.state[0] + i, tail), s.c);
    const auto v = vload<L>(s.state[1] + i, tail), p0 = vload<L>(s.master + i, tail);
    const auto u = lamb_direction(m, v, p0, s.c);
    auto p = lamb_apply(u, p0, float(s.c.step_size));
    auto a = lamb_apply(u, vload<L>(s.state[2] + i, tail), float(s.c.step_size));
    if (sync) {
      p = p - a;
      a = a * (sqrt(v) + V(s.c.eps));
      if (worker) {
        float* w = worker + s.place + i;
        const auto x = vload<L>(w, tail) + a;
        vstore<L>(w, x, tail);
        r.square64(i, x, tail);
      }
    }
    vstore<L>(s.state[0] + i, m, tail);
    vstore<L>(s.state[2] + i, a, tail);
    store_param<L>(s, i, p, tail);
  }
};

/// 0/1 Adam, the end of a sync step: the averaged accumulator a (from `code`, or with one rank the
/// accumulator itself) becomes the momentum -a / lr_sum[tensor] (lr_sum: the learning rates summed
/// since the last sync) and the step from the synchronised point, p += a / (sqrt(v) + eps); a = 0.
template <class P>
struct sync_pass : compressed_pass<P> {
  sign_code code;  // code.bits null: no code, take the accumulator
  const float* lr_sum;
  template <class L, class S, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const S& s, std::size_t i, Tail tail, R&) const {
    using V = typename L::vec;
    const auto a = code.bits ? s.template average<L>(code, i, tail) : s.template kept<L>(i, vload<L>(s.state[2] + i, tail));
    const auto den = sqrt(vload<L>(s.state[1] + i, tail)) + V(s.c.eps);
    vstore<L>(s.state[0] + i, -a / V(lr_sum[s.tensor]), tail);
    vstore<L>(s.state[2] + i, V(0.0f), tail);
    store_param<L>(s, i, vload<L>(s.master + i, tail) + a / den, tail);
  }
};

}  // namespace mpopt::detail