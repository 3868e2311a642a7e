// mpopt — which averages of a compressed all-reduce a compressing rule keeps (compressing_driver.hpp):
// a bit per place of the compressed vector, clear where the average is taken as 0. Clear where the
// user's exp_avg_mask is 0, and with exclude_zero_variance where the rule's variance counts as zero
// (compression_options). The bits are made on the host, from the variance read a chunk at a time
// (cold: at the first compressed step, after a load, after 0/1 Adam's variance steps), and live
// where the backend computes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../../compression_options.hpp"
#include "../../memory_report.hpp"
#include "../config.hpp"
#include "../math/sign_compression.hpp"
#include "../passes/work_list.hpp"

namespace mpopt::detail {

template <class Backend>
class kept_averages {
  template <class T>
  using buffer = typename Backend::template buffer<T>;

 public:
  /// The bits the passes read (compressed_place::keep): null where every average is kept.
  const std::uint8_t* bits() const { return on_ ? bits_.data() : nullptr; }

  /// Buffers for `places` places and `tensors` tensors, once.
  MPOPT_COLD void allocate(std::size_t places, std::size_t tensors) {
    if (bits_.size()) return;
    bits_ = buffer<std::uint8_t>::zeroed(sign_bytes(places));
    host_.assign(sign_bytes(places), 0);
    block_.assign(chunk_elements, 0.0f);
    zero_below_.assign(tensors, 0.0);
  }
  /// The compressed vector was laid out again, with `places` places.
  MPOPT_COLD void resize(std::size_t places) {
    if (bits_.size()) {
      bits_ = buffer<std::uint8_t>::zeroed(sign_bytes(places));
      host_.assign(sign_bytes(places), 0);
    }
    ready_ = false;
  }
  /// What the bits were made from changed: the next prepare() makes them again.
  void changed() { ready_ = false; }

  /// The user's mask of tensor t (of tensors of `sizes`, in order): kept where mask[k] is not 0.
  MPOPT_COLD void set_mask(std::size_t t, std::span<const float> mask, std::span<const std::size_t> sizes,
                           std::size_t places) {
    std::size_t first = 0, elements = 0;
    for (std::size_t k = 0; k < sizes.size(); ++k) (k < t ? first : elements) += sizes[k];
    if (mask_.empty()) mask_.assign(sign_bytes(first + elements), 0xFF);
    for (std::size_t k = 0; k < mask.size(); ++k) set_bit(mask_, first + k, mask[k] != 0.0f);
    allocate(places, sizes.size());
    ready_ = false;
  }

  /// Before passes read bits(): made again if the options or anything else changed since.
  /// `variance`: the rule's state buffer (indexed by the work list's `state`); `places[t]`: tensor
  /// t's element 0 in the compressed vector.
  template <class Context>
  void prepare(Context& c, const float* variance, const compression_options& o, const std::uint64_t* places,
               std::span<const std::size_t> sizes, std::size_t place_count) {
    on_ = o.exclude_zero_variance || !mask_.empty();
    if (!on_ || (ready_ && o == made_for_)) return;
    allocate(place_count, sizes.size());
    make(c, variance, o, places, sizes);
    made_for_ = o;
    ready_ = true;
  }

  /// Lists the bits (on the device, on the host, the user's); returns the bookkeeping bytes.
  std::size_t list_memory(memory_report& r) const {
    if (bits_.size())
      r.buffers.push_back({"kept averages", "a bit per element: exp_avg_mask and zero variance (where computed, "
                           "host, yours)", bits_.size() + host_.capacity() + mask_.capacity(), true});
    return block_.capacity() * sizeof(float) + zero_below_.capacity() * sizeof(double);
  }

 private:
  static void set_bit(std::vector<std::uint8_t>& bits, std::size_t i, bool on) {
    const auto b = std::uint8_t(1u << (i % 8));
    bits[i / 8] = on ? std::uint8_t(bits[i / 8] | b) : std::uint8_t(bits[i / 8] & ~b);
  }
  static bool bit(const std::vector<std::uint8_t>& bits, std::size_t i) { return (bits[i / 8] >> (i % 8)) & 1; }

  /// The user's mask (all ones without), less the places whose variance is at most the ratio times
  /// its tensor's mean (summed in element order, in double: a first round, where the ratio asks).
  template <class Context>
  MPOPT_COLD void make(Context& c, const float* variance, const compression_options& o, const std::uint64_t* places,
                       std::span<const std::size_t> sizes) {
    std::fill(host_.begin(), host_.end(), std::uint8_t(0xFF));
    for (std::size_t t = 0, first = 0; !mask_.empty() && t < sizes.size(); first += sizes[t++])
      for (std::size_t j = 0; j < sizes[t]; ++j)
        if (!bit(mask_, first + j)) set_bit(host_, places[t] + j, false);
    const work_list& w = *c.gradients.work;
    const bool exclude = o.exclude_zero_variance;
    c.wait();
    std::fill(zero_below_.begin(), zero_below_.end(), 0.0);
    for (std::size_t ci = 0; exclude && o.zero_variance_ratio > 0 && ci < w.size(); ++ci) {
      const chunk& ch = w[ci];
      c.backend.to_host(block_.data(), variance + ch.state, ch.size);
      for (std::size_t j = 0; j < ch.size; ++j) zero_below_[ch.tensor] += block_[j];
    }
    for (std::size_t t = 0; t < sizes.size(); ++t)
      zero_below_[t] = sizes[t] ? o.zero_variance_ratio * (zero_below_[t] / double(sizes[t])) : 0.0;
    for (std::size_t ci = 0; exclude && ci < w.size(); ++ci) {
      const chunk& ch = w[ci];
      c.backend.to_host(block_.data(), variance + ch.state, ch.size);
      for (std::size_t j = 0; j < ch.size; ++j)
        if (double(block_[j]) <= zero_below_[ch.tensor]) set_bit(host_, places[ch.tensor] + ch.begin + j, false);
    }
    c.backend.to_device(bits_.data(), host_.data(), host_.size());
  }

  buffer<std::uint8_t> bits_;        ///< a bit per place, where the backend computes
  std::vector<std::uint8_t> host_;   ///< bits_, made on the host
  std::vector<std::uint8_t> mask_;   ///< the user's, a bit per element in registration order (empty: none)
  std::vector<float> block_;         ///< a chunk of the variance, read on the host
  std::vector<double> zero_below_;   ///< per tensor: the variance that counts as zero
  compression_options made_for_;     ///< the options bits_ were made for
  bool on_ = false, ready_ = false;
};

}  // namespace mpopt::detail
