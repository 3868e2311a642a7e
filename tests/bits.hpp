// The bits of a value, as the tests compare them (harness_data.hpp appends whole tensors').
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

/// The bits of a float, mpopt::half or mpopt::bfloat16.
template <class T>
std::uint32_t bits(T x) {
  if constexpr (std::is_same_v<T, float>) return std::bit_cast<std::uint32_t>(x);
  else return x.bits;
}
