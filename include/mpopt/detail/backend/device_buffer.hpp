// mpopt — memory of the Thrust device system: cudaMalloc'd on the GPU build, 64-byte-aligned host
// memory in the Thrust-OMP build (whose "device" is the host). Zeroed on allocation, so the padding
// that device lanes read whole holds finite values.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include <thrust/version.h>

#include "aligned_buffer.hpp"
#include "../options/validate.hpp"

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#include <cuda_runtime.h>

#include "cuda_stream.hpp"
#define MPOPT_DEVICE_IS_GPU 1
#else
#define MPOPT_DEVICE_IS_GPU 0
#endif

namespace mpopt::detail {

#if MPOPT_DEVICE_IS_GPU
inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("cuda: ", what, " failed: ", cudaGetErrorString(e));
}

/// A non-blocking stream of the caller's own: it serializes with no other.
inline stream_holder own_stream() {
  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return stream_holder(s);
}
#endif

template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t n) : size_(n) {
#if MPOPT_DEVICE_IS_GPU
    if (n == 0) return;
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
    data_ = static_cast<T*>(p);
    if (const cudaError_t e = cudaMemset(p, 0, n * sizeof(T)); e != cudaSuccess) {
      cudaFree(p);
      cuda_check(e, "cudaMemset");
    }
#else
    host_ = aligned_buffer<T>::zeroed(n);
    data_ = host_.data();
#endif
  }
  device_buffer(device_buffer&& o) noexcept { swap(o); }
  device_buffer& operator=(device_buffer&& o) noexcept {
    device_buffer(std::move(o)).swap(*this);
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() {
#if MPOPT_DEVICE_IS_GPU
    if (data_) cudaFree(data_);
#endif
  }

  /// n elements, zero (every buffer is).
  static device_buffer zeroed(std::size_t n) { return device_buffer(n); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::span<T> span() { return {data_, size_}; }
  std::span<const T> span() const { return {data_, size_}; }

 private:
  void swap(device_buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
#if !MPOPT_DEVICE_IS_GPU
    std::swap(host_, o.host_);
#endif
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
#if !MPOPT_DEVICE_IS_GPU
  aligned_buffer<T> host_;
#endif
};

#if MPOPT_DEVICE_IS_GPU
/// Page-locked host memory mapped into the device's address space: kernels write per-chunk sums
/// into it and read coefficients from it, and the host reads it after a synchronize, with no copy.
template <class T>
struct pinned_allocator {
  using value_type = T;
  pinned_allocator() = default;
  template <class U>
  pinned_allocator(const pinned_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    void* p = nullptr;
    cuda_check(cudaHostAlloc(&p, n * sizeof(T), cudaHostAllocMapped), "cudaHostAlloc");
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { cudaFreeHost(p); }
  friend bool operator==(const pinned_allocator&, const pinned_allocator&) { return true; }
};
template <class T>
using pinned_vector = std::vector<T, pinned_allocator<T>>;
#else
template <class T>
using pinned_vector = std::vector<T>;  // the OMP build's device is the host
#endif

}  // namespace mpopt::detail
