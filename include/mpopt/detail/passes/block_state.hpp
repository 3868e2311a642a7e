// mpopt — state quantized in blocks (state_precision.hpp: blockwise8_state, blockwise4_state,
// fp8_state) as the passes read and write it. A pass over such state works a block at a time (its
// granule): a stage's element view decodes what it reads, keeps what it writes in fp32 until the
// block is done, and the block is then quantized at once, its scale found in the same pass
// (detail/math/blockwise_quantization.hpp has the formulas).
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

/// The value of code c in a block of scale s; the unsigned map where the buffer is non-negative.
template <class S>
MPOPT_HOST_DEVICE float decode_state(std::uint32_t c, float s, bool nonnegative) {
  if constexpr (std::is_same_v<S, fp8_state>) return e4m3_value(std::uint8_t(c)) * s;
  else return decode(nonnegative ? storage_map<S, false>() : storage_map<S, true>(), c, s);
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
  if constexpr (std::is_same_v<S, fp8_state>) return e4m3_code(s > 0 ? x / s : 0.0f);
  else return encode(nonnegative ? storage_map<S, false>() : storage_map<S, true>(), x, s);
}

/// Quantizes the n values of one block (n <= S::block): its scale to *scale, its codes to `codes`
/// (the block's first byte).
template <class S>
MPOPT_HOST_DEVICE void quantize_block(const float* x, std::size_t n, bool nonnegative, std::uint8_t* codes,
                                      float* scale) {
  const float s = scale_of_block<S>(block_scale(x, n));
  *scale = s;
  if constexpr (S::bits == 8) {
    for (std::size_t j = 0; j < n; ++j) codes[j] = std::uint8_t(encode_state<S>(x[j], s, nonnegative));
  } else {
    for (std::size_t j = 0; j < n; j += 2) {
      const std::uint32_t hi = j + 1 < n ? encode_state<S>(x[j + 1], s, nonnegative) : 0u;
      codes[j / 2] = std::uint8_t(encode_state<S>(x[j], s, nonnegative) | hi << 4);
    }
  }
}

/// The fp32 values a stage writes into the quantized state buffers of one block, kept until the
/// block is done: buffer k's first written[k] elements.
template <class S, std::size_t N>
struct written_block {
  alignas(64) float values[N ? N : 1][S::block];
  std::size_t written[N ? N : 1] = {};
};

/// The granule of a pass over P's state: a block where the state is quantized (the backends then run
/// the pass's apply_granule), else 0 (its apply, a vector at a time).
template <class P>
constexpr MPOPT_HOST_DEVICE std::size_t state_granule() {
  if constexpr (quantized_in_blocks<state_storage_t<P>>) return state_storage_t<P>::block;
  else return 0;
}

}  // namespace mpopt::detail
