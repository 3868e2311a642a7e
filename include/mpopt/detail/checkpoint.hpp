// mpopt — checkpoint writing and reading: the optimizer's save() and load(). Every parameter, fp32
// master and rule state buffer by tensor name, with the scaler, the counters and each group's
// options, in a safetensors file (README, "Checkpoints"; the container: state_file.hpp). Sharded
// state is gathered tensor by tensor on save and each rank reads its own part on load, so a file
// loads at any world size. The optimizer derives from checkpointing<itself, its policies>, which
// describes its tensors without their types (a checkpoint_view) and does what needs the types: the
// rule's options, the scaler, the driver's state. The rest is compiled once, not once per optimizer
// type: checkpoint_pieces.hpp (which pieces a file holds), checkpoint_io.hpp (writing and reading
// them) and saved_state.hpp (the metadata).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "../error.hpp"
#include "../options.hpp"
#include "../precision.hpp"
#include "../rule.hpp"
#include "../tensor.hpp"
#include "checkpoint_io.hpp"
#include "checkpoint_pieces.hpp"
#include "config.hpp"
#include "expert_placement.hpp"
#include "flat_layout.hpp"
#include "json_fields.hpp"
#include "same_settings.hpp"
#include "saved_state.hpp"
#include "spike_guard.hpp"
#include "state_file.hpp"
#include "tensor_registry.hpp"

namespace mpopt {

namespace detail {

template <class Opt, class Precision, class LossScaler, class Partition, class UpdateRule, class Backend>
class checkpointing {
 public:
  /// Writes every parameter, master and moment by tensor name, with the scaler, counters and group
  /// options, to a safetensors file (format: README, "Checkpoints"); of expert groups, every rank's
  /// experts. Every rank calls it; rank 0 writes, tensor by tensor as those held elsewhere are
  /// gathered (one at a time), and a failure there throws on every rank.
  MPOPT_COLD void save(const std::filesystem::path& path) {
    Opt& o = self();
    if (!o.finalized_) fail("save(): nothing to save before the first step (or finalize())");
    if (o.micro_step_ != 0)
      fail("save() at micro-step ", o.micro_step_, " of ", o.options_.accumulation_steps,
           ": save after the accumulation boundary");
    o.comm_.at("save()", o.next_step() - 1);
    o.finish_step();
    const checkpoint_view v = view();
    std::vector<state_piece> pieces;  // in file order: each rank's copy where the replicas differ
    for (int r = 0; r < std::max(1, replicas(o)); ++r) {
      std::vector<state_piece> copy = file_pieces(v, r);
      pieces.insert(pieces.end(), std::make_move_iterator(copy.begin()), std::make_move_iterator(copy.end()));
    }
    std::vector<state_stream::tensor> extras;  // what the rule's driver keeps besides (1-bit LAMB's errors)
    o.driver_.for_each_extra(o.comm_.size(), [&](std::string key, std::size_t elements) {
      extras.push_back({std::move(key), "F32", {std::int64_t(elements)}});
    });
    io channel(o);
    write_state(channel, path, [&] { return describe(v); }, pieces, std::move(extras),
                [&](const auto& write) { o.driver_.save_extra(o.comm_, o.backend_, write); });
  }

  /// Restores a save()d state. The file must come from an optimizer of the same policies and the same
  /// tensors (names, sizes, groups), saved at any world size. Every rank reads and checks it; only
  /// when all ranks found it good does anything change, otherwise every rank throws.
  MPOPT_COLD void load(const std::filesystem::path& path, load_options lo = {}) {
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
    io channel(o);
    std::vector<std::byte> staged;  // a tensor for device memory, read on the host first
    read_state(*file, channel, held_pieces(view(), saved.found.kept_at, saved.found.file_tensors), saved.replica,
               staged);
    auto read = [&]<class T>(const std::string& key, std::size_t first, T* dst, std::size_t count, bool on_device) {
      read_piece(*file, channel, key, first, untyped::of(dst), count, on_device, staged);
    };
    o.backend_.params_in(o.data());  // where the backend's passes read them (offload.hpp)
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
    o.guard_.restore(saved.guard);  // a file without the guard's windows starts them empty
    if (saved.rounding_seed) o.options_.rounding_seed = *saved.rounding_seed;
  }

 private:
  Opt& self() { return static_cast<Opt&>(*this); }
  const Opt& self() const { return static_cast<const Opt&>(*this); }

  /// The optimizer's communicator and backend, for save() and load()'s data movement.
  class io final : public checkpoint_io {
   public:
    explicit io(Opt& o) : o_(o) {}
    int rank() const override { return o_.comm_.rank(); }
    void all_gather(std::span<float> data, std::span<const std::size_t> counts) override {
      o_.comm_.all_gather(data, counts);
    }
    void all_gather(std::span<std::uint8_t> data, std::span<const std::size_t> counts) override {
      o_.comm_.all_gather(data, counts);
    }
    void to_host(std::byte* dst, const std::byte* src, std::size_t bytes) override { o_.backend_.to_host(dst, src, bytes); }
    void to_device(std::byte* dst, const std::byte* src, std::size_t bytes) override {
      o_.backend_.to_device(dst, src, bytes);
      o_.wait();
    }
    void agree(std::string_view what, const std::function<void()>& f) override { o_.agree(what, f); }

   private:
    Opt& o_;
  };

  /// The optimizer's tensors and state without their types (checkpoint_pieces.hpp lists a file's
  /// pieces from it). Before finalize() its state pointers are null.
  MPOPT_COLD checkpoint_view view() const {
    const Opt& o = self();
    checkpoint_view v;
    for (const auto& g : o.groups_) {
      auto& group = v.groups.emplace_back();
      group.expert_parallel = g->expert_parallel();
      for (const auto& p : o.experts_)
        if (p.group == g->index_) group.experts = &p;
      for (const auto& e : g->entries_) group.tensors.push_back({&e.name, e.size, &e.shape, untyped::of(e.param)});
    }
    auto base = [&](const auto& buffer) { return untyped::of(o.finalized_ ? buffer.data() : nullptr); };
    v.layout = o.finalized_ ? &*o.layout_ : nullptr;
    v.world = std::size_t(o.comm_.size());
    v.has_master = Precision::has_master;
    if constexpr (Precision::has_master) v.master = base(o.master_);
    for (std::size_t k = 0; k < UpdateRule::state.size(); ++k)
      v.state.emplace_back(UpdateRule::state[k], base(o.state_[k]));
    Opt::driver::for_each_kept(o.driver_, [&](std::string key, const auto* values) {
      v.kept.emplace_back(std::move(key), untyped::of(o.finalized_ ? values : nullptr));
    });
    v.tensors_on_device = tensor_space_of<Backend>() == memory_space::device;
    v.state_on_device = Backend::space == memory_space::device;
    return v;
  }

  /// What load() takes from a file besides the tensors.
  struct saved_header : saved_counts {
    LossScaler scaler{typename LossScaler::options{}};
    std::vector<typename UpdateRule::options> groups;
    std::vector<std::uint64_t> group_steps;
    typename Opt::driver::saved driver;  // what the rule's driver keeps besides
    found_tensors found;  // where my tensors are among the file's
    int replica = 0;  ///< the rank whose copy this rank reads (replicas_differ), else 0
  };

  /// How many ranks' copies save() writes: every rank's where the rule's driver says the replicas
  /// differ (0/1 Adam between synchronisations), else 0 (rank 0's alone, as every rank's).
  static int replicas(const Opt& o) {
    return o.comm_.size() > 1 && Opt::driver::replicas_differ(o.groups_) ? o.comm_.size() : 0;
  }

  /// Checks a state file against this optimizer (policies, groups, tensor names, sizes, dtypes) and
  /// parses its header, changing nothing.
  MPOPT_COLD saved_header check_saved(const state_reader& r, const std::string& where, const load_options& lo = {}) {
    Opt& o = self();
    const checkpoint_view v = view();
    saved_header h;
    h.scaler = o.scaler_;
    try {
      const nlohmann::json& meta = r.metadata();
      const nlohmann::json mine = describe(v);
      check_saved_policies(meta, mine, where);
      const auto& groups = meta.at("groups");
      h.found = find_saved_tensors(v, groups, mine["groups"], where);
      // Every number through an exact type and range check (json_fields.hpp), then the checks the
      // options get from the constructor: nothing in the file reaches a conversion or a step unchecked.
      static_cast<saved_counts&>(h) = read_saved_counts(meta, where);
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
      for (const auto& g : v.groups)
        for (const auto& e : g.tensors) elements += e.size;
      h.driver = o.driver_.check_saved(meta, r, where, lo, h.applied, o.comm_.size(), elements);
      h.replica = saved_replica(meta, lo, o.comm_.rank(), o.comm_.size(), UpdateRule::name, where);
    } catch (const nlohmann::json::exception& e) {
      fail(where, "malformed optimizer metadata: ", e.what());
    } catch (const error& e) {
      if (e.message().starts_with(where)) throw;
      fail(where, e.message());
    }
    check_saved_pieces(r, held_pieces(v, h.found.kept_at, h.found.file_tensors), h.replica, where);
    return h;
  }

  /// Ranks that read different files would train apart: what each read must o.agree, before anything
  /// changes. The group count first, as it decides the length of the rest.
  MPOPT_COLD void check_same_checkpoint(const saved_header& h) {
    Opt& o = self();
    const setting groups[] = {{"the checkpoint's number of groups", std::to_string(h.groups.size())}};
    require_same_settings(o.comm_, groups, same_checkpoint_advice);
    std::vector<std::string> group_settings;
    for (std::size_t g = 0; g < h.groups.size(); ++g)
      group_settings.push_back("step " + std::to_string(h.group_steps[g]) + ", " + UpdateRule::to_json(h.groups[g]).dump());
    const std::vector<setting> read = loaded_settings(h, h.scaler.save().dump(), group_settings);
    require_same_settings(o.comm_, std::span<const setting>(read), same_checkpoint_advice);
    // Each rank found its experts in the file; together the sets of experts (counted once, at
    // their communicators' rank 0) must hold all of the file's, or some would be dropped. (Every
    // rank has the file's number of groups: check_saved.)
    std::vector<std::uint64_t> held(o.groups_.size(), 0);
    for (std::size_t g = 0; g < held.size(); ++g)
      if (o.groups_[g]->expert_parallel())
        held[g] = o.expert_comms_[o.groups_[g]->comm_ - 1]->rank() == 0 ? o.groups_[g]->size() : 0;
      else
        held[g] = o.comm_.rank() == 0 ? o.groups_[g]->size() : 0;
    o.comm_.all_reduce(std::span<std::uint64_t>(held), reduce_op::sum);
    o.agree("load", [&] { check_groups_held(held, h.found.group_tensors); });
  }

  /// Policies, scaler, counters and group layout: the metadata of a saved state.
  MPOPT_COLD nlohmann::json describe(const checkpoint_view& v) const {
    const Opt& o = self();
    std::vector<nlohmann::json> options;
    std::vector<std::uint64_t> steps;
    for (const auto& g : o.groups_) {
      options.push_back(UpdateRule::to_json(g->options_));
      steps.push_back(g->step_);
    }
    std::optional<std::uint64_t> seed;
    if constexpr (std::is_same_v<rounding_of_t<Precision>, stochastic_rounding>) seed = o.options_.rounding_seed;
    return state_metadata({Precision::name, LossScaler::name, Partition::name, UpdateRule::name}, o.scaler_.save(),
                          o.counts_, saved_groups(v, options, steps), seed, replicas(o),
                          o.guard_.on() ? o.guard_.save() : nlohmann::json(), o.driver_.describe(o.comm_.size()));
  }
};

}  // namespace detail
}  // namespace mpopt
