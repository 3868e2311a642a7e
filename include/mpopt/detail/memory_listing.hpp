// mpopt — the memory report: every buffer a rank holds for the optimizer, by name, purpose and
// size (memory_report.hpp), the user's tensors marked as theirs. The optimizer derives from
// memory_listing<itself, its policies>.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../memory_report.hpp"
#include "../precision.hpp"
#include "config.hpp"
#include "flat_layout.hpp"
#include "step_decision.hpp"
#include "work_list.hpp"

namespace mpopt::detail {

// The report's lines, built by functions that do not depend on the optimizer's types: compiled
// once, not once per optimizer type. The optimizer's memory_report() adds the numbers.

/// A group whose tensors the optimizer allocated (flat): its buffers are the optimizer's.
MPOPT_DECL void list_flat_group(mpopt::memory_report& r, const std::string& label, std::size_t param_bytes,
                                std::size_t grad_bytes);

/// The model's own tensors, where there are any: listed, marked as the user's.
MPOPT_DECL void list_user_tensors(mpopt::memory_report& r, std::size_t param_bytes, std::size_t grad_bytes);

/// The fp32 masters (where the precision has them) and each of the rule's state buffers.
MPOPT_DECL void list_state(mpopt::memory_report& r, bool has_master, std::span<const std::string_view> names,
                           std::string_view rule, std::size_t bytes);

/// The communicators' own buffers, where they have any: the optimizer's, then each expert group's.
MPOPT_DECL void list_workspaces(mpopt::memory_report& r, std::string_view purpose, std::size_t bytes,
                                std::span<const std::size_t> expert_bytes);

/// Backend B holds buffers of its own besides the state (offload's copies).
template <class B>
concept lists_memory = requires(const B& b, mpopt::memory_report& r) {
  { b.list_memory(r) } -> std::convertible_to<std::size_t>;
};
/// Communicator C holds buffers of its own, for a purpose it may name.
template <class C>
concept has_workspace = requires(const C& c) {
  { c.workspace_bytes() } -> std::convertible_to<std::size_t>;
};
template <class C>
concept says_workspace_purpose = requires {
  { C::workspace_purpose } -> std::convertible_to<std::string_view>;
};

template <class Opt, class Precision, class UpdateRule, class Communicator>
class memory_listing {
 public:
  /// Every buffer this rank holds for the optimizer, with its size; the user's tensors are listed
  /// too, marked as theirs. State buffers appear once finalize() (or the first step) made them.
  MPOPT_COLD mpopt::memory_report memory_report() const {
    const Opt& o = static_cast<const Opt&>(*this);
    constexpr std::size_t param_bytes = sizeof(typename Opt::param_type), grad_bytes = sizeof(typename Opt::grad_type);
    mpopt::memory_report r;
    std::size_t user_elements = 0;
    for (const auto& g : o.groups_) {
      if (g->flat_) list_flat_group(r, g->label_, g->flat_param_.size() * param_bytes, g->flat_grad_.size() * grad_bytes);
      else
        for (const auto& e : g->entries_) user_elements += e.size;
    }
    list_user_tensors(r, user_elements * param_bytes, user_elements * grad_bytes);
    if (!o.finalized_) return r;
    list_state(r, Precision::has_master, UpdateRule::state, UpdateRule::name, o.state_elements_ * sizeof(float));
    const std::size_t driver_bookkeeping = o.driver_.list_memory(r);
    const std::size_t exchange_bookkeeping = o.exchange_.list_memory(r);
    std::size_t bookkeeping =
        o.work_.bytes() + o.tensors_.capacity() * sizeof(o.tensors_[0]) +
        o.layout_->bytes() + o.chunk_sums_.capacity() * sizeof(float) + o.chunk_nonfinite_.capacity() +
        o.chunk_grad_sums_.capacity() * sizeof(double) +
        o.rank_ordered_sum_.bytes() + o.decision_.size() * sizeof(step_decision) +
        o.decision_sums_.size() * sizeof(double) + o.coefficients_.capacity() * sizeof(o.coefficients_[0]) +
        o.uncounted_.capacity() * sizeof(o.uncounted_[0]) + o.group_comms_.capacity() * sizeof(void*) +
        exchange_bookkeeping + driver_bookkeeping;
    if constexpr (lists_memory<std::remove_cvref_t<decltype(o.backend_)>>) bookkeeping += o.backend_.list_memory(r);  // offload's copies
    bookkeeping += o.experts_.capacity() * sizeof(o.experts_[0]) + o.unwaited_.bytes();
    for (const auto& p : o.experts_) bookkeeping += p.bytes();
    r.buffers.push_back({"work list", "tensor table, layout, chunks, buckets, partial sums, per-group scalars", bookkeeping, true});
    if constexpr (has_workspace<Communicator>) {
      std::string_view purpose = "the communicator's own buffers";
      if constexpr (says_workspace_purpose<Communicator>) purpose = Communicator::workspace_purpose;
      std::vector<std::size_t> expert_bytes;
      for (const auto& c : o.expert_comms_) expert_bytes.push_back(c->inner().workspace_bytes());
      list_workspaces(r, purpose, o.comm_.inner().workspace_bytes(), expert_bytes);
    }
    return r;
  }
};

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "memory_listing.ipp"
#endif
