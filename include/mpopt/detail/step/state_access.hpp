// mpopt — what a user reads of, or sets in, the optimizer's state beyond the step: checks that
// the state exists, its masters and moments as fp32 however stored, and the compressing rules'
// exp_avg_mask, which every rank must set alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../../communicator.hpp"
#include "../backend/tensor_side.hpp"
#include "../config.hpp"
#include "../math/remainder16.hpp"
#include "../options/validate.hpp"
#include "../../rule.hpp"
#include "../passes/block_state.hpp"
#include "../passes/step_data.hpp"

namespace mpopt::detail {

/// Refuses an accessor of the state before finalize() (or the first step) made it.
MPOPT_DECL void require_state(bool finalized, const char* accessor, std::size_t i, std::size_t registered);

/// The FNV-1a hash of a mask's kept bits, or a throw naming the first value that is not 0 or 1.
MPOPT_DECL std::uint64_t mask_hash(std::size_t i, std::span<const float> mask);

/// A copy on the host of values in `space`.
template <memory_space space, class Backend, class T>
std::vector<T> host_copy(const Backend& b, std::span<const T> values) {
  std::vector<T> host(values.size());
  if constexpr (space == memory_space::device) b.to_host(host.data(), values.data(), values.size());
  else host.assign(values.begin(), values.end());
  return host;
}

/// Stored values as fp32, from memory in `space`: the values themselves where they are fp32, else
/// a decoded copy.
template <memory_space space, class Backend, class T>
auto fp32_values(const Backend& b, std::span<const T> stored) {
  if constexpr (std::is_same_v<T, float>) {
    return stored;
  } else {
    const std::vector<T> host = host_copy<space>(b, stored);
    return std::vector<float>(host.begin(), host.end());
  }
}

/// optimizer::master: tensor i's fp32 masters, of its owned elements (a remainder16 master joined
/// from the parameters and their remainders).
template <class Pipeline>
auto master_values(const Pipeline& p, std::size_t i) {
  using P = typename Pipeline::precision;
  using B = decltype(p.backend);
  if constexpr (master_in_remainder<P>) {
    const auto params = host_copy<tensor_space_of<B>()>(p.backend, p.state.params_of(i));
    const auto remainders = host_copy<B::space>(p.backend, p.state.master_of(i));
    std::vector<float> masters(params.size());
    for (std::size_t j = 0; j < params.size(); ++j) masters[j] = join_master(params[j].bits, remainders[j]);
    return masters;
  } else {
    return fp32_values<P::has_master ? B::space : tensor_space_of<B>()>(p.backend, p.state.master_of(i));
  }
}

/// optimizer::moment: state buffer k of tensor i as fp32, of its owned elements (quantized state
/// decoded from its codes and block scales).
template <class Pipeline>
auto moment_values(const Pipeline& p, std::size_t k, std::size_t i) {
  using P = typename Pipeline::precision;
  constexpr auto space = decltype(p.backend)::space;
  if constexpr (state_in_blocks<P>) {
    using S = state_storage_t<P>;
    const auto o = p.state.layout->owned(i);  // its state starts a block
    const auto codes = host_copy<space>(p.backend, p.state.moment(k, i));
    const auto scales = host_copy<space>(
        p.backend, std::span<const float>(p.state.scales[k].data() + p.state.in_buffer(k, i) / S::block,
                                          (o.count + S::block - 1) / S::block));
    const bool nonnegative = (nonnegative_state_bits<typename Pipeline::rule>() >> k) & 1u;
    std::vector<float> values(o.count);
    for (std::size_t j = 0; j < values.size(); ++j)
      values[j] = decode_state<S>(code_at<S>(codes.data(), j), scales[j / S::block], nonnegative);
    return values;
  } else {
    return fp32_values<space>(p.backend, p.state.moment(k, i));
  }
}

/// optimizer::set_exp_avg_mask, over the step pipeline p (step_pipeline.hpp): collective.
template <class Pipeline>
void set_exp_avg_mask(Pipeline& p, std::size_t i, std::span<const float> mask) {
  p.finalize();
  p.finish_step();
  std::uint64_t mine = 0;
  p.agree("set_exp_avg_mask", [&] {
    const auto& t = p.state.tensor(i);
    if (mask.size() != t.size)
      fail("set_exp_avg_mask(", i, "): ", mask.size(), " values for tensor '", p.tensor_name(i), "' of ", t.size);
    mine = mask_hash(i, mask);
  });
  std::uint64_t seen[2] = {mine, ~mine};  // the largest of each: equal to mine and ~mine on every rank iff all agree
  p.comms.comm.all_reduce(std::span<std::uint64_t>(seen), reduce_op::max);
  p.comms.comm.take_bytes();  // not a step's traffic
  if (seen[0] != mine || seen[1] != ~mine)
    fail("set_exp_avg_mask(", i, "): the ranks' masks differ; each rank averages with its own, so their replicas "
         "would part: give every rank the same");
  p.driver.set_exp_avg_mask(i, mask);
}

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "state_access.ipp"
#endif
