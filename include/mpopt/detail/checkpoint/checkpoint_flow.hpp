// mpopt — save() and load() from first check to last assignment, whatever the optimizer's types.
// The optimizer hands itself over as a checkpoint_subject: its tensors without their types (a
// checkpoint_view), and behind virtual calls the few parts that have types (the rule's options,
// the scaler, the driver's state, the counters). So this is compiled once per program, not once
// per optimizer type (checkpoint.hpp has the typed side).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../options.hpp"
#include "checkpoint_io.hpp"
#include "checkpoint_pieces.hpp"
#include "checkpoint_subject.hpp"
#include "../config.hpp"
#include "../comm/same_settings.hpp"
#include "saved_state.hpp"
#include "state_conversion.hpp"
#include "state_file.hpp"
#include "../step/step_counts.hpp"

namespace mpopt::detail {

/// What load() takes from a file besides the tensors and their typed parts (which the subject keeps
/// until restore()).
struct saved_header : saved_counts {
  std::vector<std::uint64_t> group_steps;
  found_tensors found;  ///< where my tensors are among the file's
  int replica = 0;      ///< the rank whose copy this rank reads (replicas_differ), else 0
  saved_storage storage;  ///< how the file stores state and masters
};

/// Policies, scaler, counters and group layout: the metadata of a saved state.
MPOPT_DECL nlohmann::json describe(checkpoint_subject& s, const checkpoint_view& v);

/// Checks a state file against the subject (policies, groups, tensor names, sizes, dtypes) and
/// parses its header into it, changing nothing the optimizer steps with.
MPOPT_DECL saved_header check_saved(checkpoint_subject& s, const state_reader& r, const std::string& where,
                                    const load_options& lo);

/// Ranks that read different files would train apart: what each read must agree, before anything
/// changes. The group count first, as it decides the length of the rest.
MPOPT_DECL void check_same_checkpoint(checkpoint_subject& s, const saved_header& h);

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "checkpoint_flow.ipp"
#endif
