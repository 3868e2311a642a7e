// A buffer in host memory and in the device backend's, for the device tests that compare the device
// backend with the host's (in the Thrust-OMP build both are host memory, and copies between them).
#pragma once

#include <cstddef>
#include <cstring>
#include <vector>

#include <mpopt/cuda.hpp>

template <class T>
struct mirrored {
  std::vector<T> host;
  mpopt::detail::device_buffer<T> device;
  explicit mirrored(std::size_t n) : host(n, T{}), device(n) {}
  void upload(mpopt::cuda& b) { b.to_device(device.data(), host.data(), host.size()); }
  std::vector<T> download(mpopt::cuda& b) const {
    std::vector<T> out(host.size());
    b.to_host(out.data(), device.data(), host.size());
    return out;
  }
  /// The device copy, as a tensor the optimizer takes.
  mpopt::view<T> device_view() { return {device.data(), host.size(), mpopt::memory_space::device}; }
};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}
