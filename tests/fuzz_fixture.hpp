// The optimizers fuzz_load.cpp loads files into and fuzz_seeds.cpp saves its seed files from: one
// definition for both, so every seed loads and the fuzzer's mutations of it reach every check.
#pragma once

#include <mpopt/mpopt.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace fuzz {

// fp16 with a dynamic loss scale and Adam: the most state besides the tensors (scaler, counters).
using adam_opt = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam>;
// bf16 LAMB under zero1: BF16 tensors, lamb_coeffs, a scaler with no state, a sharded read.
using lamb_opt = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::zero1, mpopt::lamb>;
// 1-bit LAMB with a static scale: the compression metadata and the extra per-tensor state.
using onebit_opt = mpopt::optimizer<mpopt::fp16, mpopt::static_scale, mpopt::replicated, mpopt::onebit_lamb>;

template <class Opt>
typename Opt::scaler_options scaler_options() {
  using S = typename Opt::scaler_options;
  if constexpr (std::is_same_v<S, mpopt::dynamic_scale_options>)
    return {.init_scale = 1024, .window = 3, .min_scale = 1, .hysteresis = 2};  // doubles and halves within a few steps
  else if constexpr (std::is_same_v<S, mpopt::static_scale_options>)
    return {.scale = 256};
  else
    return {};
}

template <class Opt>
typename Opt::group_options group_options(std::size_t g) {
  typename Opt::group_options o;
  o.lr = g == 0 ? 2e-2 : 1e-2;
  o.weight_decay = g == 0 ? 0.01 : 0.0;
  if constexpr (std::is_same_v<typename Opt::rule, mpopt::onebit_lamb>) o.freeze_step = 2;  // compression from step 3
  return o;
}

/// Tensors the user owns, in two groups, with their optimizer. Sizes straddle SIMD widths; one
/// tensor has a 2-d shape (stored in the file), the others none.
template <class Opt>
struct model {
  using P = typename Opt::param_type;
  using G = typename Opt::grad_type;
  static constexpr std::array<std::size_t, 3> sizes{13, 5, 9};
  static constexpr std::array<const char*, 3> names{"embed.weight", "embed.bias", "head.weight"};

  std::array<std::vector<P>, 3> params;
  std::array<std::vector<G>, 3> grads;
  Opt opt;
  std::uint64_t steps = 0;  // step() calls: drives the synthetic gradients

  model() : opt({}, scaler_options<Opt>()) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      params[k].assign(sizes[k], P(0.0f));
      grads[k].assign(sizes[k], G(0.0f));
      for (std::size_t i = 0; i < sizes[k]; ++i) params[k][i] = P(0.25f * std::sin(1.3f * float(i) + float(k)));
    }
    auto& embed = opt.add_group(group_options<Opt>(0));
    embed.add(params[0], grads[0], names[0]);
    embed.add(params[1], grads[1], names[1]);
    opt.add_group(group_options<Opt>(1)).add(params[2], grads[2], names[2], {3, 3});
  }
  model(const model&) = delete;
  model& operator=(const model&) = delete;

  /// One optimizer step; `overflow` puts an inf into a gradient, so the step is skipped.
  mpopt::step_status step(bool overflow = false) {
    const float scale = float(opt.loss_scale()), t = float(steps++);
    for (std::size_t k = 0; k < grads.size(); ++k)
      for (std::size_t i = 0; i < grads[k].size(); ++i)
        grads[k][i] = G(0.05f * std::sin(0.7f * float(i) + 1.1f * float(k) + 0.9f * t) * scale);
    if (overflow) grads[1][2] = G(std::numeric_limits<float>::infinity());
    return opt.step();
  }
};

/// A state file split into its JSON header text and data section (state_file.hpp's layout), or
/// nothing when the 8-byte length does not fit the bytes.
struct file_parts {
  std::string_view header;
  std::span<const std::uint8_t> data;
};
inline std::optional<file_parts> split(std::span<const std::uint8_t> file) {
  if (file.size() < 8) return std::nullopt;
  std::uint64_t n = 0;
  for (std::size_t i = 8; i-- > 0;) n = (n << 8) | file[i];
  if (n > file.size() - 8) return std::nullopt;
  const auto* text = reinterpret_cast<const char*>(file.data() + 8);
  return file_parts{{text, std::size_t(n)}, file.subspan(8 + std::size_t(n))};
}

/// The checksum the reader expects for this "mpopt" string and data section: the library's own.
inline std::string checksum(std::string_view mpopt_text, std::span<const std::uint8_t> data) {
  mpopt::detail::checksum64 sum(mpopt_text.size() + data.size());
  sum.update(std::as_bytes(std::span(mpopt_text)));
  sum.update(std::as_bytes(data));
  return mpopt::detail::checksum64::hex(sum.finish());
}

/// `file` with its "mpopt" metadata replaced by `text` and the checksum to match, written as save()
/// writes a header; nothing when `file` has no header with __metadata__ to rewrite.
inline std::optional<std::vector<std::uint8_t>> with_metadata(std::span<const std::uint8_t> file, const std::string& text) {
  const auto parts = split(file);
  if (!parts) return std::nullopt;
  // nlohmann::json, as save() writes it: keys in name order, data_offsets unchanged.
  auto header = nlohmann::json::parse(parts->header.begin(), parts->header.end(), nullptr, false);
  if (!header.is_object() || !header.contains("__metadata__") || !header["__metadata__"].is_object()) return std::nullopt;
  header["__metadata__"]["mpopt"] = text;
  header["__metadata__"]["checksum"] = checksum(text, parts->data);
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data section stays 8-byte aligned
  std::vector<std::uint8_t> out(8);
  for (std::size_t i = 0, n = json.size(); i < 8; ++i, n >>= 8) out[i] = std::uint8_t(n & 0xff);
  out.insert(out.end(), json.begin(), json.end());
  out.insert(out.end(), parts->data.begin(), parts->data.end());
  return out;
}

}  // namespace fuzz
