// mpopt — what 1-bit LAMB keeps beyond LAMB's moments (DeepSpeed OnebitLamb's state), per rank.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../compressed_allreduce.hpp"

namespace mpopt::detail {

template <class Backend>
struct onebit_state {
  template <class T>
  using shared = typename Backend::template shared_vector<T>;

  std::vector<double> coeff_freeze;     ///< per tensor: running average of the warm-up LAMB coefficient
  std::vector<double> last_factor;      ///< per tensor: the compression-stage factor of the last step
  shared<float> scaling;                ///< per tensor: momentum scaling coefficient, fixed at the first compressed step
  shared<std::size_t> fused;            ///< per tensor: its first element in the compressed vector
  shared<float> chunk_max;              ///< per work chunk: the largest variance ratio
  shared<double> chunk_sum;             ///< per work chunk: sums of squares for the compression scales
  compressed_allreduce<Backend> exchange;  ///< more than one rank only
  bool scaling_ready = false;
  std::uint64_t compression_step = 0;   ///< the first step that compressed (0: still warming up)

  /// Allocates everything for `tensors` of the given sizes and `chunks` work chunks, on `world` ranks.
  void allocate(const std::vector<std::size_t>& sizes, std::size_t chunks, int world, int rank) {
    coeff_freeze.assign(sizes.size(), 0.0);
    last_factor.assign(sizes.size(), 1.0);
    scaling.assign(sizes.size(), 1.0f);
    fused.clear();
    std::size_t total = 0;
    for (std::size_t n : sizes) {
      fused.push_back(total);
      total += n;
    }
    chunk_max.assign(chunks, 0.0f);
    chunk_sum.assign(chunks, 0.0);
    if (world > 1) exchange = compressed_allreduce<Backend>(total, world, rank);
  }

  /// Heap bytes besides the exchange's buffers.
  std::size_t bookkeeping_bytes() const {
    return (coeff_freeze.capacity() + last_factor.capacity() + chunk_sum.capacity()) * sizeof(double) +
           (scaling.capacity() + chunk_max.capacity()) * sizeof(float) + fused.capacity() * sizeof(std::size_t);
  }
};

/// Stands in for onebit_state under the other rules.
struct no_onebit_state {};

}  // namespace mpopt::detail
