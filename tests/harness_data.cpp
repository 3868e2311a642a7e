#include "harness_data.hpp"

#include <cmath>
#include <stdexcept>

#include "bits.hpp"
#include "counter_hash.hpp"

namespace harness_data {

std::vector<grads_t> dataset::batch(int step, int micro) const {
  const grads_t c = common(step);
  std::vector<grads_t> b;
  b.reserve(std::size_t(micro));
  for (int j = 0; j < micro; ++j) b.push_back(with_noise(c, step, j));
  if (!exact) {
    double ss = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      for (std::size_t k = 0; k < sizes[i]; ++k) {
        double mean = 0;
        for (const auto& mb : b) mean += mb[i][k];
        mean /= micro;
        ss += mean * mean;
      }
    const double f = (step % 3 == 1 ? 3.0 : 0.4) / std::sqrt(ss);
    for (auto& mb : b)
      for (auto& t : mb)
        for (double& x : t) x *= f;
  }
  return b;
}

grads_t dataset::micro_batch(int step, int j) const {
  if (!exact) throw std::invalid_argument("micro_batch needs exact data: smooth data is normalized over the batch");
  return with_noise(common(step), step, j);
}

/// The part every micro-batch shares (exact: integers in [-127, 127]).
grads_t dataset::common(int step) const {
  grads_t g(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::uint64_t h = key(seed, std::uint64_t(step), 0xC0FFEE, i);
    g[i].resize(sizes[i]);
    for (std::size_t k = 0; k < sizes[i]; ++k)
      g[i][k] = exact ? double(int(mix(h + k) % 255) - 127) : unit(mix(h + k));
  }
  return g;
}

grads_t dataset::with_noise(const grads_t& c, int step, int j) const {
  const double grid = std::ldexp(1.0, step % 3 == 1 ? -14 : -17);
  grads_t g(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::uint64_t h = key(seed, std::uint64_t(step), std::uint64_t(j) + 1, i);
    g[i].resize(sizes[i]);
    if (exact) {
      const double f = grid * std::ldexp(1.0, -2 * int(i % 3));
      for (std::size_t k = 0; k < sizes[i]; ++k) g[i][k] = (c[i][k] + double(int(mix(h + k) % 129) - 64)) * f;
    } else {
      const double f = (i % 3 == 0) ? 1.0 : (i % 3 == 1) ? 0.3 : 0.1;
      for (std::size_t k = 0; k < sizes[i]; ++k) g[i][k] = f * (c[i][k] + 0.5 * unit(mix(h + k)));
    }
  }
  return g;
}

namespace {

// float from double rounds to nearest even; so do mpopt::half's and mpopt::bfloat16's constructors.
template <class T>
void round_each(std::span<const double> x, double scale, std::span<T> out) {
  for (std::size_t k = 0; k < out.size(); ++k) out[k] = T(x[k] * scale);
}
template <class T>
void fill_each(std::uint64_t h, std::span<T> out) {
  for (std::size_t k = 0; k < out.size(); ++k) out[k] = T(unit(mix(h + k)));
}
template <class T>
void append_each(std::vector<std::uint32_t>& out, std::span<const T> values) {
  const std::size_t at = out.size();
  out.resize(at + values.size());
  for (std::size_t k = 0; k < values.size(); ++k) out[at + k] = bits(values[k]);
}
template <class W>
std::uint64_t fnv_each(std::span<const W> words) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (const W w : words) {
    h ^= std::uint64_t(w);
    h *= 0x100000001B3ull;
  }
  return h;
}

}  // namespace

void round_scaled(std::span<const double> x, double scale, std::span<float> out) { round_each(x, scale, out); }
void round_scaled(std::span<const double> x, double scale, std::span<mpopt::half> out) { round_each(x, scale, out); }
void round_scaled(std::span<const double> x, double scale, std::span<mpopt::bfloat16> out) {
  round_each(x, scale, out);
}

void fill_uniform(std::uint64_t h, std::span<float> out) { fill_each(h, out); }
void fill_uniform(std::uint64_t h, std::span<mpopt::half> out) { fill_each(h, out); }
void fill_uniform(std::uint64_t h, std::span<mpopt::bfloat16> out) { fill_each(h, out); }

void append_bits(std::vector<std::uint32_t>& out, std::span<const float> values) { append_each(out, values); }
void append_bits(std::vector<std::uint32_t>& out, std::span<const mpopt::half> values) { append_each(out, values); }
void append_bits(std::vector<std::uint32_t>& out, std::span<const mpopt::bfloat16> values) {
  append_each(out, values);
}

std::uint64_t fnv(std::span<const std::uint32_t> words) { return fnv_each(words); }
std::uint64_t fnv(std::span<const std::uint64_t> words) { return fnv_each(words); }

}  // namespace harness_data
