// mpopt — checkpoint_io's definitions (checkpoint_io.hpp): inline header-only, else compiled once by
// <mpopt/src.hpp>.
#pragma once

#include "checkpoint_io.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "../../error.hpp"

namespace mpopt::detail {

MPOPT_DECL std::span<const std::byte> assemble(checkpoint_io& io,
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

MPOPT_DECL void write_state(
    checkpoint_io& io, const state_target& target, const std::function<nlohmann::json()>& metadata,
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
    out.emplace(target, metadata(), std::move(header));
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
    else if (target.bytes) target.bytes->clear();  // rank 0's buffer holds the file
  });
}

MPOPT_DECL void check_saved_pieces(const state_reader& r, std::span<const state_piece> pieces, int replica,
                                   const std::string& where) {
  for (const auto& p : pieces)
    check_saved_tensor(r, p.range.kept_at ? p.key : replica_key(replica, p.key), p.data.dtype, p.range, where);
}

MPOPT_DECL void read_piece(const state_reader& file, checkpoint_io& io, const std::string& key,
                           std::size_t first, const untyped& to, std::size_t count, bool on_device,
                           std::vector<std::byte>& staged) {
  const std::size_t bytes = count * to.element_bytes;
  if (!on_device) return file.read(key, to.dtype, to.element_bytes, first, {to.data, bytes});
  staged.resize(bytes);
  file.read(key, to.dtype, to.element_bytes, first, {staged.data(), bytes});
  io.to_device(to.data, staged.data(), bytes);
}

MPOPT_DECL void read_state(const state_reader& file, checkpoint_io& io, std::span<const state_piece> pieces,
                           int replica, std::vector<std::byte>& staged) {
  for (const auto& p : pieces) {
    const saved_range& r = p.range;
    if (!p.data.data) continue;  // none of it here, or converted (state_conversion.hpp)
    if (!r.kept_at) {
      read_piece(file, io, replica_key(replica, p.key), r.first, p.data, r.count, r.on_device, staged);
      continue;
    }
    for (std::size_t t = 0; t < r.count; ++t) read_piece(file, io, p.key, (*r.kept_at)[t], p.data.at(t), 1, false, staged);
  }
}

}  // namespace mpopt::detail
