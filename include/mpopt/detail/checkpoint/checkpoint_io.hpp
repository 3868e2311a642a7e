// mpopt — save() and load()'s data movement, whatever the element types. The optimizer's
// checkpointing (checkpoint.hpp) lists its tensors as pieces without a type (a key, which part of
// the tensor this rank holds, where, its dtype), and these functions write, check and read them
// through the collectives and copies of a checkpoint_io: compiled once, not once per optimizer type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../numeric.hpp"
#include "checkpoint_subject.hpp"
#include "../config.hpp"
#include "../exchange/flat_layout.hpp"
#include "saved_state.hpp"
#include "state_file.hpp"

namespace mpopt::detail {

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
MPOPT_DECL std::span<const std::byte> assemble(checkpoint_io& io,
                                               const std::vector<flat_layout::owned_range>& senders,
                                               std::span<const std::byte> mine, const untyped& type,
                                               std::vector<std::byte>& whole, std::vector<std::byte>& aside);

/// save()'s writing (collective): rank 0 writes the file of `metadata()` (the other ranks' buffers,
/// where the target is one, are emptied), the pieces in order (each
/// gathered whole as it comes) and then `extras`, which write_extras(write) writes after them. Every
/// rank takes part in every gather, even after rank 0 failed to write: no rank leaves a collective
/// alone. The failure is agreed on at the end.
MPOPT_DECL void write_state(
    checkpoint_io& io, const state_target& target, const std::function<nlohmann::json()>& metadata,
    std::span<const state_piece> pieces, std::vector<state_stream::tensor> extras,
    const std::function<void(const std::function<void(std::span<const std::byte>)>&)>& write_extras);

/// Refuses a file that lacks one of my pieces or holds it in another dtype or shape. Rank
/// `replica`'s copies of parameters and state are read (replica_key), per-tensor values by position.
MPOPT_DECL void check_saved_pieces(const state_reader& r, std::span<const state_piece> pieces, int replica,
                                   const std::string& where);

/// Reads elements [first, first + count) of tensor `key` into `to`, in the backend's memory where
/// `on_device` (through `staged`, host memory).
MPOPT_DECL void read_piece(const state_reader& file, checkpoint_io& io, const std::string& key,
                           std::size_t first, const untyped& to, std::size_t count, bool on_device,
                           std::vector<std::byte>& staged);

/// load()'s reading: every piece of mine from the file (checked by check_saved_pieces) that has data.
MPOPT_DECL void read_state(const state_reader& file, checkpoint_io& io, std::span<const state_piece> pieces,
                           int replica, std::vector<std::byte>& staged);

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "checkpoint_io.ipp"
#endif
