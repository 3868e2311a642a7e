// mpopt — deterministic sum of squares. Element i of a chunk always goes to fp32 lane i % 16 and the
// 16 lanes are combined by one fixed pairwise tree, so every lane width (the AVX2 and AVX-512 sums
// are in their lane headers) and any thread count give the same bits; across chunks the caller adds
// in double, in chunk order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../lanes/lanes.hpp"
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

/// The per-chunk sums of a host pass (passes.hpp), in the lane layout above. The lane types' own
/// any_nonfinite and max are found by argument-dependent lookup where the pass is instantiated.
template <class L>
struct host_sums {
  square_sum<L> sum, sum2;
  square_sum64<L> sum64;
  bool seen_nonfinite = false;
  typename L::vec running_max = typename L::vec(0.0f);

  template <class Tail>
  MPOPT_HOST_DEVICE void square(std::size_t i, typename L::vec x, Tail tail) { sum.add(i, x, tail); }
  template <class Tail>
  MPOPT_HOST_DEVICE void square2(std::size_t i, typename L::vec x, Tail tail) { sum2.add(i, x, tail); }
  template <class Tail>
  MPOPT_HOST_DEVICE void square64(std::size_t i, typename L::vec x, Tail tail) { sum64.add(i, x, tail); }
  template <class Tail>
  MPOPT_HOST_DEVICE void nonfinite(typename L::vec x, Tail tail) { seen_nonfinite |= any_nonfinite(x, tail); }
  template <class Tail>
  MPOPT_HOST_DEVICE void largest(typename L::vec x, Tail tail) { running_max = max(running_max, L::keep(x, running_max, tail)); }

  MPOPT_HOST_DEVICE void write(const pass_outputs& out, std::size_t ci) {
    if (out.sum) out.sum[ci] = sum.total();
    if (out.sum2) out.sum2[ci] = sum2.total();
    if (out.sum64) out.sum64[ci] = out.round64 ? round_to_float_precision(sum64.total()) : sum64.total();
    if (out.nonfinite) out.nonfinite[ci] = seen_nonfinite;
    if (out.largest) out.largest[ci] = L::max_lane(running_max);
  }
};

}  // namespace mpopt::detail
