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

#include "../options.hpp"
#include "checkpoint_io.hpp"
#include "checkpoint_pieces.hpp"
#include "config.hpp"
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
MPOPT_DECL nlohmann::json describe(const checkpoint_subject& s, const checkpoint_view& v);

/// Writes every parameter, master and moment by tensor name, with the metadata (checkpoint.hpp).
MPOPT_DECL void save_state(checkpoint_subject& s, const std::filesystem::path& path);

/// Checks a state file against the subject (policies, groups, tensor names, sizes, dtypes) and
/// parses its header into it, changing nothing the optimizer steps with.
MPOPT_DECL saved_header check_saved(checkpoint_subject& s, const state_reader& r, const std::string& where,
                                    const load_options& lo);

/// Ranks that read different files would train apart: what each read must agree, before anything
/// changes. The group count first, as it decides the length of the rest.
MPOPT_DECL void check_same_checkpoint(checkpoint_subject& s, const saved_header& h);

/// Restores a save()d state (checkpoint.hpp): every rank reads and checks the file; only when all
/// ranks found it good does anything change, otherwise every rank throws.
MPOPT_DECL void load_state(checkpoint_subject& s, const std::filesystem::path& path, const load_options& lo);

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "checkpoint_flow.ipp"
#endif
