// mpopt — sums for the device backend, the one place it calls CUB directly: on a GPU,
// cub::DeviceSegmentedReduce and cub::DeviceReduce (temporary storage kept between steps); on
// Thrust's OpenMP system, one thread per segment adding in order, as the host backend does
// (segment_sum, square_sum.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include "../config.hpp"
#include "device_buffer.hpp"
#include "../passes/square_sum.hpp"

#if MPOPT_DEVICE_IS_GPU
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_segmented_reduce.cuh>
#include <cuda/std/functional>
#endif

namespace mpopt::detail {

#if MPOPT_DEVICE_IS_GPU
using stream_handle = cudaStream_t;
#else
using stream_handle = std::nullptr_t;  // Thrust's OpenMP system has no streams
#endif

/// Sums in double on the backend's stream, which `policy` also runs on; pointers are device
/// pointers.
class device_reducer {
 public:
  /// sums[s] = segment_sum over [offsets[s], offsets[s + 1]).
  template <class Policy, class T>
  void sum_segments([[maybe_unused]] const Policy& policy, [[maybe_unused]] stream_handle stream, const T* x,
                    const std::size_t* offsets, std::size_t segments, double* sums) {
#if MPOPT_DEVICE_IS_GPU
    run("cub::DeviceSegmentedReduce", [&](void* temp, std::size_t& bytes) {
      return cub::DeviceSegmentedReduce::Reduce(temp, bytes, x, sums, std::int64_t(segments), offsets, offsets + 1,
                                                ::cuda::std::plus<double>{}, 0.0, stream);
    });
#else
    thrust::for_each_n(policy, thrust::counting_iterator<std::size_t>(0), segments, segment_sum<T>{x, offsets, sums});
#endif
  }
  /// *sum = the sum of x[0, n).
  template <class Policy, class T>
  void sum_all([[maybe_unused]] const Policy& policy, [[maybe_unused]] stream_handle stream, const T* x, std::size_t n,
               double* sum) {
#if MPOPT_DEVICE_IS_GPU
    run("cub::DeviceReduce", [&](void* temp, std::size_t& bytes) {
      return cub::DeviceReduce::Reduce(temp, bytes, x, sum, std::int64_t(n), ::cuda::std::plus<double>{}, 0.0, stream);
    });
#else
    *sum = sum_in_order(x, 0, n);  // the OpenMP system's device memory is the host's
#endif
  }

 private:
#if MPOPT_DEVICE_IS_GPU
  /// CUB's two phases: the size, then the call, in storage that grows only while the optimizer's
  /// sizes are seen for the first time.
  template <class Reduce>
  void run(const char* what, const Reduce& reduce) {
    std::size_t bytes = 0;
    cuda_check(reduce(nullptr, bytes), what);
    if (temp_.size() < bytes) temp_ = device_buffer<std::byte>(bytes);
    cuda_check(reduce(temp_.data(), bytes), what);
  }
  device_buffer<std::byte> temp_;
#endif
};

}  // namespace mpopt::detail
