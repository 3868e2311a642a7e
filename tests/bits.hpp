// The test harnesses' view of values as bits: snapshots compare every bit of optimizer state.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <type_traits>
#include <vector>

/// The bits of a float, mpopt::half or mpopt::bfloat16.
template <class T>
std::uint32_t bits(T x) {
  if constexpr (std::is_same_v<T, float>) return std::bit_cast<std::uint32_t>(x);
  else return x.bits;
}
/// Appends the bits of every value: one resize and a loop over pointers, which unoptimized and
/// -Og builds run several times faster than a push_back per element.
template <class R>
void append_bits(std::vector<std::uint32_t>& out, const R& values) {
  const std::size_t at = out.size(), n = std::size(values);
  out.resize(at + n);
  std::uint32_t* to = out.data() + at;
  const auto* from = std::data(values);
  for (std::size_t k = 0; k < n; ++k) to[k] = bits(from[k]);
}
