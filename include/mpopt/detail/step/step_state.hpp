// mpopt — the optimizer's state, as plain structs the step pipeline (step_pipeline.hpp), the
// checkpoints, the memory report and the state accessors receive by reference: the communicators,
// what finalize() lays out (the tensors, this rank's elements, their state and the step's partial
// sums), and where the run stands between calls.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../../tensor_spec.hpp"
#include "../exchange/expert_placement.hpp"
#include "../exchange/flat_layout.hpp"
#include "index_set.hpp"
#include "../comm/metered.hpp"
#include "spike_guard.hpp"
#include "step_counts.hpp"
#include "../../rule.hpp"
#include "../passes/block_state.hpp"
#include "../passes/step_data.hpp"
#include "../math/step_decision.hpp"
#include "../options/validate.hpp"
#include "../passes/work_list.hpp"

namespace mpopt::detail {

/// Every communicator the optimizer uses: its own (every rank), and the expert groups' (metered
/// under it), with each group's data-parallel one among them.
template <class Communicator>
struct communicators {
  explicit communicators(Communicator c) : comm(std::move(c)) {}

  metered<Communicator> comm;
  std::vector<std::unique_ptr<metered<Communicator>>> experts;  // add_expert_group's, in its order
  // Fixed at finalize().
  std::vector<metered<Communicator>*> of_group;  // per group: comm or its expert communicator
  std::vector<expert_placement> placement;        // per expert group: which ranks hold which experts

  /// The communicator of group g's expert index (param_group::comm_): 0 is comm's.
  metered<Communicator>* of_index(std::uint32_t k) { return k ? experts[k - 1].get() : &comm; }
};

/// What finalize() lays out: the tensors, the elements this rank updates, their master and state
/// (stored as the precision says: state_precision.hpp), the step's partial sums and decision, and
/// the per-group coefficients of the committed step.
template <class Precision, class UpdateRule, class Backend>
struct step_state {
  static constexpr std::size_t state_count = UpdateRule::state.size();
  template <class T>
  using buffer = typename Backend::template buffer<T>;  // where the backend computes
  template <class T>
  using shared = typename Backend::template shared_vector<T>;  // readable by the host's step logic too

  std::vector<tensor_slot<typename Precision::param_type, typename Precision::grad_type>> tensors;
  std::optional<flat_layout> layout;
  work_list work;                                              // my elements, addressing the local state
  std::vector<std::pair<std::size_t, std::size_t>> uncounted;  // chunks of work another rank counts in the norm
  std::size_t elements = 0;                                    // of the masters
  buffer_layout buffers;  // where each group's state sits in each state buffer, and their sizes
  std::size_t parameters = 0;                                  // elements of all tensors
  buffer<master_element_t<Precision>> master;  // fp32, or the remainders; empty where the parameter is the master
  std::array<buffer<state_element_t<Precision>>, state_count> moments;  // the rule's, in the order of UpdateRule::state
  std::array<buffer<float>, state_count> scales;  // quantized state: each moment's block scales
  shared<float> chunk_sums;  // per chunk: the pass's sum, then (at work.size()) its sum2
  shared<std::uint8_t> chunk_nonfinite;
  shared<double> chunk_grad_sums;   // per chunk: the gradient's sum of squares (the norm pass's or the update's)
  buffer<step_decision> decision;   // this step's, where the passes run
  buffer<double> decision_sums;     // its inputs: squared norm, non-finite chunks
  detail::rank_ordered_sum rank_ordered_sum;
  shared<typename UpdateRule::scalars> coefficients;  // per group, fixed at commit
  /// Where the committed step reads its gradients (the exchange's boundary), for the stages
  /// finish_step() runs: an update stage may read them too (LARS).
  step_data<Precision> gradients;

  /// Sizes every buffer for `l`, this rank's part of `table`, where group g's rule keeps kept[g] of
  /// the state buffers.
  void allocate(flat_layout l, decltype(tensors) table, const std::vector<std::size_t>& kept) {
    layout.emplace(std::move(l));
    tensors = std::move(table);
    work = layout->local_work();
    uncounted = layout->uncounted(work);
    elements = layout->local_elements();
    parameters = layout->parameters();
    buffers = layout->state_buffers(state_count, kept);
    for (auto& t : tensors) {
      t.state_buffers = std::uint32_t(kept[t.group]);
      std::copy(buffers.shift[t.group].begin(), buffers.shift[t.group].end(), t.state_shift);
    }
    if constexpr (Precision::has_master) master = buffer<master_element_t<Precision>>(elements);
    for (std::size_t k = 0; k < state_count; ++k) {
      const std::size_t n = buffers.elements[k];
      if constexpr (state_in_blocks<Precision>) {
        using S = state_storage_t<Precision>;
        moments[k] = buffer<std::uint8_t>::zeroed(code_bytes<S>(n));
        scales[k] = buffer<float>::zeroed(n / S::block);
      } else {
        moments[k] = buffer<state_element_t<Precision>>(n);
      }
    }
    chunk_sums.assign(2 * work.size(), 0.0f);
    chunk_nonfinite.assign(work.size(), 0);
    chunk_grad_sums.assign(work.size(), 0.0);
    decision = buffer<step_decision>::zeroed(1);
    decision_sums = buffer<double>::zeroed(2);
    rank_ordered_sum = detail::rank_ordered_sum(work);
    coefficients.resize(kept.size());
    gradients = data();
  }

  /// The step's tensors, state and partial sums, reading the gradients as they are.
  step_data<Precision> data() {
    step_data<Precision> d;
    d.tensors = tensors.data();
    d.tensor_count = tensors.size();
    d.work = &work;
    d.master = master.data();
    for (std::size_t k = 0; k < state_count; ++k) d.state[k] = moments[k].data();
    if constexpr (state_in_blocks<Precision>) {
      for (std::size_t k = 0; k < state_count; ++k) d.block_scales[k] = scales[k].data();
      d.nonnegative = nonnegative_state_bits<UpdateRule>();
    }
    d.state_count = std::uint32_t(state_count);
    d.chunk_sum = chunk_sums.data();
    d.chunk_sum2 = chunk_sums.data() + work.size();
    d.chunk_nonfinite = chunk_nonfinite.data();
    d.decision = decision.data();
    return d;
  }

  /// Tensor i of the table, once finalize() made it.
  const auto& tensor(std::size_t i) const {
    if (i >= tensors.size()) fail("there are ", tensors.size(), " tensors (after finalize), no tensor ", i);
    return tensors[i];
  }
  /// The elements of tensor i this rank holds, and their fp32 masters and rule state.
  owned_elements owned(std::size_t i) const {
    const auto o = layout->owned(i);
    return {o.first, o.count};
  }
  /// Tensor i's masters as stored (fp32, or the remainders of remainder16), of its owned elements;
  /// where the parameter is its own master, the parameter.
  auto master_of(std::size_t i) const {
    const auto o = layout->owned(i);
    if constexpr (Precision::has_master)
      return std::span<const master_element_t<Precision>>(master.data() + o.state, o.count);
    else return params_of(i);
  }
  std::span<const typename Precision::param_type> params_of(std::size_t i) const {
    const auto o = layout->owned(i);
    return {tensor(i).param + o.first, o.count};
  }
  /// Where tensor i's owned elements start in state buffer k (which its rule keeps).
  std::size_t in_buffer(std::size_t k, std::size_t i) const {
    return layout->owned(i).state - tensors[i].state_shift[k];
  }
  /// State buffer k of tensor i as stored, of its owned elements (quantized: their codes).
  /// The caller checks k (step_pipeline::check_moment).
  std::span<const state_element_t<Precision>> moment(std::size_t k, std::size_t i) const {
    const std::size_t count = layout->owned(i).count, at = in_buffer(k, i);
    if constexpr (state_in_blocks<Precision>) {
      using S = state_storage_t<Precision>;
      return {moments[k].data() + code_bytes<S>(at), code_bytes<S>(count)};
    } else {
      return {moments[k].data() + at, count};
    }
  }

  /// The bytes of the tables and sums above (the memory report's bookkeeping; the state apart).
  std::size_t bookkeeping_bytes() const {
    return work.bytes() + tensors.capacity() * sizeof(tensors[0]) + (layout ? layout->bytes() : 0) +
           chunk_sums.capacity() * sizeof(float) + chunk_nonfinite.capacity() +
           chunk_grad_sums.capacity() * sizeof(double) + rank_ordered_sum.bytes() +
           decision.size() * sizeof(step_decision) + decision_sums.size() * sizeof(double) +
           coefficients.capacity() * sizeof(coefficients[0]) + uncounted.capacity() * sizeof(uncounted[0]) +
           buffers.bytes();
  }
};

/// What a committed step has left (finish_step): the driver's stages, the parameters' way back, its gathers.
enum class pending_stage : std::uint8_t { none, rule, params_back, params_in_flight };

/// Where the run stands between calls: the accumulation window, the counters, the committed step's
/// unfinished stages and the spike guard's windows.
struct step_progress {
  explicit step_progress(const spike_guard_options& o) : guard(o) {}

  int micro_step = 0;  // backwards of this window already folded in
  step_counts counts;
  pending_stage pending = pending_stage::none;
  index_set unwaited;  // tensors whose gather the last step left in flight, not waited for since
  spike_guard guard;
};

}  // namespace mpopt::detail
