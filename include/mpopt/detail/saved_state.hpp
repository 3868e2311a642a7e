// mpopt — what checkpoints write and read besides the tensors' bytes, and does not depend on the
// optimizer's policies: the metadata's fields and their checks, which part of a tensor a rank
// holds, the file's keys. Compiled once, not once per optimizer type (checkpoint.hpp has the rest).
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../error.hpp"
#include "../options.hpp"
#include "../tensor_spec.hpp"
#include "config.hpp"
#include "field_refs.hpp"
#include "json_fields.hpp"
#include "same_settings.hpp"
#include "spike_guard.hpp"
#include "state_file.hpp"
#include "step_counts.hpp"

namespace mpopt::detail {

/// Where the file holds rank r's copy of a parameter's tensor: rank 0's under its name, the
/// others' (replicas_differ) under "rank/<r>/" and the name.
MPOPT_COLD inline std::string replica_key(int r, const std::string& key) {
  return r == 0 ? key : "rank/" + std::to_string(r) + "/" + key;
}

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
  bool fits(const std::vector<std::int64_t>& s) const {
    const std::vector<std::int64_t> flat{std::int64_t(elements)};
    if (s == flat) return true;
    if (!shape) return false;
    std::uint64_t n = 0;
    if (!state_tensor_bytes(s, 1, n) || n != elements) return false;
    return shape->dims().size() <= 1 || std::ranges::equal(s, shape->dims());
  }
  std::string expected_shape() const {
    if (!shape) return state_shape_string(file_shape());
    if (shape->dims().size() <= 1) return "a shape of " + std::to_string(elements) + " elements";
    return state_shape_string(file_shape()) + " (or [" + std::to_string(elements) + "])";
  }
};

/// Refuses a file whose tensor `key` is missing, or not of `dtype` and a shape that fits `range`.
MPOPT_COLD inline void check_saved_tensor(const state_reader& r, const std::string& key, std::string_view dtype,
                                          const saved_range& range, const std::string& where) {
  if (!r.contains(key)) fail(where, "tensor '", key, "' is missing");
  const std::vector<std::int64_t>& shape = r.shape(key);
  if (r.dtype(key) != dtype || !range.fits(shape))
    fail(where, "tensor '", key, "' has dtype ", r.dtype(key), " and shape ", state_shape_string(shape), ", expected ",
         dtype, " and ", range.expected_shape());
}

/// The policies' names, as the metadata holds them. Any partition loads any file: the file is per
/// parameter.
struct saved_policies {
  std::string_view precision, loss_scaler, partition, rule;
};

/// One group's tensors in the metadata: names and sizes in file order.
MPOPT_COLD inline void add_saved_tensor(nlohmann::json& tensors, const std::string& name, std::size_t size) {
  tensors.push_back({{"name", name}, {"size", size}});
}
/// One group in the metadata.
MPOPT_COLD inline nlohmann::json saved_group(nlohmann::json options, std::uint64_t step, nlohmann::json tensors) {
  return {{"options", std::move(options)}, {"step", step}, {"tensors", std::move(tensors)}};
}

/// The metadata of a saved state: policies, scaler, counters and groups; `extra`: what the rule's
/// driver adds. `rounding_seed` where the precision rounds stochastically, `replicas` where every
/// rank's copy is saved (0: rank 0's alone), `guard` where the spike guard is on (null: off).
MPOPT_COLD inline nlohmann::json state_metadata(const saved_policies& p, nlohmann::json scaler,
                                                const step_counts& counts, nlohmann::json groups,
                                                std::optional<std::uint64_t> rounding_seed, int replicas,
                                                nlohmann::json guard, const nlohmann::json& extra) {
  nlohmann::json d = {{"precision", p.precision},     {"loss_scaler", p.loss_scaler},
                      {"partition", p.partition},     {"rule", p.rule},
                      {"scaler", std::move(scaler)},  {"applied_steps", counts.applied},
                      {"skipped_steps", counts.skipped}, {"consecutive_skips", counts.consecutive_skips},
                      {"groups", std::move(groups)}};
  // The stochastic rounding's seed: with the applied steps it resumes the same noise.
  if (rounding_seed) d["rounding_seed"] = *rounding_seed;
  if (replicas) d["replicas"] = replicas;
  if (!guard.is_null()) d["spike_guard"] = std::move(guard);
  for (const auto& [key, value] : extra.items()) d[key] = value;
  return d;
}

/// Refuses a file saved with other policies than `mine` (a describe()d metadata).
MPOPT_COLD inline void check_saved_policies(const nlohmann::json& meta, const nlohmann::json& mine,
                                            const std::string& where) {
  for (const char* key : {"precision", "loss_scaler", "rule"})  // any partition: the file is per parameter
    if (meta.at(key) != mine.at(key))
      fail(where, "saved with ", key, " ", meta.at(key).dump(), ", this optimizer has ", mine.at(key).dump());
}

/// An expert group's tensors among those a file holds of it (`saved`: names and sizes, every
/// expert of the run that saved it): each of mine (name, size) is there with its size, and kept_at
/// gets its position (the group's start at `first`). That the sets of experts together hold them
/// all is checked across ranks (the optimizer's check_same_checkpoint).
MPOPT_COLD inline void find_experts(std::span<const std::pair<std::string, std::size_t>> mine,
                                    const nlohmann::json& saved, std::size_t first, std::vector<std::size_t>& kept_at,
                                    const std::string& where) {
  std::map<std::string, std::pair<std::size_t, std::size_t>> at;  // name -> (position, size)
  for (std::size_t i = 0; i < saved.size(); ++i)
    at[saved[i].at("name").get<std::string>()] = {i, saved[i].at("size").get<std::size_t>()};
  for (const auto& [name, size] : mine) {
    const auto it = at.find(name);
    if (it == at.end()) fail(where, "tensor '", name, "' is not in the file");
    if (it->second.second != size)
      fail(where, "tensor '", name, "' has ", it->second.second, " elements in the file, ", size, " here");
    kept_at.push_back(first + it->second.first);
  }
}

/// The spike guard's windows as the metadata holds them.
MPOPT_COLD inline nlohmann::json guard_json(const spike_guard::saved& s) { return {{"loss", s.loss}, {"norm", s.norm}}; }

/// A file's spike-guard windows, checked: arrays of finite numbers, none longer than a window.
MPOPT_COLD inline spike_guard::saved read_saved_guard(const nlohmann::json& j, const std::string& where) {
  spike_guard::saved s;
  for (auto [key, out] : {std::pair{"loss", &s.loss}, std::pair{"norm", &s.norm}}) {
    const nlohmann::json& a = json_field(j, key, std::string("spike_guard.") + key);
    if (!a.is_array() || a.size() > std::size_t(spike_guard_options::max_window))
      fail(where, "spike_guard.", key, " must be an array of at most ", spike_guard_options::max_window, " numbers");
    for (const auto& v : a) {
      if (!v.is_number()) fail(where, "spike_guard.", key, " holds ", v.dump(), ", not a number");
      out->push_back(v.get<double>());
      require_check(where + "spike_guard." + key + " value", out->back(), check{});
    }
  }
  return s;
}

/// The counters of a saved state, each through an exact type and range check (json_fields.hpp).
struct saved_counts {
  std::uint64_t applied = 0, skipped = 0, consecutive = 0;
  std::optional<std::uint64_t> rounding_seed;  // saved under stochastic rounding
  spike_guard::saved guard;  // the spike guard's windows, where it was on
};
MPOPT_COLD inline saved_counts read_saved_counts(const nlohmann::json& meta, const std::string& where) {
  saved_counts c;
  c.applied = json_count(meta, "applied_steps", max_steps);
  c.skipped = json_count(meta, "skipped_steps", max_steps);
  c.consecutive = json_count(meta, "consecutive_skips", c.skipped, "consecutive_skips (at most skipped_steps)");
  if (meta.contains("rounding_seed")) c.rounding_seed = json_count(meta, "rounding_seed", ~std::uint64_t{0});
  if (meta.contains("spike_guard")) c.guard = read_saved_guard(meta.at("spike_guard"), where);
  return c;
}

/// The rank whose copy of the parameters and state this rank reads: where every rank's copy was
/// saved ("replicas", the rule steps each rank on its own between synchronisations) and the world
/// size is the same, its own; else rank 0's, which a different world size takes only when asked to.
MPOPT_COLD inline int saved_replica(const nlohmann::json& meta, const load_options& lo, int rank, int world,
                                    std::string_view rule, const std::string& where) {
  if (!meta.contains("replicas")) return 0;
  const int saved_world = int(json_integer(meta, "replicas", 2, INT_MAX, "replicas"));
  if (saved_world != world && !lo.reset_compression_errors)
    fail(where, "saved by ", saved_world, " ranks whose parameters and optimizer state differ (", rule,
         " steps each rank on its own gradients between synchronisations): load it on ", saved_world,
         " ranks to resume exactly, or pass load_options{.reset_compression_errors = true} to continue on ", world,
         " from rank 0's");
  return saved_world == world ? rank : 0;
}

inline constexpr std::string_view same_checkpoint_advice = "Every rank must load the same checkpoint";

/// What every rank must have read alike of a checkpoint (ranks that read different files would
/// train apart): its counters, its scaler (`scaler`: as JSON text) and each group's ("step N, options").
MPOPT_COLD inline std::vector<setting> loaded_settings(const saved_counts& c, std::string scaler,
                                                       std::span<const std::string> groups) {
  std::vector<setting> read = {
      {"the checkpoint's step counts", std::to_string(c.applied) + " applied, " + std::to_string(c.skipped) +
                                           " skipped, " + std::to_string(c.consecutive) + " in a row"},
      {"the checkpoint's loss scaler", std::move(scaler)},
      {"the checkpoint's rounding seed", c.rounding_seed ? std::to_string(*c.rounding_seed) : "none"}};
  for (std::size_t g = 0; g < groups.size(); ++g) read.push_back({"the checkpoint's group " + std::to_string(g), groups[g]});
  return read;
}

/// Refuses a load that would drop tensors: `held`, per group, how many of the file's tensors
/// (`in_file`) the ranks together hold.
MPOPT_COLD inline void check_groups_held(std::span<const std::uint64_t> held, std::span<const std::uint64_t> in_file) {
  for (std::size_t g = 0; g < held.size(); ++g)
    if (held[g] != in_file[g])
      fail("load(): the file holds ", in_file[g], " tensors of group ", g, ", the ranks hold ", held[g],
           " of them: each must have a place (expert groups: the sets of experts together hold the file's)");
}

}  // namespace mpopt::detail
