// mpopt — 1-bit sign compression with error feedback (1-bit Adam and LAMB), shared by every backend.
// A vector travels as one bit per element, its sign, and one scale s = ||x|| / sqrt(n): element i
// stands for +s or -s. What the code misses, x - (±s), is kept and added to the next vector sent
// (error feedback), so the errors cancel over steps instead of accumulating.
//
// Bit layout: element i is bit i % 8 of byte i / 8, least significant first, so a vector compare
// mask is the byte pattern itself. (DeepSpeed packs most significant first; the bits never leave
// the collective, so the order is ours to choose.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../config.hpp"
#include "../lanes/lanes.hpp"

namespace mpopt::detail {

/// +s where the sign bit says x >= 0 (DeepSpeed: sign(x) + 1 > 0, so 0 is positive), -s elsewhere.
template <class M, class V>
MPOPT_HOST_DEVICE V signed_scale(M positive, V s) {
  return select(positive, s, -s);
}

/// Compresses x with scale s: returns its sign (x >= 0) and leaves in x what the code misses,
/// x - (±s), the error fed back into the next round.
template <class V>
MPOPT_HOST_DEVICE auto compress_sign(V& x, V s) {
  const auto positive = nonnegative(x);
  x = x - signed_scale(positive, s);
  return positive;
}

/// Bytes holding the sign bits of n elements, plus 4 so that 16 bits starting anywhere can be read
/// as one 32-bit word.
constexpr std::size_t sign_bytes(std::size_t n) { return (n + 7) / 8 + 4; }

/// Bits of elements [i, i + 32 - i % 8) starting at bit 0 (i arbitrary): the low 16 are those of
/// elements i .. i + 15.
MPOPT_HOST_DEVICE std::uint32_t sign_bits_at(const std::uint8_t* bits, std::size_t i) {
  std::uint32_t w;
  std::memcpy(&w, bits + i / 8, sizeof w);  // little-endian hosts: byte k lands at bits 8k
  return w >> (i % 8);
}

/// A compressed vector after the all-reduce: sign bits, and per chunk of `chunk` elements (chunk r
/// was averaged by rank r; there are `chunks` of them) one scale per segment: scales[r * segments + k].
struct sign_code {
  const std::uint8_t* bits = nullptr;
  const float* scales = nullptr;
  std::size_t chunk = 1;
  std::size_t chunks = 1;
  std::size_t segments = 1;

  /// The scale of element i, of segment k (ignored without segments).
  MPOPT_HOST_DEVICE float scale_of(std::size_t k, std::size_t i) const {
    const std::size_t r = i / chunk < chunks ? i / chunk : chunks - 1;
    return scales[r * segments + (segments > 1 ? k : 0)];
  }

  /// Elements [i, i + L::width) of segment k, the lanes `tail` keeps: ±the scale of each element's
  /// chunk.
  template <class L, class Tail>
  MPOPT_HOST_DEVICE typename L::vec load(std::size_t k, std::size_t i, Tail tail) const {
    const auto positive = L::mask_of(sign_bits_at(bits, i));
    if ((i + L::width - 1) / chunk == i / chunk) return signed_scale(positive, typename L::vec(scale_of(k, i)));
    alignas(64) float lane_scale[L::width];  // the vector straddles chunks (rare): a scale per lane
    for (std::size_t j = 0; j < L::width; ++j) lane_scale[j] = scale_of(k, i + j);
    return signed_scale(positive, L::load(lane_scale, tail));
  }
};

/// x where bit i of `keep` is set, 0 elsewhere; x itself where keep is null (no mask).
template <class L, class V>
MPOPT_HOST_DEVICE V kept(const std::uint8_t* keep, std::size_t i, V x) {
  return keep ? select(L::mask_of(sign_bits_at(keep, i)), x, V(0.0f)) : x;
}

}  // namespace mpopt::detail
