// mpopt — the choices the compressing rules (1-bit Adam, 0/1 Adam, 1-bit LAMB) share about their
// 1-bit compressed all-reduce; each rule's options hold them as `compression`.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <array>
#include <cstdint>
#include <string_view>

#include "fields.hpp"

namespace mpopt {

/// Which elements share a compression scale (each element travels as ±its scale).
enum class compression_scale : std::uint8_t {
  /// Each tensor has its own at every worker, and its own piece of every server's chunk: a tensor
  /// whose values are small is not sent as ±the scale of large ones (DeepSpeed compresses each
  /// tensor apart).
  per_tensor,
  /// One per worker over every tensor, one per server chunk: the fewest scales.
  global,
};

constexpr std::array<std::string_view, 2> choice_names(compression_scale) { return {"per_tensor", "global"}; }
constexpr std::string_view compression_scale_name(compression_scale s) { return choice_names(s)[std::size_t(s)]; }

/// Per parameter group, the same in every group (the compressed vector holds them all).
struct compression_options {
  /// Elements whose variance is zero when compression starts (0/1 Adam: at each variance step)
  /// keep an average of zero, as an exp_avg_mask would: a 1-bit code cannot carry the zero their
  /// gradient is, and a variance of zero (or nearly) divides what it carries instead into a step
  /// of lr s / eps.
  bool exclude_zero_variance = true;
  /// What counts as zero: a variance at most this fraction of its tensor's mean variance (0: only
  /// exactly zero). At 1e-3 such an element's gradient is about 3% of its tensor's, or less.
  double zero_variance_ratio = 1e-3;
  compression_scale scale = compression_scale::per_tensor;

  bool operator==(const compression_options&) const = default;

  static constexpr auto fields = mpopt::fields(
      field{"exclude_zero_variance", &compression_options::exclude_zero_variance},
      field{"zero_variance_ratio", &compression_options::zero_variance_ratio, checks::half_open(0, 1)},
      field{"scale", &compression_options::scale});
};

}  // namespace mpopt
