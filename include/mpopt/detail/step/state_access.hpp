// mpopt — what a user reads of, or sets in, the optimizer's state beyond the step: checks that
// the state exists, and the compressing rules' exp_avg_mask, which every rank must set alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "../../communicator.hpp"
#include "../config.hpp"
#include "../options/validate.hpp"

namespace mpopt::detail {

/// Refuses an accessor of the state before finalize() (or the first step) made it.
MPOPT_DECL void require_state(bool finalized, const char* accessor, std::size_t i, std::size_t registered);

/// The FNV-1a hash of a mask's kept bits, or a throw naming the first value that is not 0 or 1.
MPOPT_DECL std::uint64_t mask_hash(std::size_t i, std::span<const float> mask);

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
