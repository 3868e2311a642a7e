// mpopt — 16-bit floating-point storage types (IEEE binary16 `half`, Google Brain `bfloat16`).
// They are storage formats, not arithmetic types: they convert implicitly and exactly to float, and
// explicitly (rounding to nearest even) from float or double. Arithmetic happens in float.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <cstdint>
#include <limits>
#include <string_view>
#include <type_traits>

#include "detail/config.hpp"
#include "detail/lanes/float_bits.hpp"

namespace mpopt {

/// IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits. Same layout as CUDA's __half.
struct alignas(2) half {
  std::uint16_t bits;

  half() = default;  // trivial: uninitialized like float (value-initialize with half{} for +0)
  constexpr MPOPT_HOST_DEVICE explicit half(float f) noexcept : bits(detail::float_to_half_bits(f)) {}
  /// Rounds the double directly (correctly rounded; not via float, which could round twice).
  constexpr MPOPT_HOST_DEVICE explicit half(double d) noexcept : bits(detail::double_to_half_bits(d)) {}

  static constexpr MPOPT_HOST_DEVICE half from_bits(std::uint16_t b) noexcept {
    half h{};
    h.bits = b;
    return h;
  }

  constexpr MPOPT_HOST_DEVICE operator float() const noexcept { return detail::half_bits_to_float(bits); }

  /// Compares values, not bits: NaN != NaN, +0 == -0. (C++20 derives != from ==.)
  friend constexpr MPOPT_HOST_DEVICE bool operator==(half a, half b) noexcept {
    return static_cast<float>(a) == static_cast<float>(b);
  }
};

/// bfloat16: the top 16 bits of a float (1 sign, 8 exponent, 7 mantissa bits). Same layout as
/// CUDA's __nv_bfloat16.
struct alignas(2) bfloat16 {
  std::uint16_t bits;

  bfloat16() = default;  // trivial: uninitialized like float (value-initialize for +0)
  constexpr MPOPT_HOST_DEVICE explicit bfloat16(float f) noexcept : bits(detail::float_to_bfloat16_bits(f)) {}
  /// Rounds the double directly (correctly rounded; not via float, which could round twice).
  constexpr MPOPT_HOST_DEVICE explicit bfloat16(double d) noexcept : bits(detail::double_to_bfloat16_bits(d)) {}

  static constexpr MPOPT_HOST_DEVICE bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h{};
    h.bits = b;
    return h;
  }

  constexpr MPOPT_HOST_DEVICE operator float() const noexcept { return detail::bfloat16_bits_to_float(bits); }

  /// Compares values, not bits: NaN != NaN, +0 == -0. (C++20 derives != from ==.)
  friend constexpr MPOPT_HOST_DEVICE bool operator==(bfloat16 a, bfloat16 b) noexcept {
    return static_cast<float>(a) == static_cast<float>(b);
  }
};

/// safetensors dtype code of an element type: "F32", "F16" or "BF16". Undefined for other types.
template <class T>
struct dtype_name;
template <>
struct dtype_name<float> {
  static constexpr std::string_view value = "F32";
};
template <>
struct dtype_name<half> {
  static constexpr std::string_view value = "F16";
};
template <>
struct dtype_name<bfloat16> {
  static constexpr std::string_view value = "BF16";
};
template <class T>
inline constexpr std::string_view dtype_name_v = dtype_name<T>::value;

/// Customization point: declares that T has the bits of `storage` (float, mpopt::half or
/// mpopt::bfloat16), so tensors of T go to the optimizer as they are, with no cast and no copy:
///   template <> struct mpopt::numeric_traits<my::half> { using storage = mpopt::half; };
/// The library then reads and writes T's memory as `storage`; storage_t checks, at compile time,
/// that T has storage's size and alignment and is trivially copyable. The bit layout (IEEE binary16
/// for half, the top half of a float for bfloat16) is what the declaration promises.
/// <mpopt/interop.hpp> declares Eigen's and CUDA's 16-bit types; std::float16_t and
/// std::bfloat16_t are declared below where the compiler has them.
template <class T>
struct numeric_traits;
template <>
struct numeric_traits<float> {
  using storage = float;
};
template <>
struct numeric_traits<half> {
  using storage = half;
};
template <>
struct numeric_traits<bfloat16> {
  using storage = bfloat16;
};
// C++23's extended floating-point types, where the compiler has them: _Float16 and __bf16 in
// GCC 13 and later (the literals need no <stdfloat>).
#if defined(__STDCPP_FLOAT16_T__)
template <>
struct numeric_traits<decltype(0.0f16)> {  // std::float16_t
  using storage = half;
};
#endif
#if defined(__STDCPP_BFLOAT16_T__)
template <>
struct numeric_traits<decltype(0.0bf16)> {  // std::bfloat16_t
  using storage = bfloat16;
};
#endif

namespace detail {
/// T has a numeric_traits specialization (a declared storage type).
template <class T>
concept has_numeric_traits = requires { typename numeric_traits<T>::storage; };

/// The layout checks behind storage_t: a declaration that cannot be true is a compile-time error.
template <class T, class S = typename numeric_traits<T>::storage>
struct checked_storage {
  static_assert(std::is_same_v<S, float> || std::is_same_v<S, half> || std::is_same_v<S, bfloat16>,
                "mpopt::numeric_traits<T>::storage must be float, mpopt::half or mpopt::bfloat16");
  static_assert(sizeof(T) == sizeof(S) && alignof(T) == alignof(S),
                "mpopt::numeric_traits<T>: T must have the size and alignment of its storage type");
  static_assert(std::is_trivially_copyable_v<T>,
                "mpopt::numeric_traits<T>: T must be trivially copyable (the optimizer writes its bits)");
  using type = S;
};
}  // namespace detail

/// The mpopt type whose bits T has: numeric_traits<T>::storage, layout checked. T itself for float,
/// mpopt::half and mpopt::bfloat16.
template <class T>
using storage_t = typename detail::checked_storage<T>::type;

}  // namespace mpopt

// Layout checks against CUDA's types, only when the user already included their headers.
#if defined(__CUDACC__) && defined(__CUDA_FP16_H__)
static_assert(sizeof(__half) == sizeof(mpopt::half) && alignof(__half) == alignof(mpopt::half),
              "mpopt::half must be bit-compatible with __half");
#endif
#if defined(__CUDACC__) && defined(__CUDA_BF16_H__)
static_assert(sizeof(__nv_bfloat16) == sizeof(mpopt::bfloat16) &&
                  alignof(__nv_bfloat16) == alignof(mpopt::bfloat16),
              "mpopt::bfloat16 must be bit-compatible with __nv_bfloat16");
#endif

namespace std {

template <>
struct numeric_limits<mpopt::half> {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr float_denorm_style has_denorm = denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr float_round_style round_style = round_to_nearest;
  static constexpr bool is_iec559 = true;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = 11;
  static constexpr int digits10 = 3;      // floor((digits - 1) * log10(2))
  static constexpr int max_digits10 = 5;  // ceil(1 + digits * log10(2))
  static constexpr int radix = 2;
  static constexpr int min_exponent = -13;
  static constexpr int min_exponent10 = -4;
  static constexpr int max_exponent = 16;
  static constexpr int max_exponent10 = 4;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  static constexpr mpopt::half min() noexcept { return mpopt::half::from_bits(0x0400); }            // 2^-14
  static constexpr mpopt::half lowest() noexcept { return mpopt::half::from_bits(0xFBFF); }         // -65504
  static constexpr mpopt::half max() noexcept { return mpopt::half::from_bits(0x7BFF); }            // 65504
  static constexpr mpopt::half epsilon() noexcept { return mpopt::half::from_bits(0x1400); }        // 2^-10
  static constexpr mpopt::half round_error() noexcept { return mpopt::half::from_bits(0x3800); }    // 0.5
  static constexpr mpopt::half infinity() noexcept { return mpopt::half::from_bits(0x7C00); }
  static constexpr mpopt::half quiet_NaN() noexcept { return mpopt::half::from_bits(0x7E00); }
  static constexpr mpopt::half signaling_NaN() noexcept { return mpopt::half::from_bits(0x7D00); }
  static constexpr mpopt::half denorm_min() noexcept { return mpopt::half::from_bits(0x0001); }     // 2^-24
};

template <>
struct numeric_limits<mpopt::bfloat16> {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr float_denorm_style has_denorm = denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr float_round_style round_style = round_to_nearest;
  static constexpr bool is_iec559 = false;  // not one of the IEEE 754 interchange formats
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = 8;
  static constexpr int digits10 = 2;      // floor((digits - 1) * log10(2))
  static constexpr int max_digits10 = 4;  // ceil(1 + digits * log10(2))
  static constexpr int radix = 2;
  static constexpr int min_exponent = -125;  // same exponent range as float
  static constexpr int min_exponent10 = -37;
  static constexpr int max_exponent = 128;
  static constexpr int max_exponent10 = 38;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  static constexpr mpopt::bfloat16 min() noexcept { return mpopt::bfloat16::from_bits(0x0080); }          // 2^-126
  static constexpr mpopt::bfloat16 lowest() noexcept { return mpopt::bfloat16::from_bits(0xFF7F); }
  static constexpr mpopt::bfloat16 max() noexcept { return mpopt::bfloat16::from_bits(0x7F7F); }          // ~3.39e38
  static constexpr mpopt::bfloat16 epsilon() noexcept { return mpopt::bfloat16::from_bits(0x3C00); }      // 2^-7
  static constexpr mpopt::bfloat16 round_error() noexcept { return mpopt::bfloat16::from_bits(0x3F00); }  // 0.5
  static constexpr mpopt::bfloat16 infinity() noexcept { return mpopt::bfloat16::from_bits(0x7F80); }
  static constexpr mpopt::bfloat16 quiet_NaN() noexcept { return mpopt::bfloat16::from_bits(0x7FC0); }
  static constexpr mpopt::bfloat16 signaling_NaN() noexcept { return mpopt::bfloat16::from_bits(0x7FA0); }
  static constexpr mpopt::bfloat16 denorm_min() noexcept { return mpopt::bfloat16::from_bits(0x0001); }   // 2^-133
};

}  // namespace std
