// mpopt — rules per group: one optimizer whose groups each take one of several update rules, as
// Muon's users train (Muon for the hidden matrices; AdamW for embeddings, the head, biases and norms).
//
//   using rule = mpopt::rules<mpopt::muon, mpopt::adam>;
//   mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, rule> opt;
//   opt.add_group(mpopt::muon::options{.lr = 0.02}).add(w, gw, "h.0.w", {768, 768});
//   opt.add_group(mpopt::adam::options{.lr = 3e-4}).add(b, gb, "h.0.b");
//
// A group's options are one member's, and say which rule updates it. The step is one: one overflow
// decision, one global norm and clip, one loss scale, one checkpoint and one memory report. Each
// member runs its own stages over its groups' elements (detail/drivers/rules_driver.hpp). Members
// are rules whose driver is the staged or the matrix one (not the compressing rules), with
// options types of their own.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "detail/drivers/rules_driver.hpp"
#include "detail/options/field_refs.hpp"
#include "rule.hpp"

namespace mpopt {

namespace detail {
/// Text made at compile time: a rule set's name, and the names of its state buffers.
template <std::size_t N>
struct fixed_text {
  std::array<char, N> chars{};
  std::size_t size = 0;

  constexpr void append(std::string_view s) {
    for (const char c : s) chars[size++] = c;
  }
  constexpr bool holds(std::string_view s) const {
    for (std::size_t i = 0; i + s.size() <= size; ++i)
      if (std::string_view(chars.data() + i, s.size()) == s &&
          (i + s.size() == size || chars[i + s.size()] == '|') && (i == 0 || chars[i - 1] == '|'))
        return true;
    return false;
  }
  constexpr std::string_view view() const { return {chars.data(), size}; }
};

/// The names of rules<R...>: "muon+adam", and state buffer k's as the members name it
/// ("exp_avg|momentum_buffer" where they differ).
template <class... R>
struct rule_set_names {
  static constexpr std::size_t buffers = std::max({R::state.size()...});
  static constexpr std::size_t longest = 256;

  static constexpr fixed_text<longest> name = [] {
    fixed_text<longest> t;
    ((t.append(t.size ? "+" : ""), t.append(R::name)), ...);
    return t;
  }();
  static constexpr std::array<fixed_text<longest>, buffers> state_text = [] {
    std::array<fixed_text<longest>, buffers> a;
    auto add = [&](const auto& names) {
      for (std::size_t k = 0; k < names.size(); ++k)
        if (!a[k].holds(names[k])) {
          if (a[k].size) a[k].append("|");
          a[k].append(names[k]);
        }
    };
    (add(R::state), ...);
    return a;
  }();
  static constexpr std::array<std::string_view, buffers> state = [] {
    std::array<std::string_view, buffers> s;
    for (std::size_t k = 0; k < buffers; ++k) s[k] = state_text[k].view();
    return s;
  }();
};
}  // namespace detail

/// A group's options under rules<R...>: one member's options, which say the rule that updates it.
/// Made from any member's (add_group(mpopt::muon::options{...})); the default is the first member's.
template <class... R>
class rule_choice {
  template <class O>
  static constexpr std::size_t holders = (std::size_t(std::is_same_v<O, typename R::options>) + ...);
  static_assert(((holders<typename R::options> == 1) && ...),
                "mpopt::rules: each member's options must be a type of its own: a group's options say which rule "
                "updates it");

 public:
  /// The members' names, in order: what a checkpoint's record of the group is keyed by.
  static constexpr std::array<std::string_view, sizeof...(R)> choices = {R::name...};

  rule_choice() = default;
  template <class O>
    requires(std::same_as<O, typename R::options> || ...)
  rule_choice(const O& o) : chosen_(o) {}  // NOLINT(google-explicit-constructor): add_group(muon::options{})

  /// Which member: an index into choices.
  std::size_t index() const { return chosen_.index(); }
  std::string_view rule_name() const { return choices[index()]; }
  /// The chosen options, if they are O.
  template <class O>
  const O* get_if() const {
    return std::get_if<O>(&chosen_);
  }
  /// f(the chosen options).
  template <class F>
  decltype(auto) visit(F&& f) {
    return std::visit(std::forward<F>(f), chosen_);
  }
  double& rate() {
    return visit([](auto& o) -> double& { return o.lr; });
  }
  /// The chosen member's state buffers.
  std::span<const std::string_view> state_names() const {
    static constexpr std::array<std::span<const std::string_view>, sizeof...(R)> names = {
        std::span<const std::string_view>(R::state)...};
    return names[index()];
  }

  /// The chosen options as one record named by their rule (detail::chooses_fields).
  std::vector<detail::field_ref> chosen_fields() {
    return visit([&](auto& o) { return std::vector<detail::field_ref>{detail::chosen_record(rule_name(), o)}; });
  }
  /// Member k's default options (a checkpoint's record read back).
  void choose(std::size_t k) { chosen_ = defaults[k]; }
  /// What the chosen options check besides their fields.
  void validate(std::string_view group) const {
    std::visit(
        [&](const auto& o) {
          if constexpr (detail::validates<std::remove_cvref_t<decltype(o)>>)
            o.validate(std::string(group) + "." + std::string(rule_name()));
        },
        chosen_);
  }

  const std::variant<typename R::options...>& chosen() const { return chosen_; }

 private:
  static inline const std::array<std::variant<typename R::options...>, sizeof...(R)> defaults = {
      std::variant<typename R::options...>(typename R::options{})...};
  std::variant<typename R::options...> chosen_;
};

/// Rules per group (see the top of this file): an optimizer's UpdateRule (rule.hpp, rule_set).
template <class... R>
struct rules {
  static_assert(sizeof...(R) >= 2, "mpopt::rules: name two or more rules");
  static_assert((update_rule<R> && ...), "mpopt::rules: each member must model mpopt::update_rule (rule.hpp)");
  static_assert(
      [] {
        std::array<std::string_view, sizeof...(R)> names = {R::name...};
        std::sort(names.begin(), names.end());
        return std::adjacent_find(names.begin(), names.end()) == names.end();
      }(),
      "mpopt::rules: each rule may be named once");

  using member_rules = std::tuple<R...>;
  using options = rule_choice<R...>;
  /// Per group: the chosen member's scalars.
  using scalars = std::variant<typename R::scalars...>;
  template <class Precision, class Partition, class Backend, class Communicator>
  using driver = detail::rules_driver<Precision, Partition, Backend, Communicator, R...>;

  static constexpr std::string_view name = detail::rule_set_names<R...>::name.view();
  /// Buffer k holds, for each group, the chosen member's buffer k (if it has one).
  static constexpr auto state = detail::rule_set_names<R...>::state;
  /// A buffer is stored as never negative where every member that keeps it says so.
  static constexpr std::array<bool, state.size()> nonnegative_state = [] {
    std::array<bool, state.size()> flags;
    flags.fill(true);
    auto meet = [&]<class M>() {
      const std::uint32_t bits = detail::nonnegative_state_bits<M>();
      for (std::size_t k = 0; k < M::state.size(); ++k) flags[k] = flags[k] && ((bits >> k) & 1u);
    };
    (meet.template operator()<R>(), ...);
    return flags;
  }();

  static scalars prepare(const options& o, std::uint64_t t) {
    return std::visit(
        [&](const auto& m) {
          constexpr std::size_t k = member_index<std::remove_cvref_t<decltype(m)>>;
          return scalars(std::in_place_index<k>, std::tuple_element_t<k, member_rules>::prepare(m, t));
        },
        o.chosen());
  }
  static float initial_state(const options& o, std::size_t k) {
    return std::visit(
        [&](const auto& m) {
          using M = std::tuple_element_t<member_index<std::remove_cvref_t<decltype(m)>>, member_rules>;
          if constexpr (detail::rule_initial_state<M>) {
            if (k < M::state.size()) return M::initial_state(m, k);
          }
          return 0.0f;
        },
        o.chosen());
  }

  /// The chosen member's cost per tensor, and whether it keeps tensors whole (detail::update_of).
  static detail::group_update update_of(const options& o) {
    static constexpr std::array<detail::group_update, sizeof...(R)> members = {detail::rule_update<R>()...};
    return members[o.index()];
  }

 private:
  /// The member whose options are O.
  template <class O>
  static constexpr std::size_t member_index = [] {
    constexpr std::array<bool, sizeof...(R)> is = {std::is_same_v<O, typename R::options>...};
    return std::size_t(std::find(is.begin(), is.end(), true) - is.begin());
  }();
};

}  // namespace mpopt
