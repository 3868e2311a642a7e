// mpopt — saved_state's definitions (saved_state.hpp): inline header-only, else compiled once by
// <mpopt/src.hpp>.
#pragma once

#include "saved_state.hpp"

#include <algorithm>
#include <climits>
#include <map>

#include "../../error.hpp"
#include "../options/field_refs.hpp"
#include "json_fields.hpp"
#include "../options/schedule_json.hpp"
#include "../options/validate.hpp"

namespace mpopt::detail {

MPOPT_DECL std::string replica_key(int r, const std::string& key) {
  return r == 0 ? key : "rank/" + std::to_string(r) + "/" + key;
}

MPOPT_DECL bool saved_range::fits(const std::vector<std::int64_t>& s) const {
  const std::vector<std::int64_t> flat{std::int64_t(elements)};
  if (s == flat) return true;
  if (!shape) return false;
  std::uint64_t n = 0;
  if (!state_tensor_bytes(s, 1, n) || n != elements) return false;
  return shape->dims().size() <= 1 || std::ranges::equal(s, shape->dims());
}

MPOPT_DECL std::string saved_range::expected_shape() const {
  if (!shape) return state_shape_string(file_shape());
  if (shape->dims().size() <= 1) return "a shape of " + std::to_string(elements) + " elements";
  return state_shape_string(file_shape()) + " (or [" + std::to_string(elements) + "])";
}

MPOPT_DECL void check_saved_tensor(const state_reader& r, const std::string& key, std::string_view dtype,
                                   const saved_range& range, const std::string& where) {
  if (!r.contains(key)) fail(where, "tensor '", key, "' is missing");
  const std::vector<std::int64_t>& shape = r.shape(key);
  if (r.dtype(key) != dtype || !range.fits(shape))
    fail(where, "tensor '", key, "' has dtype ", r.dtype(key), " and shape ", state_shape_string(shape), ", expected ",
         dtype, " and ", range.expected_shape());
}

MPOPT_DECL void add_saved_tensor(nlohmann::json& tensors, const std::string& name, std::size_t size) {
  tensors.push_back({{"name", name}, {"size", size}});
}

MPOPT_DECL nlohmann::json saved_group(nlohmann::json options, std::uint64_t step, nlohmann::json tensors) {
  return {{"options", std::move(options)}, {"step", step}, {"tensors", std::move(tensors)}};
}

MPOPT_DECL nlohmann::json state_metadata(const saved_policies& p, nlohmann::json scaler,
                                         const step_counts& counts, nlohmann::json groups,
                                         std::optional<std::uint64_t> rounding_seed, int replicas,
                                         nlohmann::json guard, const nlohmann::json& extra) {
  nlohmann::json d = {{"precision", p.precision},     {"state", p.state},
                      {"master", p.master},           {"loss_scaler", p.loss_scaler},
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

MPOPT_DECL saved_storage check_saved_policies(const nlohmann::json& meta, const nlohmann::json& mine,
                                              const std::string& where) {
  for (const std::string_view key : {"precision", "loss_scaler", "rule"})  // any partition: the file is per parameter
    if (meta.at(key) != mine.at(key))
      fail(where, "saved with ", key, " ", meta.at(key).dump(), ", this optimizer has ", mine.at(key).dump());
  // Any storage loads into any other (state_conversion.hpp). A file written before state
  // precisions were saved kept its state and master in fp32.
  auto named = [&](const auto& formats, const char* key) {
    const nlohmann::json saved = meta.contains(key) ? meta.at(key) : nlohmann::json("fp32");
    const auto* f = saved.is_string() ? format_named(formats, saved.get<std::string>()) : nullptr;
    if (!f) fail(where, "saved with ", key, " ", saved.dump(), ", a storage this version of mpopt does not know");
    return *f;
  };
  return {named(state_formats, "state"), named(master_formats, "master")};
}

MPOPT_DECL void find_experts(std::span<const std::pair<std::string, std::size_t>> mine,
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

MPOPT_DECL nlohmann::json guard_json(const spike_guard::saved& s) { return {{"loss", s.loss}, {"norm", s.norm}}; }

MPOPT_DECL spike_guard::saved read_saved_guard(const nlohmann::json& j, const std::string& where) {
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

MPOPT_DECL void add_saved_schedule(nlohmann::json& meta, const saved_schedule& s) {
  meta["lr_schedule"] = s.schedule ? schedule_json(*s.schedule) : nlohmann::json();
  nlohmann::json& groups = meta.at("groups");
  for (std::size_t g = 0; g < groups.size(); ++g) groups[g]["base_lr"] = s.base_lrs.at(g);
}

MPOPT_DECL std::optional<saved_schedule> read_saved_schedule(const nlohmann::json& meta) {
  if (!meta.contains("lr_schedule")) return std::nullopt;
  saved_schedule s;
  if (const nlohmann::json& j = meta.at("lr_schedule"); !j.is_null())
    s.schedule = read_schedule(config_object(j, "lr_schedule"), schedule_source::checkpoint);
  const nlohmann::json& groups = meta.at("groups");
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string name = "group " + std::to_string(g) + ".base_lr";
    s.base_lrs.push_back(json_number(groups[g], "base_lr", name));
    require_check(name, s.base_lrs.back(), checks::rate);
  }
  return s;
}

MPOPT_DECL saved_counts read_saved_counts(const nlohmann::json& meta, const std::string& where) {
  saved_counts c;
  c.applied = json_count(meta, "applied_steps", max_steps);
  c.skipped = json_count(meta, "skipped_steps", max_steps);
  c.consecutive = json_count(meta, "consecutive_skips", c.skipped, "consecutive_skips (at most skipped_steps)");
  if (meta.contains("rounding_seed")) c.rounding_seed = json_count(meta, "rounding_seed", ~std::uint64_t{0});
  if (meta.contains("spike_guard")) c.guard = read_saved_guard(meta.at("spike_guard"), where);
  c.schedule = read_saved_schedule(meta);
  return c;
}

MPOPT_DECL int saved_replica(const nlohmann::json& meta, const load_options& lo, int rank, int world,
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

MPOPT_DECL std::vector<setting> loaded_settings(const saved_counts& c, std::string scaler,
                                                std::span<const std::string> groups) {
  std::vector<setting> read = {
      {"the checkpoint's step counts", std::to_string(c.applied) + " applied, " + std::to_string(c.skipped) +
                                           " skipped, " + std::to_string(c.consecutive) + " in a row"},
      {"the checkpoint's loss scaler", std::move(scaler)},
      {"the checkpoint's rounding seed", c.rounding_seed ? std::to_string(*c.rounding_seed) : "none"}};
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::string group = groups[g];
    if (c.schedule) group += ", base_lr " + nlohmann::json(c.schedule->base_lrs[g]).dump();
    read.push_back({"the checkpoint's group " + std::to_string(g), std::move(group)});
  }
  if (c.schedule) {
    const std::vector<setting> schedule = schedule_compared(c.schedule->schedule, "the checkpoint's ");
    read.insert(read.end(), schedule.begin(), schedule.end());
  }
  return read;
}

MPOPT_DECL void check_groups_held(std::span<const std::uint64_t> held, std::span<const std::uint64_t> in_file) {
  for (std::size_t g = 0; g < held.size(); ++g)
    if (held[g] != in_file[g])
      fail("load(): the file holds ", in_file[g], " tensors of group ", g, ", the ranks hold ", held[g],
           " of them: each must have a place (expert groups: the sets of experts together hold the file's)");
}

}  // namespace mpopt::detail
