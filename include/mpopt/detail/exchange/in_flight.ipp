// mpopt — ready_buckets' definitions (in_flight.hpp): inline header-only, else compiled once by
// <mpopt/src.hpp>.
#pragma once

#include "in_flight.hpp"

namespace mpopt::detail {

MPOPT_DECL void ready_buckets::assign(const std::vector<bucket>& buckets, std::size_t tensors) {
  buckets_ = buckets.size();
  size_.resize(buckets_);
  pending_.resize(buckets_);
  reported_.resize(tensors);
  tensor_buckets_.assign(tensors, {std::uint32_t(buckets_), 0});
  for (std::uint32_t b = 0; b < buckets_; ++b) {
    size_[b] = buckets[b].last_tensor - buckets[b].first_tensor;
    for (std::uint32_t t = buckets[b].first_tensor; t < buckets[b].last_tensor; ++t)
      tensor_buckets_[t] = {std::min(tensor_buckets_[t].first, b), b + 1};
  }
  restart();
}

}  // namespace mpopt::detail
