// mpopt — a fixed-size, 64-byte-aligned array: state buffers start on a cache line and a zmm
// boundary, and are never reallocated (views into them stay valid).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <span>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "../config.hpp"
#include "host_threads.hpp"

namespace mpopt::detail {

template <class T>
class aligned_buffer {
 public:
  static constexpr std::size_t alignment = 64;

  aligned_buffer() = default;
  explicit aligned_buffer(std::size_t n) : size_(n) {
    if (n) data_.reset(static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{alignment})));
  }

  /// n elements, all value-initialized (zero). A large buffer is zeroed by as many threads as the
  /// host backend's passes over it use, each its contiguous share in order, as the passes split
  /// their work: the first touch puts each page in the memory of the thread that will use it.
  static aligned_buffer zeroed(std::size_t n) {
    aligned_buffer b(n);
    T* p = b.data();
#if defined(_OPENMP)
    if (const int threads = host_threads(n); threads > 1) {
      MPOPT_PRAGMA_OMP(omp parallel num_threads(threads)) {
        const std::size_t t = std::size_t(omp_get_thread_num()), k = std::size_t(omp_get_num_threads());
        std::fill(p + n * t / k, p + n * (t + 1) / k, T{});
      }
      return b;
    }
#endif
    std::fill_n(p, n, T{});
    return b;
  }

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  std::span<T> span() { return {data(), size_}; }
  std::span<const T> span() const { return {data(), size_}; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  struct release {
    void operator()(T* p) const { ::operator delete(p, std::align_val_t{alignment}); }
  };
  std::unique_ptr<T[], release> data_;
  std::size_t size_ = 0;
};

}  // namespace mpopt::detail
