// mpopt — the state storages (state_precision.hpp) as checkpoints record them, by name: how a file
// holds the rule's state buffers and the master under each. Untyped, so that load() can read a file
// of any storage into an optimizer of any other (state_conversion.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace mpopt::detail {

/// How a state storage lays out one buffer in a file: its values (or codes) as `dtype`, `bits` an
/// element; where quantized in blocks, one fp32 scale per `block` elements under "<key>_scale".
struct state_format {
  std::string_view name;
  std::string_view dtype;
  std::size_t bits = 32;
  std::size_t block = 0;  ///< 0: no scales
  friend constexpr bool operator==(const state_format&, const state_format&) = default;
};

inline constexpr std::array<state_format, 6> state_formats = {{
    {"fp32", "F32", 32, 0},
    {"bf16", "BF16", 16, 0},
    {"bf16_stochastic", "BF16", 16, 0},  // the same bits as bf16: only the rounding differs
    {"blockwise8", "U8", 8, 256},
    {"blockwise4", "U8", 4, 128},
    {"fp8", "U8", 8, 256},
}};

/// How a master storage keeps the master in a file: under `key` as `dtype` (none: the parameter
/// is the master, and nothing else is kept).
struct master_format {
  std::string_view name, key, dtype;
  std::size_t element_bytes = 0;
  friend constexpr bool operator==(const master_format&, const master_format&) = default;
};

inline constexpr std::array<master_format, 3> master_formats = {{
    {"fp32", "master", "F32", 4},
    {"remainder16", "remainder", "I16", 2},
    {"none", "", "", 0},
}};

/// The storages of a file's state and master.
struct saved_storage {
  state_format state;
  master_format master;
};

/// The format named `name` among `formats`, or null.
template <class Format, std::size_t N>
constexpr const Format* format_named(const std::array<Format, N>& formats, std::string_view name) {
  for (const Format& f : formats)
    if (f.name == name) return &f;
  return nullptr;
}

}  // namespace mpopt::detail
