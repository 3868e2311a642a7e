// mpopt — segmented sums for the device backend, the one place it calls CUB directly: on a GPU,
// cub::DeviceSegmentedReduce (temporary storage kept between steps); on Thrust's OpenMP system, one
// thread per segment adding in order, as the host backend does (segment_sum, square_sum.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include "config.hpp"
#include "device_buffer.hpp"
#include "square_sum.hpp"

#if MPOPT_DEVICE_IS_GPU
#include <cub/device/device_segmented_reduce.cuh>
#include <cuda/std/functional>
#endif

namespace mpopt::detail {

#if MPOPT_DEVICE_IS_GPU
using stream_handle = cudaStream_t;
#else
using stream_handle = std::nullptr_t;  // Thrust's OpenMP system has no streams
#endif

class segmented_reducer {
 public:
  /// segment_sum over `segments` segments (device pointers), on the backend's stream, which
  /// `policy` also runs on.
  template <class Policy, class T>
  void sum([[maybe_unused]] const Policy& policy, [[maybe_unused]] stream_handle stream, const T* x,
           const std::size_t* offsets, std::size_t segments, double* sums) {
#if MPOPT_DEVICE_IS_GPU
    const auto reduce = [&](void* temp, std::size_t& bytes) {
      return cub::DeviceSegmentedReduce::Reduce(temp, bytes, x, sums, std::int64_t(segments), offsets, offsets + 1,
                                                ::cuda::std::plus<double>{}, 0.0, stream);
    };
    std::size_t bytes = 0;
    cuda_check(reduce(nullptr, bytes), "cub::DeviceSegmentedReduce (size)");
    if (temp_.size() < bytes) temp_ = device_buffer<std::byte>(bytes);  // the first step's size holds after
    cuda_check(reduce(temp_.data(), bytes), "cub::DeviceSegmentedReduce");
#else
    thrust::for_each_n(policy, thrust::counting_iterator<std::size_t>(0), segments, segment_sum<T>{x, offsets, sums});
#endif
  }

 private:
#if MPOPT_DEVICE_IS_GPU
  device_buffer<std::byte> temp_;
#endif
};

}  // namespace mpopt::detail
