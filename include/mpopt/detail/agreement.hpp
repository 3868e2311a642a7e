// mpopt — agreement across ranks: an outcome every rank shares (agree), the settings every rank
// must hold alike before any gradient moves (check_same_settings), and 1-bit LAMB's preflight of
// the communicator. The optimizer derives from agreement<itself, its policies>.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "../communicator.hpp"
#include "../error.hpp"
#include "../options.hpp"
#include "../precision.hpp"
#include "same_settings.hpp"
#include "state_file.hpp"

namespace mpopt::detail {

template <class Opt, class Precision, class LossScaler, class Partition, class UpdateRule, class Backend, class Communicator>
class agreement {
 protected:
  /// 1-bit LAMB checks, before anything else, that the communicator delivers what the compressed
  /// all-reduce needs: bytes to the right rank in an all-to-all, bytes and floats in the right place
  /// in all-gathers. Every rank throws if any found a fault. Collective.
  void preflight() {
    Opt& o = self();
    const std::size_t w = std::size_t(o.comm_.size()), r = std::size_t(o.comm_.rank());
    auto code = [](std::size_t from, std::size_t to) { return std::uint8_t(from * 31 + to * 7 + 1); };
    std::vector<std::uint8_t> sent(w), received(w), gathered(w, 0);
    std::vector<float> ranks(w, -1.0f);
    const std::vector<std::size_t> ones(w, 1);
    std::string problem;
    try {
      for (std::size_t j = 0; j < w; ++j) sent[j] = code(r, j);
      o.comm_.all_to_all(std::span<const std::uint8_t>(sent), std::span<std::uint8_t>(received));
      gathered[r] = std::uint8_t(r + 1);
      o.comm_.all_gather(std::span<std::uint8_t>(gathered), std::span<const std::size_t>(ones));
      const float mine = float(r);
      o.comm_.all_gather(std::span<const float>(&mine, 1), std::span<float>(ranks));
      for (std::size_t i = 0; i < w && problem.empty(); ++i) {
        if (received[i] != code(i, r)) problem = "all_to_all of bytes delivered the wrong block from rank " + std::to_string(i);
        else if (gathered[i] != std::uint8_t(i + 1)) problem = "all_gather of bytes put rank " + std::to_string(i) + "'s piece elsewhere";
        else if (ranks[i] != float(i)) problem = "all_gather of floats put rank " + std::to_string(i) + "'s value elsewhere";
      }
    } catch (const error& e) {
      problem = e.what();
    }
    agree("1-bit LAMB preflight", [&] {
      if (!problem.empty())
        fail("1-bit LAMB preflight on ", Communicator::name, " (rank ", r, " of ", w, "): ", problem);
    });
    o.comm_.take_bytes();
  }

  /// Runs f on every rank and agrees on the outcome: if it threw mpopt::error anywhere, it throws on
  /// every rank (its own message where it failed), so no rank goes on into a collective alone.
  template <class F>
  void agree(std::string_view what, F&& f) {
    Opt& o = self();
    std::optional<error> mine;
    try {
      f();
    } catch (const error& e) {
      mine = e;
    }
    std::uint8_t failed = mine.has_value();
    o.comm_.all_reduce(std::span<std::uint8_t>(&failed, 1), reduce_op::max);
    if (mine) throw *mine;
    if (failed) fail(what, "() failed on another rank");
  }

  /// Every rank must hold the same policies, options (the optimizer's, the scaler's, each group's,
  /// the communicator's) and tensors; otherwise every rank throws, naming what differs on which
  /// ranks, before any gradient moves. What decides the number of settings is compared first.
  void check_same_settings() {
    Opt& o = self();
    using accumulate_type = typename Opt::accumulate_type;
    using communicate_type = typename Opt::communicate_type;
    std::string policies = std::string(Precision::name) + " " + std::string(LossScaler::name) + " " +
                           std::string(Partition::name) + " " + std::string(UpdateRule::name) + " " +
                           std::string(Backend::name) + " " + std::string(Communicator::name) + ", sums in " +
                           std::string(type_name<accumulate_type>) + ", sent in " + std::string(type_name<communicate_type>);
    const std::string_view advice =
        "Every rank must construct the optimizer with the same policies and options and register the same tensors "
        "in the same order";
    const setting shape[] = {{"policies", policies}, {"number of groups", std::to_string(o.groups_.size())}};
    require_same_settings(o.comm_, shape, advice);

    std::vector<setting> all;
    auto add = [&](std::string name, const nlohmann::json& value) {
      all.push_back({std::move(name), value.is_string() ? value.get<std::string>() : value.dump()});
    };
    auto add_each = [&](const std::string& prefix, const nlohmann::json& object) {
      for (const auto& [key, value] : object.items()) add(prefix + key, value);
    };
    const optimizer_options& opts = o.options_;
    add("clip_grad", opts.clip_grad);
    add("accumulation_steps", opts.accumulation_steps);
    add("combine", opts.combine == accumulation::mean ? "mean" : "sum");
    add("skip_nonfinite", opts.skip_nonfinite);
    add("max_consecutive_skips", opts.max_consecutive_skips);
    add("bucket_elements", opts.bucket_elements);
    add("gradient_predivide", opts.gradient_predivide);
    add("sum_by_shard", opts.sum_by_shard);
    add_each(std::string(LossScaler::name) + ".", o.scaler_.settings());
    add_each(std::string(LossScaler::name) + " state.", o.scaler_.save());
    if constexpr (requires { o.comm_.inner().options().deterministic; })
      add(std::string(Communicator::name) + ".deterministic", o.comm_.inner().options().deterministic);
    for (const auto& g : o.groups_) {
      add_each(g->label_ + ".", UpdateRule::to_json(g->options_));
      // The tensors as a short summary whose hash covers every name and size, in order.
      std::string names;
      std::size_t elements = 0;
      for (const auto& e : g->entries_) {
        names += e.name + ":" + std::to_string(e.size) + ";";
        elements += e.size;
      }
      checksum64 sum(names.size());
      sum.update(std::as_bytes(std::span(names)));
      add(g->label_ + " tensors", std::to_string(g->entries_.size()) + " tensors, " + std::to_string(elements) +
                                      " elements, hash " + checksum64::hex(sum.finish()).substr(0, 8));
    }
    require_same_settings(o.comm_, std::span<const setting>(all), advice);
  }

 private:
  Opt& self() { return static_cast<Opt&>(*this); }
};

}  // namespace mpopt::detail
