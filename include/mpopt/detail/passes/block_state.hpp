// mpopt — state quantized in blocks (state_precision.hpp: blockwise8_state, blockwise4_state,
// fp8_state) as the passes read and write it. A pass over such state works a block at a time (its
// granule): a stage's element view decodes each buffer's block into fp32 at its first access, the
// stage works on that, and the block is then quantized at once, its scale found in the same pass
// (detail/math/blockwise_quantization.hpp has the formulas; the vector lanes code and decode a
// block in their own instructions, detail/lanes/simd_codes.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../state_precision.hpp"
#include "../config.hpp"
#include "../math/blockwise_quantization.hpp"

namespace mpopt::detail {

/// Code j of a buffer of S's codes (4-bit: two a byte, the even element in the low half).
template <class S>
MPOPT_HOST_DEVICE std::uint32_t code_at(const std::uint8_t* codes, std::size_t j) {
  if constexpr (S::bits == 8) return codes[j];
  else return (codes[j / 2] >> (4 * (j % 2))) & 0xFu;
}

/// The bytes that hold n of S's codes.
template <class S>
constexpr MPOPT_HOST_DEVICE std::size_t code_bytes(std::size_t n) {
  return (n * S::bits + 7) / 8;
}

/// S's map for signed state or non-negative state (a dependent name: evaluated only where used).
template <class S, bool Signed>
constexpr const auto& storage_map() {
  if constexpr (S::bits == 8) return map8<Signed>;
  else return map4<Signed>;
}

#if defined(__CUDACC__)
/// A map as the device reads it, in constant memory: its values, and the thresholds its binary
/// search compares with (the host's bucket tables would not fit).
template <std::size_t N>
struct device_map {
  float values[N];
  float thresholds[N - 1];
};
template <std::size_t N>
constexpr device_map<N> device_map_of(const quantization_map<N>& m) {
  device_map<N> d{};
  for (std::size_t k = 0; k < N; ++k) d.values[k] = m.values[k];
  for (std::size_t k = 0; k + 1 < N; ++k) d.thresholds[k] = m.thresholds[k];
  return d;
}
struct device_e4m3 {
  float values[256];
};
constexpr device_e4m3 device_e4m3_of() {
  device_e4m3 d{};
  for (std::size_t c = 0; c < 256; ++c) d.values[c] = e4m3_values[c];
  return d;
}
// [0]: signed state, [1]: non-negative.
static __constant__ const device_map<256> map8_on_device[2] = {device_map_of(map8<true>), device_map_of(map8<false>)};
static __constant__ const device_map<16> map4_on_device[2] = {device_map_of(map4<true>), device_map_of(map4<false>)};
static __constant__ const device_e4m3 e4m3_on_device = device_e4m3_of();

/// S's map in device memory.
template <class S>
__device__ const auto& device_map_for(bool nonnegative) {
  if constexpr (S::bits == 8) return map8_on_device[nonnegative];
  else return map4_on_device[nonnegative];
}
#endif

/// The values of S's codes by code: its map's (the unsigned map where the buffer is non-negative),
/// or every E4M3 value.
template <class S>
MPOPT_HOST_DEVICE const float* code_table(bool nonnegative) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<S, fp8_state>) return e4m3_on_device.values;
  else return device_map_for<S>(nonnegative).values;
#else
  if constexpr (std::is_same_v<S, fp8_state>) return e4m3_values.data();
  else return nonnegative ? storage_map<S, false>().values.data() : storage_map<S, true>().values.data();
#endif
}

/// The value of code c in a block of scale s.
template <class S>
MPOPT_HOST_DEVICE float decode_state(std::uint32_t c, float s, bool nonnegative) {
  return code_table<S>(nonnegative)[c] * s;
}

/// A block's scale from its largest magnitude m (NaN where it holds a NaN or an infinity).
template <class S>
MPOPT_HOST_DEVICE float scale_of_block(float m) {
  if constexpr (std::is_same_v<S, fp8_state>) return m / e4m3_max;
  else return m;
}

/// The code of x in a block of scale s.
template <class S>
MPOPT_HOST_DEVICE std::uint32_t encode_state(float x, float s, bool nonnegative) {
  if constexpr (std::is_same_v<S, fp8_state>) {
    return e4m3_code(s > 0 ? x / s : 0.0f);
  } else {
#if defined(__CUDA_ARCH__)
    constexpr std::size_t N = std::size_t{1} << S::bits;
    return nearest_code<N>(device_map_for<S>(nonnegative).thresholds, s > 0 ? x / s : 0.0f);
#else
    return encode(nonnegative ? storage_map<S, false>() : storage_map<S, true>(), x, s);
#endif
  }
}

/// Whether lane type L finds, stores and reads codes a vector at a time (the AVX2 and AVX-512 lanes).
template <class L>
concept codes_in_vectors = requires { L::vector_codes; };

/// block_scale over n values, a vector at a time where L has vector codes.
template <class L>
MPOPT_HOST_DEVICE float block_scale_in(const float* x, std::size_t n) {
  if constexpr (codes_in_vectors<L>) return L::largest_magnitude(x, n);
  else return block_scale(x, n);
}

/// Quantizes the n values of one block (n <= S::block), a vector at a time where L has vector codes:
/// its scale to *scale, its codes to `codes` (the block's first byte).
template <class S, class L>
MPOPT_HOST_DEVICE void quantize_block(const float* x, std::size_t n, bool nonnegative, std::uint8_t* codes,
                                      float* scale) {
  const float s = scale_of_block<S>(block_scale_in<L>(x, n));
  *scale = s;
  if constexpr (codes_in_vectors<L>) {
    if constexpr (std::is_same_v<S, fp8_state>) L::encode_block_e4m3(x, n, s, codes);
    else if (nonnegative) L::encode_block(storage_map<S, false>(), x, n, s, codes);
    else L::encode_block(storage_map<S, true>(), x, n, s, codes);
  } else if constexpr (S::bits == 8) {
    for (std::size_t j = 0; j < n; ++j) codes[j] = std::uint8_t(encode_state<S>(x[j], s, nonnegative));
  } else {
    for (std::size_t j = 0; j < n; j += 2) {
      const std::uint32_t hi = j + 1 < n ? encode_state<S>(x[j + 1], s, nonnegative) : 0u;
      codes[j / 2] = std::uint8_t(encode_state<S>(x[j], s, nonnegative) | hi << 4);
    }
  }
}

/// The n values of one block from its codes and scale, into `out`.
template <class S, class L>
MPOPT_HOST_DEVICE void dequantize_block(const std::uint8_t* codes, std::size_t n, float scale, bool nonnegative,
                                        float* out) {
  if constexpr (codes_in_vectors<L>) {
    L::template decode_block<S::bits>(code_table<S>(nonnegative), codes, n, scale, out);
  } else {
    for (std::size_t j = 0; j < n; ++j) out[j] = decode_state<S>(code_at<S>(codes, j), scale, nonnegative);
  }
}

/// One block of the N quantized state buffers a stage works on, in fp32: buffer k decoded whole at
/// the stage's first access, and quantized again once the block is done if the stage wrote it.
template <class S, std::size_t N>
struct block_values {
  alignas(64) float values[N ? N : 1][S::block];
  std::size_t count;  // the block's elements
  bool decoded[N ? N : 1] = {};
  bool written[N ? N : 1] = {};
};

/// The granule of a pass over P's state: a block where the state is quantized (the backends then run
/// the pass's apply_granule), else 0 (its apply, a vector at a time).
template <class P>
constexpr MPOPT_HOST_DEVICE std::size_t state_granule() {
  if constexpr (quantized_in_blocks<state_storage_t<P>>) return state_storage_t<P>::block;
  else return 0;
}

}  // namespace mpopt::detail
