// mpopt — save() and load()'s data movement, whatever the element types. The optimizer's
// checkpointing (checkpoint.hpp) lists its tensors as pieces without a type (a key, which part of
// the tensor this rank holds, where, its dtype), and these functions write, check and read them
// through the collectives and copies of a checkpoint_io: compiled once, not once per optimizer type.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../error.hpp"
#include "../numeric.hpp"
#include "config.hpp"
#include "flat_layout.hpp"
#include "saved_state.hpp"
#include "state_file.hpp"

namespace mpopt::detail {

template <>
struct state_dtype<half> : dtype_name<half> {};
template <>
struct state_dtype<bfloat16> : dtype_name<bfloat16> {};

/// What saving and loading need of the optimizer's communicator and backend.
class checkpoint_io {
 public:
  virtual int rank() const = 0;
  /// In place, rank r's piece the counts[r] elements after those of ranks < r (communicator.hpp).
  virtual void all_gather(std::span<float> data, std::span<const std::size_t> counts) = 0;
  virtual void all_gather(std::span<std::uint8_t> data, std::span<const std::size_t> counts) = 0;
  /// Bytes between the backend's memory and the host's, done when it returns.
  virtual void to_host(std::byte* dst, const std::byte* src, std::size_t bytes) = 0;
  virtual void to_device(std::byte* dst, const std::byte* src, std::size_t bytes) = 0;
  /// Runs f on every rank and agrees on the outcome (agree.hpp).
  virtual void agree(std::string_view what, const std::function<void()>& f) = 0;

 protected:
  ~checkpoint_io() = default;
};

/// A typed pointer as a state file sees it: bytes of a dtype.
struct untyped {
  std::byte* data = nullptr;
  std::string_view dtype;
  std::size_t element_bytes = 0;
  bool floats = false;  ///< fp32: all-gathered as floats; anything else as bytes

  template <class T>
  static untyped of(T* p) {
    using E = std::remove_const_t<T>;
    return {reinterpret_cast<std::byte*>(const_cast<E*>(p)), state_dtype<E>::value, sizeof(E), std::is_same_v<E, float>};
  }
  /// Element i onwards.
  untyped at(std::size_t i) const { return {data + i * element_bytes, dtype, element_bytes, floats}; }
};

/// One tensor (or a run of per-tensor values) of a state file as this rank holds it. `data` is
/// null where it holds none of it (another set of experts, or before finalize()).
struct state_piece {
  std::string key;
  saved_range range;
  untyped data;
  std::vector<flat_layout::owned_range> senders;  ///< save(): the part each rank sends to the writer
};

/// One saved tensor (or a run of per-tensor values) whole, for the writer: rank r sends part
/// senders[r] of it, this rank the first of `mine`. What rank 0 holds alone is its own; anything
/// else is all-gathered (collective: every rank calls it for every tensor) in rank order: straight
/// into the tensor where the parts follow each other so (ZeRO shards), else aside, and each part
/// put in place.
MPOPT_COLD inline std::span<const std::byte> assemble(checkpoint_io& io,
                                                      const std::vector<flat_layout::owned_range>& senders,
                                                      std::span<const std::byte> mine, const untyped& type,
                                                      std::vector<std::byte>& whole, std::vector<std::byte>& aside) {
  std::size_t elements = 0;
  bool others = false;
  for (std::size_t r = 0; r < senders.size(); ++r) {
    elements = std::max(elements, senders[r].first + senders[r].count);
    others = others || (r != 0 && senders[r].count);
  }
  if (!others) return mine;  // the writer's own (empty elsewhere)
  const std::size_t size = type.element_bytes, words = type.floats ? 1 : size;  // per element
  const auto me = std::size_t(io.rank());
  std::vector<std::size_t> counts;
  std::size_t at = 0, my_offset = 0;
  bool in_place = true;  // the parts follow each other in rank order: gathered, they are the tensor
  for (std::size_t r = 0; r < senders.size(); ++r) {
    if (r == me) my_offset = at;
    in_place = in_place && (senders[r].count == 0 || senders[r].first == at);
    counts.push_back(senders[r].count * words);
    at += senders[r].count;
  }
  in_place = in_place && at == elements;
  std::vector<std::byte>& into = in_place ? whole : aside;
  into.resize(at * size);
  const auto sent = mine.first(senders[me].count * size);  // replicas: one sends
  std::copy(sent.begin(), sent.end(), into.begin() + std::ptrdiff_t(my_offset * size));
  if (type.floats) io.all_gather(std::span<float>(reinterpret_cast<float*>(into.data()), at), counts);
  else io.all_gather(std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(into.data()), at * size), counts);
  if (in_place) return {whole.data(), elements * size};
  whole.assign(elements * size, std::byte{0});
  for (std::size_t r = 0, from = 0; r < senders.size(); from += senders[r++].count)
    std::copy_n(aside.begin() + std::ptrdiff_t(from * size), senders[r].count * size,
                whole.begin() + std::ptrdiff_t(senders[r].first * size));
  return {whole.data(), elements * size};
}

/// save()'s writing (collective): rank 0 writes the file of `metadata()`, the pieces in order (each
/// gathered whole as it comes) and then `extras`, which write_extras(write) writes after them. Every
/// rank takes part in every gather, even after rank 0 failed to write: no rank leaves a collective
/// alone. The failure is agreed on at the end.
MPOPT_COLD inline void write_state(
    checkpoint_io& io, const std::filesystem::path& path, const std::function<nlohmann::json()>& metadata,
    std::span<const state_piece> pieces, std::vector<state_stream::tensor> extras,
    const std::function<void(const std::function<void(std::span<const std::byte>)>&)>& write_extras) {
  const bool writer = io.rank() == 0;
  std::optional<state_stream> out;
  io.agree("save", [&] {
    if (!writer) return;
    std::vector<state_stream::tensor> header;
    for (const auto& p : pieces)  // a run of per-tensor values is one tensor of the file
      if (!p.range.run || p.range.first == 0) header.push_back({p.key, std::string(p.data.dtype), p.range.file_shape()});
    for (auto& e : extras) header.push_back(std::move(e));
    out.emplace(path, metadata(), std::move(header));
  });
  std::optional<error> failed;
  const std::function<void(std::span<const std::byte>)> write = [&](std::span<const std::byte> bytes) {
    if (!writer || failed) return;
    try {
      out->append(bytes);
    } catch (const error& e) {
      failed = e;
    }
  };
  std::vector<std::byte> copied, whole, aside, runs;  // a tensor brought to the host; gathered; runs so far
  for (const auto& p : pieces) {
    const saved_range& r = p.range;
    const std::byte* data = p.data.data;
    const std::size_t bytes = data ? r.count * p.data.element_bytes : 0;
    if (data && r.on_device) {
      copied.resize(bytes);
      io.to_host(copied.data(), data, bytes);
      data = copied.data();
    }
    const auto gathered = assemble(io, p.senders, {data, bytes}, p.data, whole, aside);
    if (!r.run) {
      write(gathered);
      continue;
    }
    if (r.first == 0) runs.clear();
    runs.insert(runs.end(), gathered.begin(), gathered.end());
    if (r.first + r.count == r.elements) write(runs);
  }
  write_extras(write);
  io.agree("save", [&] {
    if (failed) throw *failed;
    if (writer) out->finish();
  });
}

/// Refuses a file that lacks one of my pieces or holds it in another dtype or shape. Rank
/// `replica`'s copies of parameters and state are read (replica_key), per-tensor values by position.
MPOPT_COLD inline void check_saved_pieces(const state_reader& r, std::span<const state_piece> pieces, int replica,
                                          const std::string& where) {
  for (const auto& p : pieces)
    check_saved_tensor(r, p.range.kept_at ? p.key : replica_key(replica, p.key), p.data.dtype, p.range, where);
}

/// Reads elements [first, first + count) of tensor `key` into `to`, in the backend's memory where
/// `on_device` (through `staged`, host memory).
MPOPT_COLD inline void read_piece(const state_reader& file, checkpoint_io& io, const std::string& key,
                                  std::size_t first, const untyped& to, std::size_t count, bool on_device,
                                  std::vector<std::byte>& staged) {
  const std::size_t bytes = count * to.element_bytes;
  if (!on_device) return file.read(key, to.dtype, to.element_bytes, first, {to.data, bytes});
  staged.resize(bytes);
  file.read(key, to.dtype, to.element_bytes, first, {staged.data(), bytes});
  io.to_device(to.data, staged.data(), bytes);
}

/// load()'s reading: every piece of mine from the file (checked by check_saved_pieces).
MPOPT_COLD inline void read_state(const state_reader& file, checkpoint_io& io, std::span<const state_piece> pieces,
                                  int replica, std::vector<std::byte>& staged) {
  for (const auto& p : pieces) {
    const saved_range& r = p.range;
    if (!r.kept_at) {
      read_piece(file, io, replica_key(replica, p.key), r.first, p.data, r.count, r.on_device, staged);
      continue;
    }
    for (std::size_t t = 0; t < r.count; ++t) read_piece(file, io, p.key, (*r.kept_at)[t], p.data.at(t), 1, false, staged);
  }
}

}  // namespace mpopt::detail
