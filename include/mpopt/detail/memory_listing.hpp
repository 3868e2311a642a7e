// mpopt — the memory report: every buffer a rank holds for the optimizer, by name, purpose and
// size (memory_report.hpp), the user's tensors marked as theirs. The optimizer derives from
// memory_listing<itself, its policies>.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "../memory_report.hpp"
#include "../precision.hpp"
#include "config.hpp"
#include "flat_layout.hpp"
#include "step_decision.hpp"
#include "work_list.hpp"

namespace mpopt::detail {

template <class Opt, class Precision, class UpdateRule, class Communicator>
class memory_listing {
 public:
  /// Every buffer this rank holds for the optimizer, with its size; the user's tensors are listed
  /// too, marked as theirs. State buffers appear once finalize() (or the first step) made them.
  MPOPT_COLD mpopt::memory_report memory_report() const {
    const Opt& o = static_cast<const Opt&>(*this);
    using param_type = typename Opt::param_type;
    using grad_type = typename Opt::grad_type;
    mpopt::memory_report r;
    std::size_t user_params = 0;
    for (const auto& g : o.groups_) {
      if (g->flat_) {
        r.buffers.push_back({g->label_ + " parameters", "flat parameter buffer (views handed to the model)",
                             g->flat_param_.size() * sizeof(param_type), true});
        r.buffers.push_back({g->label_ + " gradients", "flat gradient buffer", g->flat_grad_.size() * sizeof(grad_type), true});
      } else {
        for (const auto& e : g->entries_) user_params += e.size;
      }
    }
    if (user_params) {
      r.buffers.push_back({"parameters", "the model's parameter tensors", user_params * sizeof(param_type), false});
      r.buffers.push_back({"gradients", "the model's gradient tensors", user_params * sizeof(grad_type), false});
    }
    if (!o.finalized_) return r;
    const std::size_t state = o.state_elements_ * sizeof(float);
    if constexpr (Precision::has_master) r.buffers.push_back({"master", "fp32 master weights", state, true});
    for (std::string_view name : UpdateRule::state)
      r.buffers.push_back({std::string(name), std::string(UpdateRule::name) + " state (fp32)", state, true});
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
    if constexpr (requires { o.backend_.list_memory(r); }) bookkeeping += o.backend_.list_memory(r);  // offload's copies
    bookkeeping += o.experts_.capacity() * sizeof(o.experts_[0]);
    for (const auto& p : o.experts_) bookkeeping += p.bytes();
    r.buffers.push_back({"work list", "tensor table, layout, chunks, buckets, partial sums, per-group scalars", bookkeeping, true});
    if constexpr (requires { o.comm_.inner().workspace_bytes(); }) {
      std::string purpose = "the communicator's own buffers";
      if constexpr (requires { Communicator::workspace_purpose; }) purpose = Communicator::workspace_purpose;
      if (o.comm_.inner().workspace_bytes())
        r.buffers.push_back({"communicator workspace", purpose, o.comm_.inner().workspace_bytes(), true});
      for (std::size_t k = 0; k < o.expert_comms_.size(); ++k)
        if (o.expert_comms_[k]->inner().workspace_bytes())
          r.buffers.push_back({"expert communicator " + std::to_string(k) + " workspace", purpose,
                               o.expert_comms_[k]->inner().workspace_bytes(), true});
    }
    return r;
  }
};

}  // namespace mpopt::detail
