// mpopt — what checkpoints write and read besides the tensors' bytes, and does not depend on the
// optimizer's policies: the metadata's fields and their checks, which part of a tensor a rank
// holds, the file's keys. Compiled once, not once per optimizer type (checkpoint.hpp has the rest).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../options.hpp"
#include "../../tensor_spec.hpp"
#include "checkpoint_subject.hpp"
#include "../config.hpp"
#include "../comm/same_settings.hpp"
#include "../step/spike_guard.hpp"
#include "state_file.hpp"
#include "state_format.hpp"
#include "../step/step_counts.hpp"

namespace mpopt::detail {

/// Where the file holds rank r's copy of a parameter's tensor: rank 0's under its name, the
/// others' (replicas_differ) under "rank/<r>/" and the name.
MPOPT_DECL std::string replica_key(int r, const std::string& key);

/// Which part of a saved tensor a pointer holds: elements [first, first + count) of `elements`.
struct saved_range {
  std::size_t tensor, elements, first, count;
  bool sharded = false;    ///< a shard's part: the other parts are on other ranks
  bool on_device = false;  ///< in device memory (tensors and state where the backend keeps them; not per-tensor scalars)
  /// A parameter's tensor (param, master, rule state): its registered shape, null when none was
  /// given. Null for anything else (per-tensor values), which the file holds as [elements].
  const tensor_shape* shape = nullptr;
  /// Per-tensor values on load: where each of mine is among the file's (count of them).
  const std::vector<std::size_t>* kept_at = nullptr;
  /// Per-tensor values on save, a set at a time: [first, first + count) of the key's elements.
  bool run = false;

  /// The shape save() writes: the registered one, else [elements].
  std::vector<std::int64_t> file_shape() const {
    if (shape && !shape->empty()) return {shape->dims().begin(), shape->dims().end()};
    return {std::int64_t(elements)};
  }
  /// Whether load() takes a file's shape for this tensor. A parameter's tensor may have any shape
  /// of `elements` elements, with two exceptions: where both the file and the registration have
  /// a shape of other than one dimension, they must be the same; [elements] (what a file saved
  /// without shapes holds) always fits. Anything else: exactly [elements].
  MPOPT_DECL bool fits(const std::vector<std::int64_t>& s) const;
  MPOPT_DECL std::string expected_shape() const;
};

/// Refuses a file whose tensor `key` is missing, or not of `dtype` and a shape that fits `range`.
MPOPT_DECL void check_saved_tensor(const state_reader& r, const std::string& key, std::string_view dtype,
                                   const saved_range& range, const std::string& where);

/// One group's tensors in the metadata: names and sizes in file order.
MPOPT_DECL void add_saved_tensor(nlohmann::json& tensors, const std::string& name, std::size_t size);
/// One group in the metadata.
MPOPT_DECL nlohmann::json saved_group(nlohmann::json options, std::uint64_t step, nlohmann::json tensors);

/// The metadata of a saved state: policies, scaler, counters and groups; `extra`: what the rule's
/// driver adds. `rounding_seed` where the precision rounds stochastically, `replicas` where every
/// rank's copy is saved (0: rank 0's alone), `guard` where the spike guard is on (null: off).
MPOPT_DECL nlohmann::json state_metadata(const saved_policies& p, nlohmann::json scaler,
                                         const step_counts& counts, nlohmann::json groups,
                                         std::optional<std::uint64_t> rounding_seed, int replicas,
                                         nlohmann::json guard, const nlohmann::json& extra);

/// Refuses a file saved with another precision, loss scaler or rule than `mine` (a describe()d
/// metadata); returns the storages of its state and master.
MPOPT_DECL saved_storage check_saved_policies(const nlohmann::json& meta, const nlohmann::json& mine,
                                              const std::string& where);

/// An expert group's tensors among those a file holds of it (`saved`: names and sizes, every
/// expert of the run that saved it): each of mine (name, size) is there with its size, and kept_at
/// gets its position (the group's start at `first`). That the sets of experts together hold them
/// all is checked across ranks (the optimizer's check_same_checkpoint).
MPOPT_DECL void find_experts(std::span<const std::pair<std::string, std::size_t>> mine,
                             const nlohmann::json& saved, std::size_t first, std::vector<std::size_t>& kept_at,
                             const std::string& where);

/// The spike guard's windows as the metadata holds them.
MPOPT_DECL nlohmann::json guard_json(const spike_guard::saved& s);

/// A file's spike-guard windows, checked: arrays of finite numbers, none longer than a window.
MPOPT_DECL spike_guard::saved read_saved_guard(const nlohmann::json& j, const std::string& where);

/// The metadata's learning-rate schedule (null where none) and each group's base rate.
MPOPT_DECL void add_saved_schedule(nlohmann::json& meta, const saved_schedule& s);

/// A file's schedule and base rates, checked; none from a file written before schedules were saved.
MPOPT_DECL std::optional<saved_schedule> read_saved_schedule(const nlohmann::json& meta);

MPOPT_DECL saved_counts read_saved_counts(const nlohmann::json& meta, const std::string& where);

/// The rank whose copy of the parameters and state this rank reads: where every rank's copy was
/// saved ("replicas", the rule steps each rank on its own between synchronisations) and the world
/// size is the same, its own; else rank 0's, which a different world size takes only when asked to.
MPOPT_DECL int saved_replica(const nlohmann::json& meta, const load_options& lo, int rank, int world,
                             std::string_view rule, const std::string& where);

inline constexpr std::string_view same_checkpoint_advice = "Every rank must load the same checkpoint";

/// What every rank must have read alike of a checkpoint (ranks that read different files would
/// train apart): its counters, its scaler (`scaler`: as JSON text), each group's ("step N, options")
/// and its schedule.
MPOPT_DECL std::vector<setting> loaded_settings(const saved_counts& c, std::string scaler,
                                                std::span<const std::string> groups);

/// Refuses a load that would drop tensors: `held`, per group, how many of the file's tensors
/// (`in_file`) the ranks together hold.
MPOPT_DECL void check_groups_held(std::span<const std::uint64_t> held, std::span<const std::uint64_t> in_file);

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "saved_state.ipp"
#endif
