// Deterministic test data from a counter: the same value for the same key on every rank, backend
// and run. Dependency-free, for the doctest suites and the standalone MPI programs alike.
#pragma once

#include <cstdint>

namespace {

/// splitmix64's finalizer: a counter-based generator, the same on every rank.
constexpr std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
/// key(a, b, c, d) = mix(key_prefix(a, b, c) ^ d): a loop over d hashes its prefix once.
constexpr std::uint64_t key_prefix(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  return mix(mix(mix(a) ^ b) ^ c);
}
constexpr std::uint64_t key(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  return mix(key_prefix(a, b, c) ^ d);
}
/// Uniform in [-1, 1).
constexpr double unit(std::uint64_t h) { return double(h >> 11) * 0x1p-52 - 1.0; }

}  // namespace
