// mpopt — a set of the indices below n that only shrinks between resets: which tensors are still
// to be waited for (optimizer::wait_params).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mpopt::detail {

class index_set {
 public:
  /// Every index below n (no allocation once it held n).
  void reset(std::size_t n) {
    in_.assign(n, 1);
    left_ = n;
  }
  void clear() { reset(0); }
  /// Room for n indices, so that no reset up to n allocates.
  void reserve(std::size_t n) { in_.reserve(n); }
  bool empty() const { return left_ == 0; }
  void erase(std::size_t i) {
    if (i < in_.size() && in_[i]) {
      in_[i] = 0;
      --left_;
    }
  }
  /// The smallest index left (the set is not empty).
  std::size_t first() const { return std::size_t(std::find(in_.begin(), in_.end(), 1) - in_.begin()); }
  std::size_t bytes() const { return in_.capacity(); }

 private:
  std::vector<std::uint8_t> in_;
  std::size_t left_ = 0;
};

}  // namespace mpopt::detail
