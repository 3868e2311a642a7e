// mpopt — state_conversion's definitions (state_conversion.hpp): inline header-only, else compiled
// once by <mpopt/src.hpp>.
#pragma once

#include "state_conversion.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "../lanes/float_bits.hpp"
#include "../math/blockwise_quantization.hpp"
#include "../math/remainder16.hpp"
#include "saved_state.hpp"

namespace mpopt::detail {

/// Evaluated at run time (`nonnegative` is not a constant), so that a unit including this does not
/// evaluate the maps; they are the maps' values (state_precision test: a state decoded into fp32 is
/// what the quantized optimizer reads back). Once per buffer of a load, not once per tensor.
MPOPT_DECL std::vector<float> code_values(const state_format& f, bool nonnegative) {
  auto floats = [](const auto& v) { return std::vector<float>(v.begin(), v.end()); };
  if (f.name == "fp8") return floats(e4m3_values);
  if (f.bits == 8) return floats(dynamic_values<256>(!nonnegative));
  return nonnegative ? floats(linear_values<16>()) : floats(dynamic_values<16>(!nonnegative));
}

MPOPT_DECL void decode_stored(const state_format& f, const float* values, const std::byte* data, const float* scales,
                              std::span<float> out) {
  if (f.dtype == "F32") {
    std::memcpy(out.data(), data, out.size_bytes());
  } else if (f.dtype == "BF16") {
    for (std::size_t j = 0; j < out.size(); ++j) {
      std::uint16_t b;
      std::memcpy(&b, data + 2 * j, 2);
      out[j] = bfloat16_bits_to_float(b);
    }
  } else {
    const auto* codes = reinterpret_cast<const std::uint8_t*>(data);
    for (std::size_t j = 0; j < out.size(); ++j) {
      const std::uint32_t c = f.bits == 8 ? codes[j] : (codes[j / 2] >> (4 * (j % 2))) & 0xFu;
      out[j] = values[c] * scales[j / f.block];
    }
  }
}

/// `bytes` into `to`: host memory, or the backend's where on_device.
MPOPT_DECL void put_bytes(checkpoint_io& io, std::byte* to, std::span<const std::byte> bytes, bool on_device) {
  if (bytes.empty()) return;
  if (on_device) io.to_device(to, bytes.data(), bytes.size());
  else std::memcpy(to, bytes.data(), bytes.size());
}

/// Elements [first, first + out.size()) of buffer `key` of tensor `name`, stored in the file as f
/// (first at the start of a block), as fp32 (`values`: its codes' values, where f quantizes).
MPOPT_DECL void read_stored(const state_reader& file, const std::string& key, const std::string& name, int replica,
                            const state_format& f, const float* values, std::size_t first, std::span<float> out) {
  const std::size_t n = out.size();
  std::vector<std::byte> data((n * f.bits + 7) / 8);
  // Codes are read as bytes (4-bit: two a byte; `first` starts a block, so a byte), values as elements.
  const std::size_t entry_bytes = f.block ? 1 : f.bits / 8, first_entry = f.block ? first * f.bits / 8 : first;
  file.read(replica_key(replica, key + "/" + name), f.dtype, entry_bytes, first_entry, data);
  std::vector<float> scales;
  if (f.block) {
    scales.resize((n + f.block - 1) / f.block);
    file.read(replica_key(replica, key + "_scale/" + name), "F32", 4, first / f.block,
              std::as_writable_bytes(std::span(scales)));
  }
  decode_stored(f, values, data.data(), scales.data(), out);
}

MPOPT_DECL void read_converted_state(const state_reader& file, checkpoint_subject& s, const checkpoint_view& v,
                                     const state_format& from, int replica) {
  const state_format& to = v.state_storage;
  std::vector<std::vector<float>> tables;  // each buffer's code values, where the file quantizes
  for (const auto& buffer : v.state) tables.push_back(from.block ? code_values(from, buffer.nonnegative) : std::vector<float>());
  std::vector<float> values, scales;
  std::vector<std::byte> stored;
  std::size_t t = 0;
  for (const auto& g : v.groups) {
    const std::vector<checkpoint_view::state_buffer> state = v.group_state(g);
    for (const auto& e : g.tensors) {
      const auto o = v.layout->owned(t++);
      if (!o.count) continue;
      // The file's blocks around this rank's elements (its own blocks start at o.first).
      const std::size_t b = from.block ? from.block : 1;
      const std::size_t first = o.first / b * b, end = std::min(e.size, (o.first + o.count + b - 1) / b * b);
      values.resize(end - first);
      stored.resize((o.count * to.bits + 7) / 8);
      scales.resize(to.block ? (o.count + to.block - 1) / to.block : 0);
      for (std::size_t k = 0; k < state.size(); ++k) {
        const auto& buffer = state[k];
        read_stored(file, buffer.key, *e.name, replica, from, tables[k].data(), first, values);
        s.encode_state(k, std::span<const float>(values).subspan(o.first - first, o.count), stored.data(), scales.data());
        const std::size_t at = o.state - buffer.shift;
        put_bytes(s, buffer.data.data + at * to.bits / 8, stored, v.state_on_device);
        if (to.block)
          put_bytes(s, buffer.scales.data + at / to.block * sizeof(float), std::as_bytes(std::span(scales)),
                    v.state_on_device);
      }
    }
  }
}

/// Elements [first, first + out.size()) of tensor e's masters, kept in the file as `from`.
MPOPT_DECL void read_masters(const state_reader& file, const master_format& from, const checkpoint_view::tensor& e,
                             int replica, std::size_t first, std::span<float> out) {
  const std::string& name = *e.name;
  if (from.name == "fp32")
    return file.read(replica_key(replica, std::string(from.key) + "/" + name), "F32", 4, first, std::as_writable_bytes(out));
  std::vector<std::uint16_t> params(out.size());
  file.read(replica_key(replica, "param/" + name), e.param.dtype, 2, first, std::as_writable_bytes(std::span(params)));
  if (from.name == "remainder16") {
    std::vector<std::int16_t> remainders(out.size());
    file.read(replica_key(replica, std::string(from.key) + "/" + name), from.dtype, 2, first,
              std::as_writable_bytes(std::span(remainders)));
    for (std::size_t j = 0; j < out.size(); ++j) out[j] = join_master(params[j], remainders[j]);
  } else {  // none: the parameter
    const bool bf16 = e.param.dtype == "BF16";
    for (std::size_t j = 0; j < out.size(); ++j)
      out[j] = bf16 ? bfloat16_bits_to_float(params[j]) : half_bits_to_float(params[j]);
  }
}

MPOPT_DECL void read_converted_master(const state_reader& file, checkpoint_io& io, const checkpoint_view& v,
                                      const master_format& from, int replica) {
  if (!v.has_master) return;  // none: the parameter, read whole, is the master
  const bool remainders = v.master_storage.name == "remainder16";
  std::vector<float> masters;
  std::vector<std::uint16_t> params;
  std::vector<std::int16_t> kept;
  std::size_t t = 0;
  for (const auto& g : v.groups)
    for (const auto& e : g.tensors) {
      const auto o = v.layout->owned(t++);
      std::byte* mine = v.master.data + o.state * v.master_storage.element_bytes;
      if (!remainders) {
        masters.resize(o.count);
        read_masters(file, from, e, replica, o.first, masters);
        put_bytes(io, mine, std::as_bytes(std::span(masters)), v.state_on_device);
        continue;
      }
      // Every rank rounds the whole parameter, so that the replicas agree.
      masters.resize(e.size);
      read_masters(file, from, e, replica, 0, masters);
      params.resize(e.size);
      kept.resize(o.count);
      for (std::size_t j = 0; j < e.size; ++j) {
        const remainder_split split = split_master(masters[j]);
        params[j] = split.param;
        if (j >= o.first && j - o.first < o.count) kept[j - o.first] = split.remainder;
      }
      put_bytes(io, e.param.data, std::as_bytes(std::span(params)), v.tensors_on_device);
      put_bytes(io, mine, std::as_bytes(std::span(kept)), v.state_on_device);
    }
}

}  // namespace mpopt::detail
