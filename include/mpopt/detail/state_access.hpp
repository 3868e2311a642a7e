// mpopt — what a user reads of the optimizer's state: which elements of a tensor this rank holds,
// their fp32 masters and rule state, and what the rule's driver keeps per tensor. The optimizer
// derives from state_access<itself, its policies, its rule's driver>.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "../communicator.hpp"
#include "../tensor_spec.hpp"
#include "agree.hpp"
#include "validate.hpp"

namespace mpopt::detail {

template <class Opt, class Precision, class UpdateRule, class Driver>
class state_access {
  static constexpr std::size_t state_count = UpdateRule::state.size();

 public:
  std::size_t tensor_count() const { return self().tensors_.size(); }

  /// The elements of tensor i whose state this rank holds: all of them unless sharded, else
  /// [first, first + count) of the tensor (zero1/zero2 split each tensor across the ranks).
  owned_elements owned(std::size_t i) const {
    state_of(i, "owned");
    const auto o = self().layout_->owned(i);
    return {o.first, o.count};
  }
  /// fp32 master weights of tensor i (in registration order), of its owned(i) elements; for fp32
  /// the parameter itself.
  std::span<const float> master(std::size_t i) const {
    const auto& t = state_of(i, "master");
    const auto o = self().layout_->owned(i);
    if constexpr (Precision::has_master) return {self().master_.data() + o.state, o.count};
    else return {t.param + o.first, o.count};
  }
  /// State buffer k of the rule (UpdateRule::state[k]: adam's 0 is exp_avg, 1 exp_avg_sq) of
  /// tensor i, of its owned(i) elements.
  std::span<const float> moment(std::size_t k, std::size_t i) const {
    state_of(i, "moment");
    if (k >= state_count)
      fail("moment ", k, ": ", UpdateRule::name, " keeps ",
           state_count ? "moments 0 to " + std::to_string(state_count - 1) : std::string("no moments"));
    const auto o = self().layout_->owned(i);
    return {self().state_[k].data() + o.state, o.count};
  }

  /// What a reducing rule keeps per tensor (UpdateRule::tensor_state), from the last applied step,
  /// in registration order: LAMB's trust ratios (1-bit LAMB's compression stage: the frozen
  /// coefficient times the factor).
  std::span<const double> tensor_state() const
    requires requires(const Driver& d) { d.tensor_state(); }
  {
    return self().driver_.tensor_state();
  }
  /// LAMB's name for tensor_state() (DeepSpeed's get_lamb_coeffs()).
  std::span<const double> lamb_coeffs() const
    requires requires(const Driver& d) { d.tensor_state(); }
  {
    return self().driver_.tensor_state();
  }
  /// 1-bit LAMB with more than one rank: the compressed all-reduce, with this rank's error buffers.
  decltype(auto) compression() const
    requires requires(const Driver& d) { d.compression(); }
  {
    return self().driver_.compression();
  }

  /// The compressing rules: tensor i's exp_avg_mask, as DeepSpeed's. Where mask[k] is 0, element
  /// k's average (1-bit Adam's and 1-bit LAMB's momentum, 0/1 Adam's gradient and accumulator) is
  /// taken as 0: for elements whose gradient is always 0, which a 1-bit code cannot carry. Values 0
  /// or 1, the same on every rank: collective (it finalizes, and a step in flight finishes first).
  /// Checkpoints do not keep it (nor do DeepSpeed's): set it again after load().
  void set_exp_avg_mask(std::size_t i, std::span<const float> mask)
    requires requires(Driver& d) { d.set_exp_avg_mask(i, mask); }
  {
    Opt& o = const_cast<Opt&>(self());
    o.finalize();
    o.finish_step();
    std::uint64_t mine = 0;
    agree(o.comm_, "set_exp_avg_mask", [&] {
      const auto& t = tensor_at(i);
      if (mask.size() != t.size)
        fail("set_exp_avg_mask(", i, "): ", mask.size(), " values for tensor '", o.tensor_name(i), "' of ", t.size);
      mine = 14695981039346656037ull;  // FNV-1a over the kept bits
      for (std::size_t k = 0; k < mask.size(); ++k) {
        if (mask[k] != 0.0f && mask[k] != 1.0f)
          fail("set_exp_avg_mask(", i, "): value ", k, " is ", mask[k], "; a mask holds 0 or 1");
        mine = (mine ^ (mask[k] != 0.0f ? 1u : 2u)) * 1099511628211ull;
      }
    });
    std::uint64_t seen[2] = {mine, ~mine};  // the largest of each: equal to mine and ~mine on every rank iff all agree
    o.comm_.all_reduce(std::span<std::uint64_t>(seen), reduce_op::max);
    o.comm_.take_bytes();  // not a step's traffic
    if (seen[0] != mine || seen[1] != ~mine)
      fail("set_exp_avg_mask(", i, "): the ranks' masks differ; each rank averages with its own, so their replicas "
           "would part: give every rank the same");
    o.driver_.set_exp_avg_mask(i, mask);
  }

 protected:
  /// Tensor i, for an accessor of the state, which exists once finalize() (or the first step) made it.
  const auto& state_of(std::size_t i, const char* accessor) const {
    const Opt& o = self();
    if (!o.finalized_)
      fail(accessor, "(", i, "): the optimizer state is made by finalize() or the first step(); call finalize() "
           "first (", o.first_tensor_of(std::uint32_t(o.groups_.size())), " tensors are registered)");
    return tensor_at(i);
  }
  const auto& tensor_at(std::size_t i) const {
    const auto& tensors = self().tensors_;
    if (i >= tensors.size()) fail("there are ", tensors.size(), " tensors (after finalize), no tensor ", i);
    return tensors[i];
  }

 private:
  const Opt& self() const { return static_cast<const Opt&>(*this); }
};

}  // namespace mpopt::detail
