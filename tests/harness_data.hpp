// The test harnesses' data work, compiled once and optimized (harness_data.cpp): the multi-rank
// suites' batches, rounding them into tensors, and reading state back as bits. These loops are most
// of a multi-rank run's time when the suites themselves build at -Og, and none depends on an
// optimizer type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <mpopt/numeric.hpp>

namespace harness_data {

using grads_t = std::vector<std::vector<double>>;  // true gradient, per tensor

/// The global batch of every step, as micro-batches: micro-batch j = rank * A + a is the a-th
/// micro-step of rank `rank` (A micro-steps per rank and boundary). The same on every rank.
///  - smooth: g_j = tensor_factor * (common + 0.5 * noise_j), rescaled so that the mean over the
///    micro-batches has global L2 norm 3 (steps 1, 4, 7, ...: clipping at 1 binds) or 0.4.
///  - exact: g_j = (common + noise_j) * 2^-e with integers common in [-127, 127], noise_j in
///    [-64, 64] and e in 14..21 fixed per step and tensor: 8 significant bits, exact in bf16, and in
///    fp16 times any power-of-two loss scale from 1 to 2^13 (fp16's subnormal grid is 2^-24); every
///    float sum of up to 8 of them is exact (below 2^-3 on a grid of 2^-21: 18 bits), so the
///    summation order across ranks cannot matter.
struct dataset {
  std::uint64_t seed;
  std::vector<std::size_t> sizes;
  bool exact = false;

  std::vector<grads_t> batch(int step, int micro) const;
  /// Micro-batch j alone; exact data only (smooth data is normalized over the whole batch), else
  /// std::invalid_argument.
  grads_t micro_batch(int step, int j) const;

 private:
  grads_t common(int step) const;
  /// Micro-batch j: the common part `c` with its own noise.
  grads_t with_noise(const grads_t& c, int step, int j) const;
};

/// out[k] = x[k] * scale, rounded to nearest even: a backward's gradient at the loss scale.
void round_scaled(std::span<const double> x, double scale, std::span<float> out);
void round_scaled(std::span<const double> x, double scale, std::span<mpopt::half> out);
void round_scaled(std::span<const double> x, double scale, std::span<mpopt::bfloat16> out);

/// out[k] = uniform(-1, 1) from counter h + k (counter_hash.hpp), rounded: initial parameters.
void fill_uniform(std::uint64_t h, std::span<float> out);
void fill_uniform(std::uint64_t h, std::span<mpopt::half> out);
void fill_uniform(std::uint64_t h, std::span<mpopt::bfloat16> out);

/// Appends the bits of every value (snapshots compare every bit of optimizer state).
void append_bits(std::vector<std::uint32_t>& out, std::span<const float> values);
void append_bits(std::vector<std::uint32_t>& out, std::span<const mpopt::half> values);
void append_bits(std::vector<std::uint32_t>& out, std::span<const mpopt::bfloat16> values);

/// FNV-1a over words: a digest of state that ranks compare.
std::uint64_t fnv(std::span<const std::uint32_t> words);
std::uint64_t fnv(std::span<const std::uint64_t> words);

}  // namespace harness_data
