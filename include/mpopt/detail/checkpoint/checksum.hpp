// mpopt — a 64-bit checksum of bytes fed in pieces: the checkpoint file's, and the hashes that
// compare settings across ranks.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "../config.hpp"

namespace mpopt::detail {

/// MurmurHash64A (Austin Appleby's public-domain hash, seed 0), fed incrementally. Each 8-byte
/// little-endian word goes through an invertible multiply-xorshift mix and is folded into the state
/// with another odd multiply, so any change confined to one word always changes the result; about
/// one multiply latency per 8 bytes keeps it well above disk speed. It detects corruption, it is not
/// a defence against deliberate tampering. The total length must be known up front (the algorithm
/// seeds with it); both the writer and the reader know it.
class checksum64 {
 public:
  explicit checksum64(std::uint64_t total_length) : h_(total_length * m) {}

  void update(std::span<const std::byte> s) {
    std::size_t i = 0;
    if (pending_ != 0) {  // complete a word left over from the previous call
      while (pending_ < 8 && i < s.size()) buf_[pending_++] = s[i++];
      if (pending_ < 8) return;
      word(load(buf_.data()));
      pending_ = 0;
    }
    for (; i + 8 <= s.size(); i += 8) word(load(s.data() + i));
    for (; i < s.size(); ++i) buf_[pending_++] = s[i];
  }

  MPOPT_DECL std::uint64_t finish() const;

  static std::string hex(std::uint64_t v) {
    std::string s(16, '0');
    for (std::size_t i = 16; i-- > 0; v >>= 4) s[i] = "0123456789abcdef"[v & 15];
    return s;
  }

 private:
  static constexpr std::uint64_t m = 0xc6a4a7935bd1e995ULL;
  static constexpr int r = 47;

  static std::uint64_t load(const std::byte* p) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    if constexpr (std::endian::native == std::endian::big) {
      std::uint64_t le = 0;
      for (int i = 0; i < 8; ++i, v >>= 8) le = (le << 8) | (v & 0xff);
      v = le;
    }
    return v;
  }

  void word(std::uint64_t k) {
    k *= m;
    k ^= k >> r;
    k *= m;
    h_ ^= k;
    h_ *= m;
  }

  std::uint64_t h_;
  std::array<std::byte, 8> buf_{};
  std::size_t pending_ = 0;
};

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "checksum.ipp"
#endif
