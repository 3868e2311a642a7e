// mpopt — checkpoint writing and reading: the optimizer's save() and load(). Every parameter, fp32
// master and rule state buffer by tensor name, with the scaler, the counters and each group's
// options, in a safetensors file (README, "Checkpoints"; the container: state_file.hpp). Sharded
// state is gathered tensor by tensor on save and each rank reads its own part on load, so a file
// loads at any world size. The optimizer derives from checkpointing<itself, its policies>, which
// lists its tensors for checkpoint_io.hpp to write and read; what does not depend on the policies is
// there and in saved_state.hpp.
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
  static constexpr std::size_t state_count = UpdateRule::state.size();

 public:
  /// Writes every parameter, master and moment by tensor name, with the scaler, counters and group
  /// options, to a safetensors file (format: README, "Checkpoints"); of expert groups, every rank's
  /// experts. Every rank calls it; rank 0 writes, tensor by tensor as those held elsewhere are
  /// gathered (one at a time), and a failure there throws on every rank.
  void save(const std::filesystem::path& path) {
    Opt& o = self();
    if (!o.finalized_) fail("save(): nothing to save before the first step (or finalize())");
    if (o.micro_step_ != 0)
      fail("save() at micro-step ", o.micro_step_, " of ", o.options_.accumulation_steps,
           ": save after the accumulation boundary");
    o.comm_.at("save()", o.next_step() - 1);
    o.finish_step();
    std::vector<state_piece> pieces;  // in file order: each rank's copy where the replicas differ
    for (int r = 0; r < std::max(1, replicas(o)); ++r)
      for_each_file_tensor(o, [&](std::string key, const saved_range& range, const auto* data, const auto& senders) {
        pieces.push_back({std::move(key), range, untyped::of(data), senders});
      }, r);
    std::vector<state_stream::tensor> extras;  // what the rule's driver keeps besides (1-bit LAMB's errors)
    o.driver_.for_each_extra(o.comm_.size(), [&](std::string key, std::size_t elements) {
      extras.push_back({std::move(key), "F32", {std::int64_t(elements)}});
    });
    io channel(o);
    write_state(channel, path, [&] { return describe(); }, pieces, std::move(extras),
                [&](const auto& write) { o.driver_.save_extra(o.comm_, o.backend_, write); });
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
    io channel(o);
    std::vector<std::byte> staged;  // a tensor for device memory, read on the host first
    read_state(*file, channel, saved_pieces(o, saved.kept_at, saved.file_tensors), saved.replica, staged);
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

  /// My pieces of a state file as load() reads them (for_each_saved_tensor).
  static std::vector<state_piece> saved_pieces(Opt& o, const std::vector<std::size_t>& kept_at, std::size_t file_tensors) {
    std::vector<state_piece> pieces;
    for_each_saved_tensor(o, kept_at, file_tensors, [&](std::string key, const saved_range& range, auto* data) {
      pieces.push_back({std::move(key), range, untyped::of(data), {}});
    });
    return pieces;
  }

  /// What load() takes from a file besides the tensors.
  struct saved_header : saved_counts {
    LossScaler scaler{typename LossScaler::options{}};
    std::vector<typename UpdateRule::options> groups;
    std::vector<std::uint64_t> group_steps;
    typename Opt::driver::saved driver;  // what the rule's driver keeps besides
    /// Where each of my tensors is among the file's (per-tensor values are saved in that order).
    std::vector<std::size_t> kept_at;
    std::size_t file_tensors = 0;
    std::vector<std::uint64_t> group_tensors;  // per group: the tensors the file holds of it
    int replica = 0;  ///< the rank whose copy this rank reads (replicas_differ), else 0
  };

  /// How many ranks' copies save() writes: every rank's where the rule's driver says the replicas
  /// differ (0/1 Adam between synchronisations), else 0 (rank 0's alone, as every rank's).
  static int replicas(const Opt& o) {
    return o.comm_.size() > 1 && Opt::driver::replicas_differ(o.groups_) ? o.comm_.size() : 0;
  }

  /// Checks a state file against this optimizer (policies, groups, tensor names, sizes, dtypes) and
  /// parses its header, changing nothing.
  saved_header check_saved(const state_reader& r, const std::string& where, const load_options& lo = {}) {
    Opt& o = self();
    saved_header h;
    h.scaler = o.scaler_;
    try {
      const nlohmann::json& meta = r.metadata();
      const nlohmann::json mine = describe();
      check_saved_policies(meta, mine, where);
      const auto& groups = meta.at("groups");
      if (groups.size() != o.groups_.size())
        fail(where, "saved with ", groups.size(), " groups, this optimizer has ", o.groups_.size());
      std::size_t file_tensors = 0;
      for (std::size_t g = 0; g < groups.size(); ++g) {
        const nlohmann::json& saved = groups[g].at("tensors");
        if (o.groups_[g]->expert_parallel()) {
          std::vector<std::pair<std::string, std::size_t>> experts;
          for (const auto& e : o.groups_[g]->entries_) experts.emplace_back(e.name, e.size);
          find_experts(experts, saved, file_tensors, h.kept_at, where + "expert group " + std::to_string(g) + ": ");
        } else if (saved != mine["groups"][g]["tensors"]) {
          fail(where, "group ", g, " holds different tensors: saved ", saved.dump(), ", this optimizer has ",
               mine["groups"][g]["tensors"].dump());
        } else {
          for (std::size_t i = 0; i < saved.size(); ++i) h.kept_at.push_back(file_tensors + i);
        }
        file_tensors += saved.size();
        h.group_tensors.push_back(saved.size());
      }
      h.file_tensors = file_tensors;
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
      for (const auto& g : o.groups_)
        for (const auto& e : g->entries_) elements += e.size;
      h.driver = o.driver_.check_saved(meta, r, where, lo, h.applied, o.comm_.size(), elements);
      h.replica = saved_replica(meta, lo, o.comm_.rank(), o.comm_.size(), UpdateRule::name, where);
    } catch (const nlohmann::json::exception& e) {
      fail(where, "malformed optimizer metadata: ", e.what());
    } catch (const error& e) {
      if (e.message().starts_with(where)) throw;
      fail(where, e.message());
    }
    check_saved_pieces(r, saved_pieces(o, h.kept_at, h.file_tensors), h.replica, where);
    return h;
  }

  /// Ranks that read different files would train apart: what each read must o.agree, before anything
  /// changes. The group count first, as it decides the length of the rest.
  void check_same_checkpoint(const saved_header& h) {
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
    o.agree("load", [&] { check_groups_held(held, h.group_tensors); });
  }

  /// Policies, scaler, counters and group layout: the metadata of a saved state.
  nlohmann::json describe() const {
    const Opt& o = self();
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& g : o.groups_) {
      nlohmann::json tensors = nlohmann::json::array();
      const expert_placement* p = o.finalized_ ? placement_of(o, g->index_) : nullptr;
      for (std::size_t e = 0; e < (p ? p->size() : 1); ++e)  // an expert group: every set of experts
        for (std::size_t j = 0; j < g->entries_.size(); ++j)
          add_saved_tensor(tensors, p ? std::string(p->name(e, j)) : g->entries_[j].name, g->entries_[j].size);
      groups.push_back(saved_group(UpdateRule::to_json(g->options_), g->step_, std::move(tensors)));
    }
    std::optional<std::uint64_t> seed;
    if constexpr (std::is_same_v<rounding_of_t<Precision>, stochastic_rounding>) seed = o.options_.rounding_seed;
    return state_metadata({Precision::name, LossScaler::name, Partition::name, UpdateRule::name}, o.scaler_.save(),
                          o.counts_, std::move(groups), seed, replicas(o),
                          o.guard_.on() ? o.guard_.save() : nlohmann::json(), o.driver_.describe(o.comm_.size()));
  }

  /// The placement of expert group g; null for any other group.
  static const expert_placement* placement_of(const Opt& o, std::size_t g) {
    for (const auto& p : o.experts_)
      if (p.group == g) return &p;
    return nullptr;
  }

  /// Calls f(key, range, pointer) for every tensor of this rank a state file holds: parameters
  /// whole, optimizer state as far as this rank holds it, and the per-tensor values of the rule's
  /// driver (found in the file at kept_at, each tensor's position among its file_tensors); pointers are const when
  /// self is. Before finalize() the state pointers are typed nulls: enough to check a file against
  /// this optimizer without committing to a layout.
  template <class Self, class F>
  static void for_each_saved_tensor(Self& self, const std::vector<std::size_t>& kept_at, std::size_t file_tensors,
                                    F&& f) {
    std::size_t t = 0;
    for (const auto& g : self.groups_)
      for (const auto& e : g->entries_) {
        const saved_range whole{t, e.size, 0, e.size, false, tensors_on_device, &e.shape};
        const auto o = self.finalized_ ? self.layout_->owned(t) : flat_layout::owned_range{};
        const saved_range held =
            self.finalized_ ? saved_range{t, e.size, o.first, o.count, self.layout_->sharded(), state_on_device, &e.shape} : whole;
        auto state = [&](auto& buffer) { return self.finalized_ ? buffer.data() + o.state : nullptr; };
        f("param/" + e.name, whole, e.param);
        if constexpr (Precision::has_master) f("master/" + e.name, held, state(self.master_));
        for (std::size_t k = 0; k < state_count; ++k)
          f(std::string(UpdateRule::state[k]) + "/" + e.name, held, state(self.state_[k]));
        ++t;
      }
    // What the rule's driver keeps per tensor (LAMB's tensor_state), one value each, of the file's
    // file_tensors.
    const saved_range per_tensor{t, file_tensors, 0, t, false, false, nullptr, &kept_at};
    Opt::driver::for_each_kept(self.driver_, [&](std::string key, auto* values) {
      f(std::move(key), per_tensor, self.finalized_ ? values : nullptr);
    });
  }

  /// Calls f(key, range, pointer, senders) for every tensor save() writes, in file order: each
  /// group's tensors, and of an expert group those of every set of experts, set after set (a
  /// checkpoint holds what one process holding every expert would save); then the per-tensor values
  /// of the rule's driver, in the same order, a set at a time. The pointer is to this rank's copy,
  /// null where it holds another set; senders[r] is the part rank r sends to the writer (assemble).
  ///
  /// With replica r > 0: rank r's copy of each parameter, master and state tensor (replica_key), and
  /// nothing else (replicas differ only where no group is sharded or of experts: replicas_differ).
  static void for_each_file_tensor(Opt& o, auto&& f, int replica = 0) {
    using range = flat_layout::owned_range;
    const auto w = std::size_t(o.comm_.size());
    std::vector<range> senders(w);
    auto from = [&](std::size_t rank, std::size_t n) -> const std::vector<range>& {
      std::fill(senders.begin(), senders.end(), range{});
      if (rank >= w) fail("checkpoint: no rank ", rank, " among ", w);  // an invariant, stated for g++'s -Warray-bounds
      senders[rank] = {0, n, 0};
      return senders;
    };
    // Group g's tensor t, of set e: where each rank's part of its state is.
    auto state_senders = [&](const expert_placement* p, std::size_t e, std::size_t t, std::size_t n) -> const std::vector<range>& {
      if (replica) return from(std::size_t(replica), n);
      if (!o.layout_->sharded()) return from(p ? p->first_replica(e) : 0, n);
      const auto pieces = o.layout_->pieces(t);
      for (std::size_t r = 0; r < w; ++r)
        senders[r] = !p ? pieces[r] : p->ep_of[r] == e ? pieces[p->replica_of[r]] : range{};
      return senders;
    };
    std::size_t first = 0;  // the group's first tensor
    for (const auto& g : o.groups_) {
      const expert_placement* p = placement_of(o, g->index_);
      for (std::size_t e = 0; e < (p ? p->size() : 1); ++e)
        for (std::size_t j = 0; j < g->entries_.size(); ++j) {
          const auto& entry = g->entries_[j];
          const std::size_t t = first + j;
          const bool mine = !p || e == p->mine;
          const std::string entry_name = p ? std::string(p->name(e, j)) : entry.name;
          const auto own = o.layout_->owned(t);
          const saved_range whole{t, entry.size, 0, entry.size, false, tensors_on_device, &entry.shape};
          const saved_range held{t, entry.size, own.first, own.count, o.layout_->sharded(), state_on_device, &entry.shape};
          auto state = [&](auto& buffer) { return mine ? buffer.data() + own.state : nullptr; };
          const std::size_t param_sender = replica ? std::size_t(replica) : p ? p->first_replica(e) : 0;
          f(replica_key(replica, "param/" + entry_name), whole, mine ? entry.param : nullptr, from(param_sender, entry.size));
          if constexpr (Precision::has_master)
            f(replica_key(replica, "master/" + entry_name), held, state(o.master_), state_senders(p, e, t, entry.size));
          for (std::size_t k = 0; k < state_count; ++k)
            f(replica_key(replica, std::string(UpdateRule::state[k]) + "/" + entry_name), held, state(o.state_[k]),
              state_senders(p, e, t, entry.size));
        }
      first += g->entries_.size();
    }
    if (replica) return;
    std::size_t file_tensors = 0;
    for (const auto& g : o.groups_) {
      const expert_placement* p = placement_of(o, g->index_);
      file_tensors += g->entries_.size() * (p ? p->size() : 1);
    }
    Opt::driver::for_each_kept(o.driver_, [&](std::string key, auto* values) {
      std::size_t t = 0, at = 0;
      for (const auto& g : o.groups_) {
        const expert_placement* p = placement_of(o, g->index_);
        const std::size_t n = g->entries_.size();
        for (std::size_t e = 0; e < (p ? p->size() : 1); ++e, at += n) {
          const saved_range run{t, file_tensors, at, n, false, false, nullptr, nullptr, true};
          f(key, run, !p || e == p->mine ? values + t : nullptr, from(p ? p->first_replica(e) : 0, n));
        }
        t += n;
      }
    });
  }

  static constexpr bool state_on_device = Backend::space == memory_space::device;
  static constexpr bool tensors_on_device = tensor_space_of<Backend>() == memory_space::device;
};

}  // namespace detail
}  // namespace mpopt
