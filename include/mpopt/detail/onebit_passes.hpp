// mpopt — the element passes of the compression stage of 1-bit LAMB (onebit_lamb_driver.hpp, over
// the math of onebit_lamb_math.hpp) and 1-bit Adam (onebit_adam_driver.hpp). The compressed vector
// holds every tensor back to back in registration order, so a slice's `index` (its first element
// among all registered) is its place there; `scaling[t]` is tensor t's momentum scaling
// coefficient (1-bit LAMB; null: 1). They run through backend_passes::tensor_pass, like any pass
// of a rule's driver.
#pragma once

#include <cstddef>

#include "config.hpp"
#include "onebit_lamb_math.hpp"
#include "passes.hpp"
#include "sign_compression.hpp"
#include "work_list.hpp"

namespace mpopt::detail {

template <class P>
struct onebit_slice : coefficient_slice<P, lamb_coefficients> {
  float scaling;
  padded<float> v_fresh;
};

template <class P>
struct onebit_pass : coefficient_pass<P, lamb_coefficients> {
  const float* scaling;  // per tensor; null: 1
  float* v_fresh = nullptr;  // state-indexed, when the pass uses it
  MPOPT_HOST_DEVICE onebit_slice<P> at(std::size_t ci) const {
    const auto s = coefficient_pass<P, lamb_coefficients>::at(ci);
    const chunk& c = this->chunks[ci];
    return {s, scaling ? scaling[c.tensor] : 1.0f, {v_fresh ? v_fresh + c.state : nullptr}};
  }
};

/// worker[index] += onebit_local_momentum (the error feedback: the worker buffer holds the last
/// round's error); per chunk, the sum of squares of the new worker values (square64).
template <class P>
struct onebit_feed_pass : onebit_pass<P> {
  float* worker;
  template <class L, class S, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const S& s, std::size_t i, Tail tail, R& r) const {
    float* w = worker + s.index + i;
    const auto g = true_gradient<L>(s, i, tail, typename L::vec(s.scale));
    const auto x = vload<L>(w, tail) + onebit_local_momentum(g, vload<L>(s.state[0] + i, tail), typename L::vec(s.scaling), s.c);
    vstore<L>(w, x, tail);
    r.square64(i, x, tail);
  }
};

/// The momentum update once the averaged momentum is known: from `code` (m = code / scaling) or,
/// with one rank and no code, from the gradient. Writes m and v_fresh (state-indexed); per chunk
/// the sums of squares of u (square) and u0 (square2) and the largest ratio.
template <class P>
struct onebit_momentum_pass : onebit_pass<P> {
  sign_code code;  // code.bits null: no code, take the gradient
  template <class L, class S, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const S& s, std::size_t i, Tail tail, R& r) const {
    const auto m = vload<L>(s.state[0] + i, tail);
    const auto m_new = code.bits ? code.template load<L>(s.index + i, tail) / typename L::vec(s.scaling)
                            : lamb_first_moment(true_gradient<L>(s, i, tail, typename L::vec(s.scale)), m, s.c);
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
struct onebit_adam_pass : coefficient_pass<P, lamb_coefficients> {
  sign_code code;  // code.bits null: no code, take the gradient
  template <class L, class S, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const S& s, std::size_t i, Tail tail, R&) const {
    const auto m = code.bits ? code.template load<L>(s.index + i, tail)
                             : lamb_first_moment(true_gradient<L>(s, i, tail, typename L::vec(s.scale)),
                                                 vload<L>(s.state[0] + i, tail), s.c);
    const auto p = vload<L>(s.master + i, tail);
    vstore<L>(s.state[0] + i, m, tail);
    store_param<L>(s, i, lamb_apply(lamb_direction(m, vload<L>(s.state[1] + i, tail), p, s.c), p, float(s.c.step_size)), tail);
  }
};

}  // namespace mpopt::detail
