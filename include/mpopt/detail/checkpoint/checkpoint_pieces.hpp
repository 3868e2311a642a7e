// mpopt — which tensors a checkpoint holds, and which part of each this rank has, whatever the
// optimizer's types: the optimizer describes its tensors and state without their types (a
// checkpoint_view), and these functions list the pieces that save() writes and load() reads, and
// the metadata's groups. Compiled once, not once per optimizer type (checkpoint.hpp has the rest).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../tensor_spec.hpp"
#include "checkpoint_io.hpp"
#include "checkpoint_subject.hpp"
#include "../config.hpp"
#include "../exchange/expert_placement.hpp"
#include "../exchange/flat_layout.hpp"
#include "saved_state.hpp"

namespace mpopt::detail {

/// `u` from element `i` on, or without data where `mine` is false (`u` may be null: before finalize()).
MPOPT_DECL untyped part_of(const untyped& u, std::size_t i, bool mine = true);

/// The pieces load() reads, in the order of this optimizer's tensors: parameters whole, masters and
/// state as far as this rank holds them, then each of the driver's per-tensor values (found in the
/// file at kept_at, each tensor's position among its file_tensors). Before finalize() the state's
/// pointers are null: enough to check a file against this optimizer without committing to a layout.
/// State or masters that `file` stores otherwise are the file's tensors, whole and without data:
/// checked, and read by conversion (state_conversion.hpp).
MPOPT_DECL std::vector<state_piece> held_pieces(const checkpoint_view& v, const std::vector<std::size_t>& kept_at,
                                                std::size_t file_tensors, const saved_storage& file);

/// The pieces save() writes, in file order: each group's tensors, and of an expert group those of
/// every set of experts, set after set (a checkpoint holds what one process holding every expert
/// would save); then the driver's per-tensor values, in the same order, a set at a time. A piece's
/// data is this rank's copy, null where it holds another set; its senders[r] is the part rank r
/// sends to the writer (assemble).
///
/// With replica r > 0: rank r's copy of each parameter, master and state tensor (replica_key), and
/// nothing else (replicas differ only where no group is sharded or of experts: replicas_differ).
MPOPT_DECL std::vector<state_piece> file_pieces(const checkpoint_view& v, int replica = 0);

/// The metadata's groups: each one's options (as JSON), applied steps and tensors (names and sizes,
/// of an expert group every set's).
MPOPT_DECL nlohmann::json saved_groups(const checkpoint_view& v, std::span<const nlohmann::json> options,
                                       std::span<const std::uint64_t> steps);

/// Where a file's tensors are mine: checks each group's tensors in the file (`saved`, its
/// metadata's groups) against mine (`described`, saved_groups'), and returns where each of my
/// tensors is among the file's (kept_at), and how many the file holds of each group.
struct found_tensors {
  std::vector<std::size_t> kept_at;
  std::vector<std::uint64_t> group_tensors;
  std::size_t file_tensors = 0;
};
MPOPT_DECL found_tensors find_saved_tensors(const checkpoint_view& v, const nlohmann::json& saved,
                                            const nlohmann::json& described, const std::string& where);

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "checkpoint_pieces.ipp"
#endif
