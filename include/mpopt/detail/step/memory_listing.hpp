// mpopt — the memory report: every buffer a rank holds for the optimizer, by name, purpose and
// size (memory_report.hpp), the user's tensors marked as theirs, read from the optimizer's parts.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../../memory_report.hpp"
#include "../config.hpp"
#include "../passes/step_data.hpp"

namespace mpopt::detail {

// The report's lines, built by functions that do not depend on the optimizer's types: compiled
// once, not once per optimizer type. The optimizer's memory_report() adds the numbers.

/// A group whose tensors the optimizer allocated (flat): its buffers are the optimizer's.
MPOPT_DECL void list_flat_group(mpopt::memory_report& r, const std::string& label, std::size_t param_bytes,
                                std::size_t grad_bytes);

/// The gradients a group of the user's tensors holds for them (param_group::add(param, n)).
MPOPT_DECL void list_held_gradients(mpopt::memory_report& r, const std::string& label, std::size_t bytes);

/// The model's own tensors, where there are any: listed, marked as the user's.
MPOPT_DECL void list_user_tensors(mpopt::memory_report& r, std::size_t param_bytes, std::size_t grad_bytes);

/// The masters (where the precision has them: fp32, or remainders), `elements` of them, and each of
/// the rule's state buffers (stored as `state`, e.g. "fp32", in `state_bits` an element),
/// buffer_elements[k] of buffer k; state quantized in blocks of `block` elements (0: not) also lists
/// each buffer's fp32 block scales.
MPOPT_DECL void list_state(mpopt::memory_report& r, std::size_t elements, bool has_master, bool remainders,
                           std::span<const std::string_view> names, std::span<const std::size_t> buffer_elements,
                           std::string_view rule, std::string_view state, std::size_t state_bits, std::size_t block);

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

/// Every buffer this rank holds for the optimizer of step pipeline p (step_pipeline.hpp), with its
/// size; the user's tensors are listed too, marked as theirs. State buffers appear once finalize()
/// (or the first step) made them.
template <class Pipeline>
MPOPT_COLD mpopt::memory_report memory_report_of(const Pipeline& p) {
  using rule = typename Pipeline::rule;
  using communicator = typename Pipeline::communicator_type;
  mpopt::memory_report r;
  p.list_tensors(r);
  if (!p.finalized()) return r;
  using P = typename Pipeline::precision;
  list_state(r, p.state.elements, P::has_master, master_in_remainder<P>, rule::state, p.state.buffers.elements,
             rule::name, state_storage_t<P>::name, stored_bits<state_storage_t<P>>(), stored_block<state_storage_t<P>>());
  std::size_t bookkeeping = p.state.bookkeeping_bytes();
  bookkeeping += p.driver.list_memory(r);
  bookkeeping += p.exchange.list_memory(r);
  if constexpr (lists_memory<typename Pipeline::backend_type>) bookkeeping += p.backend.list_memory(r);  // offload's copies
  bookkeeping += p.comms.of_group.capacity() * sizeof(void*) + p.comms.placement.capacity() * sizeof(p.comms.placement[0]) +
                 p.progress.unwaited.bytes();
  for (const auto& e : p.comms.placement) bookkeeping += e.bytes();
  r.buffers.push_back({"work list", "tensor table, layout, chunks, buckets, partial sums, per-group scalars", bookkeeping, true});
  if constexpr (has_workspace<communicator>) {
    std::string_view purpose = "the communicator's own buffers";
    if constexpr (says_workspace_purpose<communicator>) purpose = communicator::workspace_purpose;
    std::vector<std::size_t> expert_bytes;
    for (const auto& c : p.comms.experts) expert_bytes.push_back(c->inner().workspace_bytes());
    list_workspaces(r, purpose, p.comms.comm.inner().workspace_bytes(), expert_bytes);
  }
  return r;
}

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "memory_listing.ipp"
#endif
