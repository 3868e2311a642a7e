// mpopt — deterministic sum of squares. Element i of a chunk always goes to fp32 lane i % 16 and the
// 16 lanes are combined by one fixed pairwise tree, so the AVX-512 path, the scalar path and any
// thread count give the same bits; across chunks the caller adds in double, in chunk order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lanes.hpp"
#include "passes.hpp"

namespace mpopt::detail {

constexpr std::size_t sum_lanes = 16;

/// N lanes into one value by a pairwise tree, in place: lane j takes lane j + w for w = N/2, ..., 1.
/// Every backend and every chunk combines its lanes in this one order.
template <std::size_t N, class T, class Op>
MPOPT_HOST_DEVICE T lane_tree(T* a, Op op) {
  for (std::size_t w = N / 2; w > 0; w /= 2)
    for (std::size_t j = 0; j < w; ++j) a[j] = op(a[j], a[j + w]);
  return a[0];
}

/// The sum of the sum_lanes lanes of a square_sum (float) or square_sum64 (double).
template <class T>
MPOPT_HOST_DEVICE T lane_tree_sum(T (&a)[sum_lanes]) {
  return lane_tree<sum_lanes>(a, [](T x, T y) { return x + y; });
}

/// x[first] + ... + x[last - 1] in double, in order (0 when empty): how the host backend, and the
/// device backend off the GPU, add per-chunk sums.
template <class T>
MPOPT_HOST_DEVICE double sum_in_order(const T* x, std::size_t first, std::size_t last) {
  double total = 0;
  for (std::size_t i = first; i < last; ++i) total += double(x[i]);
  return total;
}

/// Per-chunk sums into per-tensor sums: sums[s] = the sum of x over [offsets[s], offsets[s + 1]).
template <class T>
struct segment_sum {
  const T* x;
  const std::size_t* offsets;
  double* sums;

  MPOPT_HOST_DEVICE void operator()(std::size_t s) const { sums[s] = sum_in_order(x, offsets[s], offsets[s + 1]); }
};

template <class L>
struct square_sum;

template <>
struct square_sum<scalar_lanes> {
  float lanes[sum_lanes] = {};
  MPOPT_HOST_DEVICE void add(std::size_t i, float x, full_t) { lanes[i % sum_lanes] = fma(x, x, lanes[i % sum_lanes]); }
  MPOPT_HOST_DEVICE float total() { return lane_tree_sum(lanes); }
};

/// The same lane layout with double lanes: for scales that must not depend on how the sum was cut
/// (1-bit compression), where fp32 partials over 64 Ki elements would differ by ~1e-6 relative.
/// Squares of floats are exact in double, so fma or not gives the same bits.

template <class L>
struct square_sum64;

template <>
struct square_sum64<scalar_lanes> {
  double lanes[sum_lanes] = {};
  MPOPT_HOST_DEVICE void add(std::size_t i, float x, full_t) { lanes[i % sum_lanes] += double(x) * double(x); }
  MPOPT_HOST_DEVICE double total() { return lane_tree_sum(lanes); }
};

/// True if any active lane is NaN or infinite.
MPOPT_HOST_DEVICE bool any_nonfinite(float x, full_t) { return !(x <= 3.40282347e+38f && x >= -3.40282347e+38f); }

#if MPOPT_HAVE_AVX512
MPOPT_INTRINSICS_BEGIN
template <>
struct square_sum<avx512_lanes> {
  __m512 acc = _mm512_setzero_ps();
  void add(std::size_t, f32x16 x, full_t) { acc = _mm512_fmadd_ps(x.r, x.r, acc); }
  void add(std::size_t, f32x16 x, __mmask16 m) { acc = _mm512_mask3_fmadd_ps(x.r, x.r, acc, m); }
  float total() {
    alignas(64) float a[sum_lanes];
    _mm512_store_ps(a, acc);
    return lane_tree_sum(a);
  }
};

template <>
struct square_sum64<avx512_lanes> {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();  // lanes 0..7 and 8..15
  void add(std::size_t i, f32x16 x, full_t) { add(i, x, __mmask16(0xFFFF)); }
  void add(std::size_t, f32x16 x, __mmask16 m) {
    const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(x.r));
    const __m512d b = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x.r), 1)));
    lo = _mm512_mask3_fmadd_pd(a, a, lo, __mmask8(m & 0xFF));
    hi = _mm512_mask3_fmadd_pd(b, b, hi, __mmask8(m >> 8));
  }
  double total() {
    alignas(64) double a[sum_lanes];
    _mm512_store_pd(a, lo);
    _mm512_store_pd(a + 8, hi);
    return lane_tree_sum(a);
  }
};

inline bool any_nonfinite(f32x16 x, __mmask16 m) {
  const __m512 magnitude = _mm512_abs_ps(x.r);
  return _mm512_mask_cmp_ps_mask(m, magnitude, _mm512_set1_ps(3.40282347e+38f), _CMP_NLE_UQ) != 0;
}
inline bool any_nonfinite(f32x16 x, full_t) { return any_nonfinite(x, __mmask16(0xFFFF)); }
MPOPT_INTRINSICS_END
#endif

/// The per-chunk sums of a host pass (passes.hpp), in the lane layout above.
template <class L>
struct host_sums {
  square_sum<L> sum, sum2;
  square_sum64<L> sum64;
  bool any_nonfinite = false;
  typename L::vec max = typename L::vec(0.0f);

  template <class Tail>
  MPOPT_HOST_DEVICE void square(std::size_t i, typename L::vec x, Tail tail) { sum.add(i, x, tail); }
  template <class Tail>
  MPOPT_HOST_DEVICE void square2(std::size_t i, typename L::vec x, Tail tail) { sum2.add(i, x, tail); }
  template <class Tail>
  MPOPT_HOST_DEVICE void square64(std::size_t i, typename L::vec x, Tail tail) { sum64.add(i, x, tail); }
  template <class Tail>
  MPOPT_HOST_DEVICE void nonfinite(typename L::vec x, Tail tail) { any_nonfinite |= detail::any_nonfinite(x, tail); }
  template <class Tail>
  MPOPT_HOST_DEVICE void largest(typename L::vec x, Tail tail) { max = detail::max(max, L::keep(x, max, tail)); }

  MPOPT_HOST_DEVICE void write(const pass_outputs& out, std::size_t ci) {
    if (out.sum) out.sum[ci] = sum.total();
    if (out.sum2) out.sum2[ci] = sum2.total();
    if (out.sum64) out.sum64[ci] = sum64.total();
    if (out.nonfinite) out.nonfinite[ci] = any_nonfinite;
    if (out.largest) out.largest[ci] = L::max_lane(max);
  }
};

}  // namespace mpopt::detail
