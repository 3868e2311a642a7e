// mpopt — checkpoint writing and reading: the optimizer's save() and load(). Every parameter, fp32
// master and rule state buffer by tensor name, with the scaler, the counters and each group's
// options, in a safetensors file (docs/checkpoints.md; the container: state_file.hpp). Sharded
// state is gathered tensor by tensor on save and each rank reads its own part on load, so a file
// loads at any world size. The optimizer's save() and load() call checkpointing<its step pipeline>,
// declared in tensor_registry.hpp and defined here, which hands the optimizer's parts over as a
// checkpoint_subject (checkpoint_subject.hpp): its tensors without their types, and the parts that
// have types (the rule's options, the scaler, the driver's state). Everything else is compiled once,
// not once per optimizer type, and is all that needs a JSON library or <filesystem>:
// checkpoint_flow.hpp (the order of things), checkpoint_pieces.hpp (which pieces a file holds),
// checkpoint_io.hpp (writing and reading them) and saved_state.hpp (the metadata).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "../../error.hpp"
#include "../../loss_scale.hpp"
#include "../../options.hpp"
#include "../../precision.hpp"
#include "../../tensor.hpp"
#include "checkpoint_subject.hpp"
#include "../config.hpp"
#include "../options/field_refs.hpp"
#include "../options/fields_json.hpp"
#include "../comm/same_settings.hpp"
#include "../step/step_state.hpp"

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "checkpoint_flow.hpp"  // save_state() and load_state(), inline
#endif

namespace mpopt {

namespace detail {

template <class Pipeline>
class checkpointing {
  using Precision = typename Pipeline::precision;
  using LossScaler = typename Pipeline::loss_scaler;
  using Partition = typename Pipeline::partition;
  using UpdateRule = typename Pipeline::rule;
  using Backend = typename Pipeline::backend_type;
  using driver = typename Pipeline::driver_type;

 public:
  /// The optimizer's save() and load() (optimizer.hpp says what they do), to and from a path, bytes
  /// or a stream (target_of, source_of).
  template <class Where>
  static void save(Pipeline& p, Where& where) {
    subject s(p);
    save_state(s, target_of(where));
  }
  template <class From>
  static void load(Pipeline& p, From& from, const load_options& lo) {
    subject s(p);
    load_state(s, source_of(from), lo);
  }

 private:

  /// The optimizer's parts (step_state.hpp) as checkpoint_flow.hpp sees them; on load, the file's
  /// typed parts until restore().
  class subject final : public checkpoint_subject {
   public:
    explicit subject(Pipeline& p) : p_(p), scaler_(p.scaler) {}

    MPOPT_COLD int rank() const override { return p_.comms.comm.rank(); }
    MPOPT_COLD int world() const override { return p_.comms.comm.size(); }
    MPOPT_COLD void all_gather(std::span<float> data, std::span<const std::size_t> counts) override {
      p_.comms.comm.all_gather(data, counts);
    }
    MPOPT_COLD void all_gather(std::span<std::uint8_t> data, std::span<const std::size_t> counts) override {
      p_.comms.comm.all_gather(data, counts);
    }
    MPOPT_COLD void to_host(std::byte* dst, const std::byte* src, std::size_t bytes) override {
      p_.backend.to_host(dst, src, bytes);
    }
    MPOPT_COLD void to_device(std::byte* dst, const std::byte* src, std::size_t bytes) override {
      p_.backend.to_device(dst, src, bytes);
      p_.wait();
    }
    MPOPT_COLD void agree(std::string_view what, const std::function<void()>& f) override { p_.agree(what, f); }

    MPOPT_COLD std::string_view rule_name() const override { return UpdateRule::name; }
    MPOPT_COLD bool finalized() const override { return p_.finalized(); }
    MPOPT_COLD int micro_step() const override { return p_.progress.micro_step; }
    MPOPT_COLD int accumulation_steps() const override { return p_.options.accumulation_steps; }
    MPOPT_COLD void at(const char* call) override { p_.comms.comm.at(call, p_.next_step() - 1); }
    MPOPT_COLD void finish_step() override {
      p_.require_params_waited("save()");
      p_.finish_step();
    }
    MPOPT_COLD void prepare_to_read() override {
      p_.finalize();
      p_.wait_params(Pipeline::every_tensor);  // no gather in flight may land on what is read
    }

    MPOPT_COLD checkpoint_view view() const override {
      checkpoint_view v;
      for (const auto& g : p_.groups()) {
        auto& group = v.groups.emplace_back();
        group.expert_parallel = g->expert_parallel();
        group.state_keys = state_names<UpdateRule>(g->options_);
        if (p_.finalized()) group.state_shift = p_.state.buffers.shift[g->index_];
        for (const auto& p : p_.comms.placement)
          if (p.group == g->index_) group.experts = &p;
        for (const auto& e : g->entries_) group.tensors.push_back({&e.name, e.size, &e.shape, untyped::of(e.param)});
      }
      auto base = [&](const auto& buffer) { return untyped::of(p_.finalized() ? buffer.data() : nullptr); };
      v.layout = p_.finalized() ? &*p_.state.layout : nullptr;
      v.world = std::size_t(p_.comms.comm.size());
      v.has_master = Precision::has_master;
      if constexpr (Precision::has_master) v.master = base(p_.state.master);
      v.master_storage = *format_named(master_formats, master_storage_t<Precision>::name);
      v.state_storage = state_format_of();
      for (std::size_t k = 0; k < UpdateRule::state.size(); ++k) {
        auto& b = v.state.emplace_back();
        b.key = UpdateRule::state[k];
        b.data = base(p_.state.moments[k]);
        if constexpr (state_in_blocks<Precision>) b.scales = base(p_.state.scales[k]);
        b.nonnegative = nonnegative(k);
      }
      driver::for_each_kept(p_.driver, [&](std::string key, const auto* values) {
        v.kept.emplace_back(std::move(key), untyped::of(p_.finalized() ? values : nullptr));
      });
      v.tensors_on_device = tensor_space_of<Backend>() == memory_space::device;
      v.state_on_device = Backend::space == memory_space::device;
      return v;
    }

    MPOPT_COLD int replicas() const override {
      return p_.comms.comm.size() > 1 && driver::replicas_differ(p_.groups()) ? p_.comms.comm.size() : 0;
    }

    MPOPT_COLD typed_metadata metadata() override {
      typed_metadata m;
      m.policies = {Precision::name,    state_storage_t<Precision>::name, master_storage_t<Precision>::name,
                    LossScaler::name, Partition::name,                   UpdateRule::name};
      scaler_state_ = p_.scaler.save();
      m.scaler = field_refs(scaler_state_);
      m.counts = p_.progress.counts;
      for (const auto& g : p_.groups()) {
        m.group_options.push_back(field_refs(g->options_));
        m.group_steps.push_back(g->step_);
      }
      if constexpr (rounds_stochastically<Precision>) m.rounding_seed = p_.options.rounding_seed;
      if (p_.progress.guard.on()) m.guard = p_.progress.guard.save();
      m.schedule.schedule = p_.schedule;
      for (const auto& g : p_.groups()) m.schedule.base_lrs.push_back(g->base_lr_);
      return m;
    }
    MPOPT_COLD void describe_driver(nlohmann::json& meta) const override {
      // Only the compressing drivers record anything; they include <nlohmann/json.hpp>.
      if constexpr (requires { &driver::describe; }) meta = p_.driver.describe(p_.comms.comm.size());
    }

    MPOPT_COLD std::vector<std::pair<std::string, std::size_t>> extras() const override {
      std::vector<std::pair<std::string, std::size_t>> extras;
      p_.driver.for_each_extra(p_.comms.comm.size(), [&](std::string key, std::size_t elements) {
        extras.emplace_back(std::move(key), elements);
      });
      return extras;
    }
    MPOPT_COLD void save_extras(const std::function<void(std::span<const std::byte>)>& write) override {
      p_.driver.save_extra(p_.comms.comm, p_.backend, write);
    }

    MPOPT_COLD void encode_state(std::size_t k, std::span<const float> x, std::byte* data, float* scales) const override {
      using S = state_storage_t<Precision>;
      if constexpr (state_in_blocks<Precision>) {
        auto* codes = reinterpret_cast<std::uint8_t*>(data);
        for (std::size_t b = 0; b < x.size(); b += S::block)
          quantize_block<S, void>(x.data() + b, std::min(S::block, x.size() - b), nonnegative(k),
                                  codes + code_bytes<S>(b), scales + b / S::block);
      } else {
        (void)scales;
        auto* out = reinterpret_cast<typename S::element*>(data);
        for (std::size_t j = 0; j < x.size(); ++j) out[j] = typename S::element(x[j]);  // bf16: to nearest
      }
    }

    MPOPT_COLD void read_group_options(const nlohmann::json& options) override {
      groups_.push_back(options_from_json<typename UpdateRule::options>(options, ""));
    }
    MPOPT_COLD void validate_group_options(const std::string& where) override {
      check_options(groups_.back(), where);
      // Under a rule set, a group keeps the rule it was saved with.
      const std::size_t g = groups_.size() - 1;
      if (g >= p_.groups().size()) return;  // the group count is refused by its own check
      const std::string_view saved = detail::rule_name<UpdateRule>(groups_.back());
      const std::string_view mine = detail::rule_name<UpdateRule>(p_.groups()[g]->options_);
      if (saved != mine)
        fail(where, " was saved under ", saved, ", and this optimizer's takes ", mine,
             ": each group loads the state of its own rule");
    }
    MPOPT_COLD void check_schedule(const lr_schedule& s) const override { Pipeline::check_schedule(s); }
    MPOPT_COLD void read_scaler(const nlohmann::json& saved, std::uint64_t steps, const std::string& where) override {
      scaler_.load(options_from_json<typename LossScaler::state>(saved, "saved " + std::string(LossScaler::name) + "."));
      if constexpr (counts_iterations<LossScaler>)  // one scaler update per boundary
        if (std::uint64_t(scaler_.iteration()) > steps)
          fail(where, "saved dynamic_scale.iter (", scaler_.iteration(), ") exceeds the steps taken (", steps, ")");
    }
    MPOPT_COLD void read_driver(const nlohmann::json& meta, const state_reader& r, const std::string& where,
                     const load_options& lo, std::uint64_t applied, std::span<const std::size_t> sizes) override {
      driver_ = p_.driver.check_saved(meta, r, where, lo, applied, p_.comms.comm.size(), sizes);
    }
    MPOPT_COLD std::string read_scaler_text() const override { return options_text(scaler_.save()); }
    MPOPT_COLD std::string read_group_text(std::size_t g) const override { return options_text(groups_[g]); }
    MPOPT_COLD void require_same(std::span<const setting> settings, std::string_view advice) override {
      require_same_settings(p_.comms.comm, settings, advice);
    }

    MPOPT_COLD std::vector<std::uint64_t> tensors_held() override {
      std::vector<std::uint64_t> held(p_.groups().size(), 0);
      for (std::size_t g = 0; g < held.size(); ++g) {
        const auto& group = *p_.groups()[g];
        const bool counts = group.expert_parallel() ? p_.comms.of_index(group.comm_)->rank() == 0 : p_.comms.comm.rank() == 0;
        held[g] = counts ? group.size() : 0;  // a set of experts once: at its communicator's rank 0
      }
      p_.comms.comm.all_reduce(std::span<std::uint64_t>(held), reduce_op::sum);
      return held;
    }

    MPOPT_COLD void restore(const saved_counts& h, std::span<const std::uint64_t> group_steps,
                            const std::function<void(const std::string&, std::size_t, const untyped&, std::size_t, bool)>&
                                read) override {
      p_.backend.params_in(p_.data());  // where the backend's passes read them (offload.hpp)
      p_.driver.restore(driver_, p_.comms.comm, [&]<class T>(const std::string& key, std::size_t first, T* dst,
                                                         std::size_t count, bool on_device) {
        read(key, first, untyped::of(dst), count, on_device);
      });
      p_.comms.comm.take_bytes();
      p_.progress.micro_step = 0;  // the saved state sits at an accumulation boundary
      p_.progress.pending = pending_stage::none;  // every parameter was just read
      p_.scaler = scaler_;
      for (std::size_t g = 0; g < p_.groups().size(); ++g) {
        p_.groups()[g]->options_ = groups_[g];
        p_.groups()[g]->step_ = group_steps[g];
      }
      p_.progress.counts = {h.applied, h.skipped, h.consecutive};
      p_.progress.guard.restore(h.guard);  // a file without the guard's windows starts them empty
      if (h.rounding_seed) p_.options.rounding_seed = *h.rounding_seed;
      if (h.schedule) {
        p_.schedule = h.schedule->schedule;
        for (std::size_t g = 0; g < p_.groups().size(); ++g) p_.groups()[g]->base_lr_ = h.schedule->base_lrs[g];
      }
    }

   private:
    static bool nonnegative(std::size_t k) { return (nonnegative_state_bits<UpdateRule>() >> k) & 1u; }
    /// The file's description of the state storage, which must be the storage's own.
    static constexpr state_format state_format_of() {
      using S = state_storage_t<Precision>;
      constexpr state_format f = *format_named(state_formats, S::name);
      if constexpr (state_in_blocks<Precision>) static_assert(f.bits == S::bits && f.block == S::block);
      else static_assert(f.bits == 8 * sizeof(typename S::element) && f.block == 0);
      static_assert(f.dtype == state_dtype<typename S::element>::value);
      return f;
    }

    Pipeline& p_;
    LossScaler scaler_;
    typename LossScaler::state scaler_state_{};  // what metadata() describes
    std::vector<typename UpdateRule::options> groups_;
    typename driver::saved driver_;
  };
};

}  // namespace detail
}  // namespace mpopt
