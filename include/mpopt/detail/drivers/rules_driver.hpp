// mpopt — the driver of a rule set (rules.hpp): a driver per member, each run over the chunks of the
// groups that chose its rule, with that rule's scalars. The step's decision, norm and clip come
// before it and are one for all groups; each member then runs its stages as it would alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>  // the checkpoint hooks' types, defined where checkpoints are

#include "../../memory_report.hpp"
#include "../../options.hpp"
#include "../../status.hpp"
#include "../comm/metered.hpp"
#include "../passes/work_list.hpp"
#include "rule_driver.hpp"
#include "staged_driver.hpp"

namespace mpopt::detail {

class state_reader;

template <class Precision, class Partition, class Backend, class Communicator, class... R>
class rules_driver {
  template <class T>
  using shared = typename Backend::template shared_vector<T>;
  template <class M>
  using driver_t = driver_of_t<M, Precision, Partition, Backend, Communicator>;
  static constexpr std::size_t members = sizeof...(R);

  static_assert((!names_driver<R, Precision, Partition, Backend, Communicator> && ...),
                "mpopt::rules: a member runs a driver of its own (a compressing rule: 1-bit Adam, 1-bit LAMB, 0/1 "
                "Adam), whose exchange is the whole optimizer's; it cannot share an optimizer with other rules");

  /// One member's share of the step: its groups, their chunks (addressing the step's state as the
  /// whole list does), their per-chunk sums, and its scalars per group (only its groups' are set).
  template <class M>
  struct member {
    driver_t<M> driver;
    std::vector<std::uint32_t> groups;
    work_list work;
    shared<float> chunk_sums;
    shared<typename M::scalars> scalars;

    std::size_t bytes() const {
      return work.bytes() + groups.capacity() * sizeof(std::uint32_t) + chunk_sums.capacity() * sizeof(float) +
             scalars.capacity() * sizeof(typename M::scalars);
    }
  };

 public:
  static constexpr bool host_decides = (driver_t<R>::host_decides || ...);
  /// The update's first pass is a member's, over part of the elements: the gradient's norm is
  /// summed before it.
  static constexpr bool sums_gradient = false;

  static void preflight(metered<Communicator>& comm) { (driver_t<R>::preflight(comm), ...); }
  /// Each member's checks, over the groups that chose it.
  template <class Groups>
  static void check_groups(const Groups& groups) {
    for_each_index([&]<std::size_t K>() {
      std::vector<const std::remove_cvref_t<decltype(*groups.front())>*> chosen;
      for (const auto& g : groups)
        if (g->options().index() == K) chosen.push_back(&*g);
      driver_t<std::tuple_element_t<K, std::tuple<R...>>>::check_groups(chosen);
    });
  }
  template <class Groups>
  static bool local_gradients(const Groups& groups) {
    return (driver_t<R>::local_gradients(groups) || ...);
  }
  template <class Groups>
  static bool replicas_differ(const Groups& groups) {
    return (driver_t<R>::replicas_differ(groups) || ...);
  }

  /// Each member's chunks, sums and scalars, then its own buffers.
  template <class Context>
  void allocate(Context& c) {
    for_each_member([&]<std::size_t K, class M>(member<M>& m) {
      m.groups.clear();
      for (std::uint32_t g = 0; g < c.groups.size(); ++g)
        if (c.groups[g]->options().index() == K) m.groups.push_back(g);
      m.work = work_list();
      const work_list& all = *c.tensors.work;
      for (std::size_t k = 0; k < all.size(); ++k) {
        const chunk& ch = all[k];
        if (c.groups[c.tensors.tensors[ch.tensor].group]->options().index() == K)
          m.work.add(ch.tensor, ch.begin, ch.begin + ch.size, ch.state, ch.owner);
      }
      m.chunk_sums.assign(2 * m.work.size(), 0.0f);
      m.scalars.assign(c.groups.size(), typename M::scalars{});
      auto mc = member_context(c, m);
      m.driver.allocate(mc);
    });
  }
  template <class Context>
  void started(Context& c) {
    for_each_member([&]<std::size_t, class M>(member<M>& m) {
      auto mc = member_context(c, m);
      m.driver.started(mc);
    });
  }

  /// Each member's first pass, with its groups' scalars of this step.
  template <class Context>
  void begin(Context& c) {
    finished_ = 0;
    for_each_member([&]<std::size_t K, class M>(member<M>& m) {
      for (const std::uint32_t g : m.groups) m.scalars[g] = std::get<K>(c.scalars[g]);
      if (m.groups.empty()) return;
      auto mc = member_context(c, m);
      m.driver.begin(mc);
    });
  }
  /// What each member has left, in order; one that threw is run again, the members before it not.
  template <class Context>
  void finish(Context& c) {
    for_each_member([&]<std::size_t K, class M>(member<M>& m) {
      if (K < finished_ || m.groups.empty()) return;
      auto mc = member_context(c, m);
      m.driver.finish(mc);
      finished_ = K + 1;
    });
  }

  void report(step_status& status) {
    for_each_member([&]<std::size_t, class M>(member<M>& m) { m.driver.report(status); });
  }
  std::size_t list_memory(memory_report& r) const {
    std::size_t bytes = 0;
    std::apply([&](const auto&... m) { ((bytes += m.driver.list_memory(r) + m.bytes()), ...); }, members_);
    return bytes;
  }

  // Checkpoints: each member's.

  template <class Self, class F>
  static void for_each_kept(Self& self, F&& f) {
    std::apply([&](auto&... m) { (decltype(m.driver)::for_each_kept(m.driver, f), ...); }, self.members_);
  }
  struct saved {
    std::tuple<typename driver_t<R>::saved...> parts;
  };
  saved check_saved(const nlohmann::json& meta, const state_reader& r, const std::string& where, const load_options& lo,
                    std::uint64_t applied, int world, std::span<const std::size_t> sizes) const {
    saved s;
    for_each_index([&]<std::size_t K>() {
      std::get<K>(s.parts) = std::get<K>(members_).driver.check_saved(meta, r, where, lo, applied, world, sizes);
    });
    return s;
  }
  template <class F>
  void for_each_extra(int world, F&& f) const {
    std::apply([&](const auto&... m) { (m.driver.for_each_extra(world, f), ...); }, members_);
  }
  template <class Comm, class Write>
  void save_extra(Comm& comm, Backend& backend, Write&& write) const {
    std::apply([&](const auto&... m) { (m.driver.save_extra(comm, backend, write), ...); }, members_);
  }
  template <class Comm, class Read>
  void restore(const saved& s, Comm& comm, Read&& read) {
    for_each_index([&]<std::size_t K>() { std::get<K>(members_).driver.restore(std::get<K>(s.parts), comm, read); });
  }

 private:
  template <class F>
  static void for_each_index(F&& f) {
    [&]<std::size_t... K>(std::index_sequence<K...>) { (f.template operator()<K>(), ...); }(
        std::make_index_sequence<members>());
  }
  template <class F>
  void for_each_member(F&& f) {
    for_each_index([&]<std::size_t K>() {
      using M = std::tuple_element_t<K, std::tuple<R...>>;
      f.template operator()<K, M>(std::get<K>(members_));
    });
  }

  /// What member m's driver works with: the optimizer's context, over m's chunks and scalars.
  template <class Context, class M>
  static auto member_context(Context& c, member<M>& m) {
    using exchange = std::remove_reference_t<decltype(c.exchange)>;
    rule_context<exchange, typename M::scalars, std::remove_cvref_t<decltype(c.groups)>> mc{
        c, c.exchange, narrowed(c.gradients, m), m.scalars.data(), c.groups};
    mc.tensors = narrowed(c.tensors, m);
    return mc;
  }
  template <class M>
  static step_data<Precision> narrowed(step_data<Precision> d, member<M>& m) {
    d.work = &m.work;
    d.chunk_sum = m.chunk_sums.data();
    d.chunk_sum2 = m.chunk_sums.data() + m.work.size();
    d.chunk_nonfinite = nullptr;  // the decision's: read before the rule runs
    d.chunk_grad_sum = nullptr;
    return d;
  }

  std::tuple<member<R>...> members_;
  std::size_t finished_ = 0;  ///< members whose finish() ran in the committed step
};

}  // namespace mpopt::detail
