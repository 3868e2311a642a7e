// mpopt — save() and load() from first check to last assignment, whatever the optimizer's types.
// The optimizer hands itself over as a checkpoint_subject: its tensors without their types (a
// checkpoint_view), and behind virtual calls the few parts that have types (the rule's options,
// the scaler, the driver's state, the counters). So this is compiled once per program, not once
// per optimizer type (checkpoint.hpp has the typed side).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "../error.hpp"
#include "../options.hpp"
#include "checkpoint_io.hpp"
#include "checkpoint_pieces.hpp"
#include "config.hpp"
#include "json_fields.hpp"
#include "same_settings.hpp"
#include "saved_state.hpp"
#include "state_file.hpp"
#include "step_counts.hpp"

namespace mpopt::detail {

/// What load() takes from a file besides the tensors and their typed parts (which the subject keeps
/// until restore()).
struct saved_header : saved_counts {
  std::vector<std::uint64_t> group_steps;
  found_tensors found;  ///< where my tensors are among the file's
  int replica = 0;      ///< the rank whose copy this rank reads (replicas_differ), else 0
};

/// The metadata's parts that come from typed members.
struct typed_metadata {
  saved_policies policies;
  nlohmann::json scaler;
  step_counts counts;
  std::vector<nlohmann::json> group_options;
  std::vector<std::uint64_t> group_steps;
  std::optional<std::uint64_t> rounding_seed;  ///< under stochastic rounding
  nlohmann::json guard;                        ///< null where the spike guard is off
  nlohmann::json driver;                       ///< what the rule's driver adds
};

/// An optimizer as save() and load() see it. load() reads a file's typed parts into the subject
/// (read_*), checks them across ranks (*_text), and only then has it take them (restore).
class checkpoint_subject : public checkpoint_io {
 public:
  virtual int world() const = 0;
  virtual std::string_view rule_name() const = 0;
  virtual bool finalized() const = 0;
  /// The accumulation window's micro-step, of how many.
  virtual int micro_step() const = 0;
  virtual int accumulation_steps() const = 0;
  /// Names the call and its step in the communicator's errors (metered.hpp).
  virtual void at(const char* call) = 0;
  virtual void finish_step() = 0;
  /// load(): the state allocated, no gather in flight.
  virtual void prepare_to_read() = 0;
  virtual checkpoint_view view() const = 0;
  /// How many ranks' copies save() writes: every rank's where the rule's driver says the replicas
  /// differ (0/1 Adam between synchronisations), else 0 (rank 0's alone, as every rank's).
  virtual int replicas() const = 0;
  virtual typed_metadata metadata() const = 0;
  /// What the rule's driver keeps besides the view's tensors (1-bit LAMB's errors): listed, written.
  virtual std::vector<state_stream::tensor> extras() const = 0;
  virtual void save_extras(const std::function<void(std::span<const std::byte>)>& write) = 0;

  /// A group's options (throws mpopt::error on a malformed one), then their constructor's checks.
  virtual void read_group_options(const nlohmann::json& options) = 0;
  virtual void validate_group_options(const std::string& where) = 0;
  /// The scaler's state, at most one update per step taken (`steps`).
  virtual void read_scaler(const nlohmann::json& saved, std::uint64_t steps, const std::string& where) = 0;
  virtual void read_driver(const nlohmann::json& meta, const state_reader& r, const std::string& where,
                           const load_options& lo, std::uint64_t applied, std::span<const std::size_t> sizes) = 0;
  virtual std::string read_scaler_text() const = 0;
  virtual std::string read_group_text(std::size_t g) const = 0;
  /// Collective: require_same_settings over the optimizer's communicator.
  virtual void require_same(std::span<const setting> settings, std::string_view advice) = 0;
  /// Collective: per group, how many of its tensors the ranks hold together (a set of experts once).
  virtual std::vector<std::uint64_t> tensors_held() = 0;
  /// Takes what was read: the driver's state (through `read`), then the scaler, options and counters.
  virtual void restore(const saved_header& h, const std::function<void(const std::string& key, std::size_t first,
                                                                       const untyped& to, std::size_t count,
                                                                       bool on_device)>& read) = 0;

 protected:
  ~checkpoint_subject() = default;
};

/// Policies, scaler, counters and group layout: the metadata of a saved state.
MPOPT_COLD inline nlohmann::json describe(const checkpoint_subject& s, const checkpoint_view& v) {
  typed_metadata m = s.metadata();
  return state_metadata(m.policies, std::move(m.scaler), m.counts, saved_groups(v, m.group_options, m.group_steps),
                        m.rounding_seed, s.replicas(), std::move(m.guard), m.driver);
}

/// Writes every parameter, master and moment by tensor name, with the metadata (checkpoint.hpp).
MPOPT_COLD inline void save_state(checkpoint_subject& s, const std::filesystem::path& path) {
  if (!s.finalized()) fail("save(): nothing to save before the first step (or finalize())");
  if (s.micro_step() != 0)
    fail("save() at micro-step ", s.micro_step(), " of ", s.accumulation_steps(), ": save after the accumulation boundary");
  s.at("save()");
  // Rank 0 writes: a rank given another path would take its save() for done.
  const setting where[] = {{"the path given to save()", path.string()}};
  s.require_same(where, "Every rank must pass save() the same path; rank 0 writes the file");
  s.finish_step();
  const checkpoint_view v = s.view();
  std::vector<state_piece> pieces;  // in file order: each rank's copy where the replicas differ
  for (int r = 0; r < std::max(1, s.replicas()); ++r) {
    std::vector<state_piece> copy = file_pieces(v, r);
    pieces.insert(pieces.end(), std::make_move_iterator(copy.begin()), std::make_move_iterator(copy.end()));
  }
  write_state(s, path, [&] { return describe(s, v); }, pieces, s.extras(),
              [&](const std::function<void(std::span<const std::byte>)>& write) { s.save_extras(write); });
}

/// Checks a state file against the subject (policies, groups, tensor names, sizes, dtypes) and
/// parses its header into it, changing nothing the optimizer steps with.
MPOPT_COLD inline saved_header check_saved(checkpoint_subject& s, const state_reader& r, const std::string& where,
                                           const load_options& lo) {
  const checkpoint_view v = s.view();
  saved_header h;
  try {
    const nlohmann::json& meta = r.metadata();
    const nlohmann::json mine = describe(s, v);
    check_saved_policies(meta, mine, where);
    const auto& groups = meta.at("groups");
    h.found = find_saved_tensors(v, groups, mine["groups"], where);
    // Every number through an exact type and range check (json_fields.hpp), then the checks the
    // options get from the constructor: nothing in the file reaches a conversion or a step unchecked.
    static_cast<saved_counts&>(h) = read_saved_counts(meta, where);
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
  check_saved_pieces(r, held_pieces(v, h.found.kept_at, h.found.file_tensors), h.replica, where);
  return h;
}

/// Ranks that read different files would train apart: what each read must agree, before anything
/// changes. The group count first, as it decides the length of the rest.
MPOPT_COLD inline void check_same_checkpoint(checkpoint_subject& s, const saved_header& h) {
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

/// Restores a save()d state (checkpoint.hpp): every rank reads and checks the file; only when all
/// ranks found it good does anything change, otherwise every rank throws.
MPOPT_COLD inline void load_state(checkpoint_subject& s, const std::filesystem::path& path, const load_options& lo) {
  std::optional<state_reader> file;
  saved_header saved;
  s.at("load()");
  s.agree("load", [&] {
    file.emplace(path);
    saved = check_saved(s, *file, path.string() + ": ", lo);
  });
  check_same_checkpoint(s, saved);
  s.prepare_to_read();
  std::vector<std::byte> staged;  // a tensor for device memory, read on the host first
  read_state(*file, s, held_pieces(s.view(), saved.found.kept_at, saved.found.file_tensors), saved.replica, staged);
  s.restore(saved, [&](const std::string& key, std::size_t first, const untyped& to, std::size_t count, bool on_device) {
    read_piece(*file, s, key, first, to, count, on_device, staged);
  });
}

}  // namespace mpopt::detail
