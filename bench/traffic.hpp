// The reference kernels every host benchmark times the step against (bench/README.md, "The
// references"): the *minimal-traffic* kernel, one pass moving only the bytes the update cannot
// avoid, and the *same-traffic* kernel, a copy of the step's own passes. Both read and write the
// optimizer's own buffers in place with trivial arithmetic, vectorized in the library's lane type
// at the step's SIMD level and threaded over chunks of 2^16 elements, like the step.
#pragma once

#include "common.hpp"

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

namespace bench {

/// One tensor as the step sees it: the user's (or the flat group's) param and grad, the optimizer's
/// fp32 master (== param for fp32) and moments.
template <class Precision>
struct segment {
  using P = typename Precision::param_type;
  using G = typename Precision::grad_type;
  P* param;
  G* grad;
  float* master;
  float* m;
  float* v;
  std::size_t n;
};

/// The optimizer's tensors as segments: master()/moment() are const views of the optimizer's
/// (non-const) state, and writing through them is what the step itself does.
template <class Precision, class Opt, class Params, class Grads>
std::vector<segment<Precision>> segments_of(const Opt& opt, const Params& params, const Grads& grads) {
  std::vector<segment<Precision>> segs;
  for (std::size_t t = 0; t < params.size(); ++t) {
    auto w = opt.master(t), m = opt.moment(0, t), v = opt.moment(1, t);
    segs.push_back({params[t].data(), grads[t].data(), const_cast<float*>(w.data()), const_cast<float*>(m.data()),
                    const_cast<float*>(v.data()), params[t].size()});
  }
  return segs;
}

struct chunk {
  std::size_t seg, begin, n;
};

/// Every segment cut into chunks of at most 2^16 elements, in order; threads take them with
/// `omp parallel for schedule(static)`, i.e. contiguous runs, like the step's work list.
template <class S>
std::vector<chunk> make_chunks(const std::vector<S>& segs) {
  constexpr std::size_t max_chunk = std::size_t{1} << 16;
  std::vector<chunk> out;
  for (std::size_t s = 0; s < segs.size(); ++s)
    for (std::size_t b = 0; b < segs[s].n; b += max_chunk) out.push_back({s, b, std::min(max_chunk, segs[s].n - b)});
  return out;
}

/// One chunk of pass `Pass` (0: the gradient pre-pass; 1: the Adam pass or LAMB pass 1; 2: LAMB
/// pass 2) in lane type L: its loads, stores and 16-bit conversions, nothing else of the step.
/// Returns the largest lane of what the reductions read.
template <class L, class Precision, class Rule, int Pass>
float traffic_tile(const segment<Precision>& s, std::size_t b, std::size_t n, float k) {
  using mpopt::detail::fma;
  using mpopt::detail::max;
  using V = typename L::vec;
  constexpr bool has_master = Precision::has_master;
  constexpr bool is_lamb = std::is_same_v<Rule, mpopt::lamb>;
  const V kv(k);
  V acc(0.0f);
  mpopt::detail::for_each_vector<L>(n, [&](std::size_t i, auto t) {
    const std::size_t j = b + i;
    if constexpr (Pass == 0) {  // read g (the step: overflow check and sum of squares)
      acc = fma(L::load(s.grad + j, t), kv, acc);
    } else if constexpr (Pass == 1) {  // read g, master, m, v; write m, v (Adam: master and param too)
      const V g = L::load(s.grad + j, t);
      const V w = L::load(s.master + j, t);
      L::store(s.m + j, fma(kv, g, L::load(s.m + j, t)), t);
      L::store(s.v + j, fma(kv, g, L::load(s.v + j, t)), t);
      if constexpr (is_lamb) {
        acc = fma(w, kv, acc);
      } else {
        const V wn = fma(kv, g, w);
        L::store(s.master + j, wn, t);
        if constexpr (has_master) L::store(s.param + j, wn, t);
      }
    } else {  // LAMB pass 2: read master, m, v; write master (and param)
      const V wn = fma(kv, L::load(s.m + j, t) + L::load(s.v + j, t), L::load(s.master + j, t));
      L::store(s.master + j, wn, t);
      if constexpr (has_master) L::store(s.param + j, wn, t);
    }
  });
  return L::max_lane(max(acc, V(0.0f)));
}

template <class Precision, class Rule, int Pass>
using tile_fn = float (*)(const segment<Precision>&, std::size_t, std::size_t, float);

#if MPOPT_X86_SIMD
template <class Precision, class Rule, int Pass>
MPOPT_TARGET_ENTRY(MPOPT_ISA_AVX512) float traffic_tile_avx512(const segment<Precision>& s, std::size_t b, std::size_t n, float k) {
  return traffic_tile<mpopt::detail::avx512_lanes, Precision, Rule, Pass>(s, b, n, k);
}
template <class Precision, class Rule, int Pass>
MPOPT_TARGET_ENTRY(MPOPT_ISA_AVX2) float traffic_tile_avx2(const segment<Precision>& s, std::size_t b, std::size_t n, float k) {
  return traffic_tile<mpopt::detail::avx2_lanes, Precision, Rule, Pass>(s, b, n, k);
}
#endif

/// The tile at the host backend's SIMD level, so the reference vectorizes as the step does.
template <class Precision, class Rule, int Pass>
tile_fn<Precision, Rule, Pass> traffic_tile_at_level() {
#if MPOPT_X86_SIMD
  if (mpopt::host::simd() == mpopt::simd_level::avx512) return traffic_tile_avx512<Precision, Rule, Pass>;
  if (mpopt::host::simd() == mpopt::simd_level::avx2) return traffic_tile_avx2<Precision, Rule, Pass>;
#endif
  return traffic_tile<mpopt::detail::scalar_lanes, Precision, Rule, Pass>;
}

/// One pass over every chunk, threads taking contiguous runs of chunks.
template <class Precision, class Rule, int Pass>
float traffic_pass(const std::vector<segment<Precision>>& segs, const std::vector<chunk>& chunks, float k) {
  const auto tile = traffic_tile_at_level<Precision, Rule, Pass>();
  const std::ptrdiff_t nc = std::ptrdiff_t(chunks.size());
  float largest = 0.0f;
  BENCH_OMP(omp parallel for schedule(static) reduction(max : largest))
  for (std::ptrdiff_t c = 0; c < nc; ++c) {
    const auto& ch = chunks[std::size_t(c)];
    largest = std::max(largest, tile(segs[ch.seg], ch.begin, ch.n, k));
  }
  return largest;
}

/// The minimal-traffic kernel: the Adam pass, or LAMB's two passes, and nothing else
/// (minimal_bytes_per_param). Returns a value that depends on everything the reductions read.
template <class Precision, class Rule>
float minimal_traffic(const std::vector<segment<Precision>>& segs, const std::vector<chunk>& chunks) {
  const float k = runtime_zero;
  float r = traffic_pass<Precision, Rule, 1>(segs, chunks, k);
  if constexpr (std::is_same_v<Rule, mpopt::lamb>) r += traffic_pass<Precision, Rule, 2>(segs, chunks, k);
  return r;
}

/// The same-traffic kernel: the step's own passes, the gradient pre-pass first when it makes one.
template <class Precision, class Rule>
float same_traffic(const std::vector<segment<Precision>>& segs, const std::vector<chunk>& chunks, bool prepass) {
  const float r = prepass ? traffic_pass<Precision, Rule, 0>(segs, chunks, runtime_zero) : 0.0f;
  return r + minimal_traffic<Precision, Rule>(segs, chunks);
}

}  // namespace bench
