// mpopt — checksum64's definitions (checksum.hpp): inline header-only, else compiled once by
// <mpopt/src.hpp>.
#pragma once

#include "checksum.hpp"

namespace mpopt::detail {

MPOPT_DECL std::uint64_t checksum64::finish() const {
  std::uint64_t h = h_;
  if (pending_ != 0) {  // 1..7 tail bytes, as a zero-extended little-endian word
    std::uint64_t tail = 0;
    for (std::size_t i = pending_; i-- > 0;) tail = (tail << 8) | std::to_integer<std::uint64_t>(buf_[i]);
    h ^= tail;
    h *= m;
  }
  h ^= h >> r;
  h *= m;
  h ^= h >> r;
  return h;
}

}  // namespace mpopt::detail
