// mpopt — checkpoint_flow's definitions (checkpoint_flow.hpp): inline header-only, else compiled once
// by <mpopt/src.hpp>.
#pragma once

#include "checkpoint_flow.hpp"

#include <algorithm>
#include <filesystem>
#include <iterator>

#include "../../error.hpp"
#include "../options/fields_json.hpp"
#include "json_fields.hpp"
#include "../options/validate.hpp"

namespace mpopt::detail {

MPOPT_DECL nlohmann::json describe(checkpoint_subject& s, const checkpoint_view& v) {
  const typed_metadata m = s.metadata();
  std::vector<nlohmann::json> group_options;
  for (const auto& fields : m.group_options) group_options.push_back(fields_json(fields));
  nlohmann::json driver = nlohmann::json::object();
  s.describe_driver(driver);
  nlohmann::json meta =
      state_metadata(m.policies, fields_json(m.scaler), m.counts, saved_groups(v, group_options, m.group_steps),
                     m.rounding_seed, s.replicas(), m.guard ? guard_json(*m.guard) : nlohmann::json(), driver);
  add_saved_schedule(meta, m.schedule);
  if (v.state_storage.block) {  // which buffers the unsigned map codes: a reader decodes with it
    nlohmann::json& nonnegative = meta["nonnegative_state"] = nlohmann::json::array();
    for (const auto& g : v.groups)
      for (const auto& b : v.group_state(g))
        if (b.nonnegative && std::find(nonnegative.begin(), nonnegative.end(), b.key) == nonnegative.end())
          nonnegative.push_back(b.key);
  }
  return meta;
}

MPOPT_DECL saved_header check_saved(checkpoint_subject& s, const state_reader& r, const std::string& where,
                                    const load_options& lo) {
  const checkpoint_view v = s.view();
  saved_header h;
  try {
    const nlohmann::json& meta = r.metadata();
    const nlohmann::json mine = describe(s, v);
    h.storage = check_saved_policies(meta, mine, where);
    const auto& groups = meta.at("groups");
    h.found = find_saved_tensors(v, groups, mine["groups"], where);
    // Every number through an exact type and range check (json_fields.hpp), then the checks the
    // options get from the constructor: nothing in the file reaches a conversion or a step unchecked.
    static_cast<saved_counts&>(h) = read_saved_counts(meta, where);
    if (h.schedule && h.schedule->schedule) s.check_schedule(*h.schedule->schedule);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const std::string label = "group " + std::to_string(g);
      try {
        s.read_group_options(json_field(groups[g], "options"));
      } catch (const error& e) {
        fail(where, label, ".", e.message());
      }
      s.validate_group_options(where + label);
      // A group steps with every applied step: its count cannot exceed theirs.
      h.group_steps.push_back(json_count(groups[g], "step", h.applied, label + ".step (at most applied_steps)"));
    }
    s.read_scaler(meta.at("scaler"), h.applied + h.skipped, where);
    std::vector<std::size_t> sizes;  // every tensor's, in order
    for (const auto& g : v.groups)
      for (const auto& e : g.tensors) sizes.push_back(e.size);
    s.read_driver(meta, r, where, lo, h.applied, sizes);
    h.replica = saved_replica(meta, lo, s.rank(), s.world(), s.rule_name(), where);
  } catch (const nlohmann::json::exception& e) {
    fail(where, "malformed optimizer metadata: ", e.what());
  } catch (const error& e) {
    if (e.message().starts_with(where)) throw;
    fail(where, e.message());
  }
  check_saved_pieces(r, held_pieces(v, h.found.kept_at, h.found.file_tensors, h.storage), h.replica, where);
  return h;
}

MPOPT_DECL void check_same_checkpoint(checkpoint_subject& s, const saved_header& h) {
  const setting groups[] = {{"the checkpoint's number of groups", std::to_string(h.group_steps.size())}};
  s.require_same(groups, same_checkpoint_advice);
  std::vector<std::string> group_settings;
  for (std::size_t g = 0; g < h.group_steps.size(); ++g)
    group_settings.push_back("step " + std::to_string(h.group_steps[g]) + ", " + s.read_group_text(g));
  const std::vector<setting> read = loaded_settings(h, s.read_scaler_text(), group_settings);
  s.require_same(read, same_checkpoint_advice);
  // Each rank found its experts in the file; together the sets of experts must hold all of the
  // file's, or some would be dropped. (Every rank has the file's number of groups: check_saved.)
  const std::vector<std::uint64_t> held = s.tensors_held();
  s.agree("load", [&] { check_groups_held(held, h.found.group_tensors); });
}

MPOPT_DECL void save_state(checkpoint_subject& s, const state_target& target) {
  if (!s.finalized()) fail("save(): nothing to save before the first step (or finalize())");
  if (s.micro_step() != 0)
    fail("save() at micro-step ", s.micro_step(), " of ", s.accumulation_steps(), ": save after the accumulation boundary");
  s.at("save()");
  // Rank 0 writes: a rank given another path would take its save() for done.
  const setting where[] = {{"the path given to save()", target.in_memory() ? "(memory)" : target.path}};
  s.require_same(where, "Every rank must pass save() the same path, or each memory; rank 0 writes the file");
  s.finish_step();
  const checkpoint_view v = s.view();
  std::vector<state_piece> pieces;  // in file order: each rank's copy where the replicas differ
  for (int r = 0; r < std::max(1, s.replicas()); ++r) {
    std::vector<state_piece> copy = file_pieces(v, r);
    pieces.insert(pieces.end(), std::make_move_iterator(copy.begin()), std::make_move_iterator(copy.end()));
  }
  std::vector<state_stream::tensor> extras;
  for (auto& [key, elements] : s.extras()) extras.push_back({std::move(key), "F32", {std::int64_t(elements)}});
  write_state(s, target, [&] { return describe(s, v); }, pieces, std::move(extras),
              [&](const std::function<void(std::span<const std::byte>)>& write) { s.save_extras(write); });
}

MPOPT_DECL void load_state(checkpoint_subject& s, const state_source& source, const load_options& lo) {
  std::optional<state_reader> file;
  saved_header saved;
  s.at("load()");
  s.agree("load", [&] {
    file.emplace(source);
    saved = check_saved(s, *file, source.path + ": ", lo);
  });
  check_same_checkpoint(s, saved);
  s.prepare_to_read();
  std::vector<std::byte> staged;  // a tensor for device memory, read on the host first
  const checkpoint_view v = s.view();
  read_state(*file, s, held_pieces(v, saved.found.kept_at, saved.found.file_tensors, saved.storage), saved.replica, staged);
  if (saved.storage.state != v.state_storage) read_converted_state(*file, s, v, saved.storage.state, saved.replica);
  if (saved.storage.master != v.master_storage) read_converted_master(*file, s, v, saved.storage.master, saved.replica);
  s.restore(saved, saved.group_steps, [&](const std::string& key, std::size_t first, const untyped& to, std::size_t count, bool on_device) {
    read_piece(*file, s, key, first, to, count, on_device, staged);
  });
}

}  // namespace mpopt::detail
