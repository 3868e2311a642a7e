// mpopt — the safetensors dtype of an element type, as checkpoints name it.
#pragma once

#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "../../numeric.hpp"

namespace mpopt::detail {

/// Maps an element type to its safetensors dtype name. The library's 16-bit float types (and any
/// other trivially copyable type whose size matches the dtype) opt in by specializing it:
///   template <> struct state_dtype<mpopt::half> { static constexpr std::string_view value = "F16"; };
template <class T>
struct state_dtype {};
template <> struct state_dtype<double> { static constexpr std::string_view value = "F64"; };
template <> struct state_dtype<float> { static constexpr std::string_view value = "F32"; };
template <> struct state_dtype<std::int64_t> { static constexpr std::string_view value = "I64"; };
template <> struct state_dtype<std::int32_t> { static constexpr std::string_view value = "I32"; };
template <> struct state_dtype<std::int16_t> { static constexpr std::string_view value = "I16"; };
template <> struct state_dtype<std::uint8_t> { static constexpr std::string_view value = "U8"; };
template <> struct state_dtype<half> : dtype_name<half> {};
template <> struct state_dtype<bfloat16> : dtype_name<bfloat16> {};

template <class T>
concept state_element = std::is_trivially_copyable_v<T> && requires {
  { state_dtype<T>::value } -> std::convertible_to<std::string_view>;
};

}  // namespace mpopt::detail
