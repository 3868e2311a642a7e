// mpopt — checkpoint writing and reading: the optimizer's save() and load(). Every parameter, fp32
// master and rule state buffer by tensor name, with the scaler, the counters and each group's
// options, in a safetensors file (README, "Checkpoints"; the container: state_file.hpp). Sharded
// state is gathered tensor by tensor on save and each rank reads its own part on load, so a file
// loads at any world size. The optimizer derives from checkpointing<itself, its policies>.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "../error.hpp"
#include "../options.hpp"
#include "../precision.hpp"
#include "../rule.hpp"
#include "../tensor.hpp"
#include "flat_layout.hpp"
#include "json_fields.hpp"
#include "same_settings.hpp"
#include "state_file.hpp"
#include "tensor_registry.hpp"

namespace mpopt {

namespace detail {

template <>
struct state_dtype<half> : dtype_name<half> {};
template <>
struct state_dtype<bfloat16> : dtype_name<bfloat16> {};

template <class Opt, class Precision, class LossScaler, class Partition, class UpdateRule, class Backend>
class checkpointing {
  static constexpr std::size_t state_count = UpdateRule::state.size();

 public:
  /// Writes every parameter, master and moment by tensor name, with the scaler, counters and group
  /// options, to a safetensors file (format: README, "Checkpoints"). Every rank calls it; rank 0
  /// writes, tensor by tensor as the sharded ones are gathered (one at a time), and a
  /// failure there throws on every rank.
  void save(const std::filesystem::path& path) {
    Opt& o = self();
    if (!o.finalized_) fail("save(): nothing to save before the first step (or finalize())");
    if (o.micro_step_ != 0)
      fail("save() at micro-step ", o.micro_step_, " of ", o.options_.accumulation_steps,
           ": save after the accumulation boundary");
    o.comm_.at("save()", o.next_step() - 1);
    o.finish_step();
    const bool writer = o.comm_.rank() == 0;
    std::optional<state_stream> out;
    o.agree("save", [&] {
      if (!writer) return;
      std::vector<state_stream::tensor> header;
      for_each_saved_tensor(o, [&](std::string key, const saved_range& r, const auto* data) {
        using T = std::remove_cv_t<std::remove_pointer_t<decltype(data)>>;
        header.push_back({std::move(key), std::string(state_dtype<T>::value), r.file_shape()});
      });
      o.driver_.for_each_extra(o.comm_.size(), [&](std::string key, std::size_t elements) {
        header.push_back({std::move(key), "F32", {std::int64_t(elements)}});
      });
      out.emplace(path, describe(), std::move(header));
    });
    // Every rank takes part in every gather, even after rank 0 failed to write: no rank leaves a
    // collective alone. The failure is agreed on at the end.
    std::optional<error> failed;
    auto write = [&](std::span<const std::byte> bytes) {
      if (!writer || failed) return;
      try {
        out->append(bytes);
      } catch (const error& e) {
        failed = e;
      }
    };
    std::vector<float> whole_tensor, gathered;
    std::vector<std::byte> copied;  // a tensor in device memory, brought to the host
    for_each_saved_tensor(o, [&](const std::string&, const saved_range& r, const auto* data) {
      using T = std::remove_cv_t<std::remove_pointer_t<decltype(data)>>;
      if (r.on_device) {
        copied.resize(r.count * sizeof(T));
        o.backend_.to_host(reinterpret_cast<T*>(copied.data()), data, r.count);
        data = reinterpret_cast<const T*>(copied.data());
      }
      std::span<const T> whole(data, r.count);
      if constexpr (std::is_same_v<T, float>)
        if (r.sharded) {
          gather_tensor(o, r.tensor, std::span<const float>(data, r.count), whole_tensor, gathered);
          whole = whole_tensor;
        }
      write(std::as_bytes(whole));
    });
    o.driver_.save_extra(o.comm_, o.backend_, write);  // what the rule's driver keeps besides (1-bit LAMB's errors)
    o.agree("save", [&] {
      if (failed) throw *failed;
      if (writer) out->finish();
    });
  }

  /// Restores a save()d state. The file must come from an optimizer of the same policies and the same
  /// tensors (names, sizes, groups), saved at any world size. Every rank reads and checks it; only
  /// when all ranks found it good does anything change, otherwise every rank throws.
  void load(const std::filesystem::path& path, load_options lo = {}) {
    Opt& o = self();
    std::optional<state_reader> file;
    saved_header saved;
    o.comm_.at("load()", o.next_step() - 1);
    o.agree("load", [&] {
      file.emplace(path);
      saved = check_saved(*file, path.string() + ": ", lo);
    });
    check_same_checkpoint(saved);
    o.finalize();
    o.wait_params();  // no gather in flight may land on what is read
    std::vector<std::byte> staged;  // a tensor for device memory, read on the host first
    auto read = [&]<class T>(const std::string& key, std::size_t first, T* dst, std::size_t count, bool on_device) {
      if (!on_device) return file->read(key, first, std::span(dst, count));
      staged.resize(count * sizeof(T));
      T* host = reinterpret_cast<T*>(staged.data());
      file->read(key, first, std::span(host, count));
      o.backend_.to_device(dst, host, count);
      o.wait();  // before `staged` is reused
    };
    for_each_saved_tensor(o, [&](const std::string& key, const saved_range& r, auto* dst) {
      read(key, r.first, dst, r.count, r.on_device);
    });
    o.driver_.restore(saved.driver, o.comm_, read);
    o.comm_.take_bytes();
    o.micro_step_ = 0;  // the saved state sits at an accumulation boundary
    o.pending_stage_ = Opt::stage::none;  // every parameter was just read
    o.scaler_ = saved.scaler;
    for (std::size_t g = 0; g < o.groups_.size(); ++g) {
      o.groups_[g]->options_ = saved.groups[g];
      o.groups_[g]->step_ = saved.group_steps[g];
    }
    o.counts_ = {saved.applied, saved.skipped, saved.consecutive};
    if (saved.rounding_seed) o.options_.rounding_seed = *saved.rounding_seed;
  }

 private:
  Opt& self() { return static_cast<Opt&>(*this); }
  const Opt& self() const { return static_cast<const Opt&>(*this); }

  /// What load() takes from a file besides the tensors.
  struct saved_header {
    LossScaler scaler{typename LossScaler::options{}};
    std::vector<typename UpdateRule::options> groups;
    std::vector<std::uint64_t> group_steps;
    std::uint64_t applied = 0, skipped = 0, consecutive = 0;
    std::optional<std::uint64_t> rounding_seed;  // saved under stochastic rounding
    typename Opt::driver::saved driver;  // what the rule's driver keeps besides
  };

  /// Checks a state file against this optimizer (policies, groups, tensor names, sizes, dtypes) and
  /// parses its header, changing nothing.
  saved_header check_saved(const state_reader& r, const std::string& where, const load_options& lo = {}) {
    Opt& o = self();
    saved_header h;
    h.scaler = o.scaler_;
    try {
      const nlohmann::json& meta = r.metadata();
      const nlohmann::json mine = describe();
      for (const char* key : {"precision", "loss_scaler", "rule"})  // any partition: the file is per parameter
        if (meta.at(key) != mine.at(key))
          fail(where, "saved with ", key, " ", meta.at(key).dump(), ", this optimizer has ", mine.at(key).dump());
      const auto& groups = meta.at("groups");
      if (groups.size() != o.groups_.size())
        fail(where, "saved with ", groups.size(), " groups, this optimizer has ", o.groups_.size());
      for (std::size_t g = 0; g < groups.size(); ++g) {
        if (groups[g].at("tensors") != mine["groups"][g]["tensors"])
          fail(where, "group ", g, " holds different tensors: saved ", groups[g].at("tensors").dump(),
               ", this optimizer has ", mine["groups"][g]["tensors"].dump());
      }
      // Every number through an exact type and range check (json_fields.hpp), then the checks the
      // options get from the constructor: nothing in the file reaches a conversion or a step unchecked.
      using detail::json_count;
      h.applied = json_count(meta, "applied_steps", max_steps);
      h.skipped = json_count(meta, "skipped_steps", max_steps);
      h.consecutive = json_count(meta, "consecutive_skips", h.skipped, "consecutive_skips (at most skipped_steps)");
      if (meta.contains("rounding_seed")) h.rounding_seed = json_count(meta, "rounding_seed", ~std::uint64_t{0});
      for (std::size_t g = 0; g < groups.size(); ++g) {
        const std::string label = "group " + std::to_string(g);
        try {
          h.groups.push_back(UpdateRule::from_json(json_field(groups[g], "options")));
        } catch (const error& e) {
          fail(where, label, ".", e.message());
        }
        h.groups.back().validate(where + label);
        // A group steps with every applied step: its count cannot exceed theirs.
        h.group_steps.push_back(json_count(groups[g], "step", h.applied, label + ".step (at most applied_steps)"));
      }
      h.scaler.load(meta.at("scaler"));
      if constexpr (requires { h.scaler.iteration(); })  // one scaler update per boundary
        if (std::uint64_t(h.scaler.iteration()) > h.applied + h.skipped)
          fail(where, "saved dynamic_scale.iter (", h.scaler.iteration(), ") exceeds the steps taken (",
               h.applied + h.skipped, ")");
      std::size_t elements = 0;
      for (const auto& g : o.groups_)
        for (const auto& e : g->entries_) elements += e.size;
      h.driver = o.driver_.check_saved(meta, r, where, lo, h.applied, o.comm_.size(), elements);
    } catch (const nlohmann::json::exception& e) {
      fail(where, "malformed optimizer metadata: ", e.what());
    } catch (const error& e) {
      if (e.message().starts_with(where)) throw;
      fail(where, e.message());
    }
    for_each_saved_tensor(o, [&](const std::string& key, const saved_range& sr, auto* dst) {
      using T = std::remove_pointer_t<decltype(dst)>;
      if (!r.contains(key)) fail(where, "tensor '", key, "' is missing");
      const std::vector<std::int64_t>& shape = r.shape(key);
      if (r.dtype(key) != state_dtype<T>::value || !sr.fits(shape))
        fail(where, "tensor '", key, "' has dtype ", r.dtype(key), " and shape ", state_shape_string(shape),
             ", expected ", state_dtype<T>::value, " and ", sr.expected_shape());
    });
    return h;
  }

  /// Ranks that read different files would train apart: what each read must o.agree, before anything
  /// changes. The group count first, as it decides the length of the rest.
  void check_same_checkpoint(const saved_header& h) {
    Opt& o = self();
    const std::string_view advice = "Every rank must load the same checkpoint";
    const setting groups[] = {{"the checkpoint's number of groups", std::to_string(h.groups.size())}};
    require_same_settings(o.comm_, groups, advice);
    std::vector<setting> read = {
        {"the checkpoint's step counts", std::to_string(h.applied) + " applied, " + std::to_string(h.skipped) +
                                             " skipped, " + std::to_string(h.consecutive) + " in a row"},
        {"the checkpoint's loss scaler", h.scaler.save().dump()},
        {"the checkpoint's rounding seed", h.rounding_seed ? std::to_string(*h.rounding_seed) : "none"}};
    for (std::size_t g = 0; g < h.groups.size(); ++g)
      read.push_back({"the checkpoint's group " + std::to_string(g), "step " + std::to_string(h.group_steps[g]) + ", " +
                                                                         UpdateRule::to_json(h.groups[g]).dump()});
    require_same_settings(o.comm_, std::span<const setting>(read), advice);
  }

  /// Policies, scaler, counters and group layout: the metadata of a saved state.
  nlohmann::json describe() const {
    const Opt& o = self();
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& g : o.groups_) {
      nlohmann::json tensors = nlohmann::json::array();
      for (const auto& e : g->entries_) tensors.push_back({{"name", e.name}, {"size", e.size}});
      groups.push_back({{"options", UpdateRule::to_json(g->options_)}, {"step", g->step_}, {"tensors", tensors}});
    }
    nlohmann::json d = {{"precision", Precision::name},     {"loss_scaler", LossScaler::name},
                        {"partition", Partition::name},     {"rule", UpdateRule::name},
                        {"scaler", o.scaler_.save()},         {"applied_steps", o.counts_.applied},
                        {"skipped_steps", o.counts_.skipped},        {"consecutive_skips", o.counts_.consecutive_skips},
                        {"groups", groups}};
    // The stochastic rounding's seed: with the applied steps it resumes the same noise.
    if constexpr (std::is_same_v<rounding_of_t<Precision>, stochastic_rounding>)
      d["rounding_seed"] = o.options_.rounding_seed;
    const nlohmann::json kept = o.driver_.describe(o.comm_.size());  // what the rule's driver adds
    for (const auto& [key, value] : kept.items()) d[key] = value;
    return d;
  }

  /// Tensor t's state, of which this rank holds `mine`, whole on every rank. The all-gather
  /// concatenates the pieces in rank order: where that is not the tensor's order, the pieces are
  /// gathered aside and put in place.
  static void gather_tensor(Opt& o, std::size_t t, std::span<const float> mine, std::vector<float>& whole,
                            std::vector<float>& aside) {
    const std::vector<flat_layout::owned_range> pieces = o.layout_->pieces(t);
    std::vector<std::size_t> counts;
    std::size_t elements = 0, my_offset = 0;
    for (std::size_t r = 0; r < pieces.size(); ++r) {
      if (r < std::size_t(o.comm_.rank())) my_offset += pieces[r].count;
      counts.push_back(pieces[r].count);
      elements += pieces[r].count;
    }
    const bool in_place = o.layout_->shards_in_rank_order();
    std::vector<float>& into = in_place ? whole : aside;
    into.assign(elements, 0.0f);
    std::copy(mine.begin(), mine.end(), into.begin() + std::ptrdiff_t(my_offset));
    o.comm_.all_gather(std::span<float>(into), std::span<const std::size_t>(counts));
    if (in_place) return;
    whole.resize(elements);
    for (std::size_t r = 0, at = 0; r < pieces.size(); at += pieces[r++].count)
      std::copy_n(aside.begin() + std::ptrdiff_t(at), pieces[r].count, whole.begin() + std::ptrdiff_t(pieces[r].first));
  }

  /// Which part of a saved tensor a pointer holds: elements [first, first + count) of `elements`.
  struct saved_range {
    std::size_t tensor, elements, first, count;
    bool sharded = false;    ///< a shard's part: the other parts are on other ranks
    bool on_device = false;  ///< in the backend's device memory (tensors and state; not per-tensor scalars)
    /// A parameter's tensor (param, master, rule state): its registered shape, null when none was
    /// given. Null for anything else (per-tensor values), which the file holds as [elements].
    const tensor_shape* shape = nullptr;

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

  /// Calls f(key, range, pointer) for every tensor a state file holds, in file order: parameters
  /// whole, optimizer state as far as this rank holds it; pointers are const when self is. Before
  /// finalize() the state pointers are typed nulls: enough to check a file against this optimizer
  /// without committing to a layout.
  template <class Self, class F>
  static void for_each_saved_tensor(Self& self, F&& f) {
    std::size_t t = 0;
    for (const auto& g : self.groups_)
      for (const auto& e : g->entries_) {
        constexpr bool device = Backend::space == memory_space::device;
        const saved_range whole{t, e.size, 0, e.size, false, device, &e.shape};
        const auto o = self.finalized_ ? self.layout_->owned(t) : flat_layout::owned_range{};
        const saved_range held =
            self.finalized_ ? saved_range{t, e.size, o.first, o.count, self.layout_->sharded(), device, &e.shape} : whole;
        auto state = [&](auto& buffer) { return self.finalized_ ? buffer.data() + o.state : nullptr; };
        f("param/" + e.name, whole, e.param);
        if constexpr (Precision::has_master) f("master/" + e.name, held, state(self.master_));
        for (std::size_t k = 0; k < state_count; ++k)
          f(std::string(UpdateRule::state[k]) + "/" + e.name, held, state(self.state_[k]));
        ++t;
      }
    // What the rule's driver keeps per tensor (LAMB's tensor_state), one value each.
    const saved_range per_tensor{t, t, 0, t};
    Opt::driver::for_each_kept(self.driver_, [&](std::string key, auto* values) {
      f(std::move(key), per_tensor, self.finalized_ ? values : nullptr);
    });
  }
};

}  // namespace detail
}  // namespace mpopt
