// mpopt — an optimizer as save() and load() see it, whatever its types: its tensors and state without
// their types (a checkpoint_view), and behind virtual calls the few parts that have types (the
// rule's options, the scaler, the driver's state, the counters). The typed side (checkpoint.hpp)
// needs no more than this: no JSON library, no <filesystem>. What uses it (checkpoint_flow.hpp,
// checkpoint_pieces.hpp, checkpoint_io.hpp) is compiled once per program.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "../../lr_schedule.hpp"
#include "../../options.hpp"
#include "../../tensor_spec.hpp"
#include "../config.hpp"
#include "../exchange/expert_placement.hpp"
#include "../options/field_refs.hpp"
#include "../exchange/flat_layout.hpp"
#include "../comm/same_settings.hpp"
#include "../step/spike_guard.hpp"
#include "state_dtype.hpp"
#include "state_format.hpp"
#include "state_place.hpp"
#include "../step/step_counts.hpp"

namespace mpopt::detail {

class state_reader;

/// What saving and loading need of the optimizer's communicator and backend.
class checkpoint_io {
 public:
  virtual int rank() const = 0;
  /// In place, rank r's piece the counts[r] elements after those of ranks < r (communicator.hpp).
  virtual void all_gather(std::span<float> data, std::span<const std::size_t> counts) = 0;
  virtual void all_gather(std::span<std::uint8_t> data, std::span<const std::size_t> counts) = 0;
  /// Bytes between the backend's memory and the host's, done when it returns.
  virtual void to_host(std::byte* dst, const std::byte* src, std::size_t bytes) = 0;
  virtual void to_device(std::byte* dst, const std::byte* src, std::size_t bytes) = 0;
  /// Runs f on every rank and agrees on the outcome (agree.hpp).
  virtual void agree(std::string_view what, const std::function<void()>& f) = 0;

 protected:
  ~checkpoint_io() = default;
};

/// A typed pointer as a state file sees it: bytes of a dtype.
struct untyped {
  std::byte* data = nullptr;
  std::string_view dtype;
  std::size_t element_bytes = 0;
  bool floats = false;  ///< fp32: all-gathered as floats; anything else as bytes

  template <class T>
  static untyped of(T* p) {
    using E = std::remove_const_t<T>;
    return {reinterpret_cast<std::byte*>(const_cast<E*>(p)), state_dtype<E>::value, sizeof(E), std::is_same_v<E, float>};
  }
  /// Element i onwards.
  untyped at(std::size_t i) const { return {data + i * element_bytes, dtype, element_bytes, floats}; }
};

/// The optimizer's tensors and state as a checkpoint sees them: bytes of a dtype, by name.
struct checkpoint_view {
  struct tensor {
    const std::string* name;
    std::size_t size;
    const tensor_shape* shape;
    untyped param;
  };
  struct group {
    std::vector<tensor> tensors;
    bool expert_parallel = false;
    const expert_placement* experts = nullptr;  ///< where its sets of experts are (after finalize())
    /// The file names of its tensors' state buffers: the first of `state`, as its rule names them.
    std::span<const std::string_view> state_keys;
    /// Per buffer it keeps: its local state index less its index in the buffer (buffer_layout).
    std::span<const std::size_t> state_shift;
  };
  std::vector<group> groups;
  const flat_layout* layout = nullptr;  ///< null before finalize(): state pointers are null then
  std::size_t world = 1;
  bool has_master = false;
  untyped master;  ///< fp32 masters, or their remainders (remainder16), where has_master
  master_format master_storage = master_formats[0];
  /// A rule's state buffer under its file name: its values, or its codes and their blocks' scales.
  struct state_buffer {
    std::string key;
    untyped data;
    untyped scales;            ///< quantized state: one fp32 scale per block
    bool nonnegative = false;  ///< quantized with the map of state that is never negative
    std::size_t shift = 0;     ///< a group's (group_state): its local index less its index here
  };
  state_format state_storage = state_formats[0];
  std::vector<state_buffer> state;  ///< the rule's buffers, in its order (group_state: a group's)
  std::vector<std::pair<std::string, untyped>> kept;        ///< what the rule's driver keeps per tensor
  bool tensors_on_device = false;  ///< the parameters are in device memory
  bool state_on_device = false;    ///< masters and state are

  /// Group g's state buffers: the first g.state_keys.size() of `state`, under g's names for them.
  std::vector<state_buffer> group_state(const group& g) const {
    std::vector<state_buffer> buffers(state.begin(), state.begin() + std::ptrdiff_t(g.state_keys.size()));
    for (std::size_t k = 0; k < buffers.size(); ++k) {
      buffers[k].key = g.state_keys[k];
      if (!g.state_shift.empty()) buffers[k].shift = g.state_shift[k];
    }
    return buffers;
  }

  /// The tensors a file holds: every group's, and of an expert group those of every set of experts.
  std::size_t file_tensors() const {
    std::size_t n = 0;
    for (const auto& g : groups) n += g.tensors.size() * (g.experts ? g.experts->size() : 1);
    return n;
  }
};

/// The policies' names, as the metadata holds them. Any partition loads any file: the file is per
/// parameter.
struct saved_policies {
  std::string_view precision, state, master, loss_scaler, partition, rule;
};

/// A file's learning-rate schedule (none where it had none) and each group's base rate.
struct saved_schedule {
  std::optional<lr_schedule> schedule;
  std::vector<double> base_lrs;
};

/// The counters of a saved state, each through an exact type and range check (json_fields.hpp).
struct saved_counts {
  std::uint64_t applied = 0, skipped = 0, consecutive = 0;
  std::optional<std::uint64_t> rounding_seed;  // saved under stochastic rounding
  spike_guard::saved guard;  // the spike guard's windows, where it was on
  std::optional<saved_schedule> schedule;  // absent from files written before schedules were saved
};

/// The metadata's parts that come from typed members: records of options tables (field_refs), which
/// the subject keeps alive until the file is written.
struct typed_metadata {
  saved_policies policies;
  std::vector<field_ref> scaler;  ///< the scaler's state
  step_counts counts;
  std::vector<std::vector<field_ref>> group_options;
  std::vector<std::uint64_t> group_steps;
  std::optional<std::uint64_t> rounding_seed;  ///< under stochastic rounding
  std::optional<spike_guard::saved> guard;     ///< where the spike guard is on
  saved_schedule schedule;
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
  virtual typed_metadata metadata() = 0;
  /// Adds what the rule's driver records (1-bit rules: their phase) to `meta`, a JSON object.
  virtual void describe_driver(nlohmann::json& meta) const = 0;
  /// What the rule's driver keeps besides the view's tensors (1-bit LAMB's errors), fp32 by key and
  /// element count: listed, then written.
  virtual std::vector<std::pair<std::string, std::size_t>> extras() const = 0;
  virtual void save_extras(const std::function<void(std::span<const std::byte>)>& write) = 0;
  /// load() from a file that stores state otherwise: x (from the start of a block) stored as this
  /// optimizer stores buffer k, into host memory laid out as its state: values or codes to `data`,
  /// and where quantized the blocks' scales to `scales`.
  virtual void encode_state(std::size_t k, std::span<const float> x, std::byte* data, float* scales) const = 0;

  /// A group's options (throws mpopt::error on a malformed one), then their constructor's checks.
  virtual void read_group_options(const nlohmann::json& options) = 0;
  virtual void validate_group_options(const std::string& where) = 0;
  /// Throws mpopt::error if the rule cannot follow `s` (optimizer::set_schedule's checks).
  virtual void check_schedule(const lr_schedule& s) const = 0;
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
  virtual void restore(const saved_counts& counts, std::span<const std::uint64_t> group_steps,
                       const std::function<void(const std::string& key, std::size_t first, const untyped& to,
                                                std::size_t count, bool on_device)>& read) = 0;

 protected:
  ~checkpoint_subject() = default;
};

// save() and load() themselves, defined with the rest of the flow (checkpoint_flow.ipp), which the
// typed side includes header-only.

/// Writes every parameter, master and moment by tensor name, with the metadata (checkpoint.hpp).
MPOPT_DECL void save_state(checkpoint_subject& s, const state_target& target);

/// Restores a save()d state (checkpoint.hpp): every rank reads and checks the file; only when all
/// ranks found it good does anything change, otherwise every rank throws.
MPOPT_DECL void load_state(checkpoint_subject& s, const state_source& source, const load_options& lo);

/// A path given to save() or load() as text: a string, or a std::filesystem::path (whose header the
/// caller has then included).
template <class Path>
std::string path_text(const Path& path) {
  if constexpr (std::is_convertible_v<const Path&, std::string_view>) return std::string(std::string_view(path));
  else return path.string();
}

/// What save() is given: a std::vector<std::byte> (its contents replaced), a std::ostream, or a path.
template <class Where>
state_target target_of(Where& where) {
  if constexpr (std::is_same_v<Where, std::vector<std::byte>>) return {"the checkpoint in memory", &where};
  else if constexpr (std::is_base_of_v<std::ostream, Where>) return {"the checkpoint's stream", nullptr, &where};
  else return {path_text(where)};
}

/// What load() is given: bytes (anything a std::span<const std::byte> is made from), a std::istream,
/// or a path.
template <class From>
state_source source_of(From& from) {
  if constexpr (std::is_base_of_v<std::istream, From>) return {"the checkpoint's stream", std::nullopt, &from};
  else if constexpr (std::is_constructible_v<std::span<const std::byte>, From&>)
    return {"the checkpoint in memory", std::span<const std::byte>(from)};
  else return {path_text(from)};
}

}  // namespace mpopt::detail
