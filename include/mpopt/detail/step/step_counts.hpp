// mpopt — the optimizer's step accounting: applied and skipped steps, what a skip may not exceed
// (the loss scale's floor, max_consecutive_skips), and the loss scaler told of each outcome.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "../../status.hpp"
#include "../config.hpp"
#include "../options/validate.hpp"
#include "../passes/work_list.hpp"

namespace mpopt::detail {

struct step_counts {
  std::uint64_t applied = 0, skipped = 0, consecutive_skips = 0;

  /// The optimizer step the next boundary completes, counting applied and skipped ones from 1.
  std::uint64_t next() const { return applied + skipped + 1; }

  /// An applied step, and the scaler's good step.
  template <class Scaler>
  void apply(Scaler& scaler) {
    scaler.update(false);
    ++applied;
    consecutive_skips = 0;
  }

  /// A skipped step: throws first if the scaler (on an overflow) or the skip limit says the run
  /// cannot go on (changing nothing), then lets the scaler see the overflow. why() names what
  /// overflowed or spiked. A spike guard's skip is no overflow: the scaler sees no step.
  template <class Scaler, class Why>
  void skip(Scaler& scaler, std::uint64_t max_consecutive_skips, Why&& why, bool overflow = true) {
    const double scale = scaler.scale();
    if (overflow && scaler.raises_on(true))
      fail("loss scale already at its minimum (", scale, ") and the gradients still overflow; ", why(), "; skipped ",
           skipped, " of ", skipped + applied,
           " steps so far. Consider bf16, a lower learning rate, or at_min_scale::keep_skipping");
    if (max_consecutive_skips && consecutive_skips + 1 >= max_consecutive_skips)
      fail(consecutive_skips + 1, " consecutive steps skipped (max_consecutive_skips = ", max_consecutive_skips,
           "); loss scale ", scale, "; ", why());
    if (overflow) scaler.update(true);
    ++skipped;
    ++consecutive_skips;
  }

  /// The status's counters and scale, as they stand after the call.
  template <class Scaler>
  void report(step_status& st, const Scaler& scaler) const {
    st.scale_after = scaler.scale();
    st.skipped_steps = skipped;
    st.consecutive_skips = consecutive_skips;
  }
};

/// Names the tensors whose gradients held inf or NaN on this rank, from the per-chunk flags of the
/// overflow pass over `work` (name_of(t): tensor t's name).
MPOPT_DECL std::string nonfinite_report(const work_list& work, const std::uint8_t* chunk_nonfinite,
                                        std::size_t tensors,
                                        const std::function<const std::string&(std::size_t)>& name_of);

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "step_counts.ipp"
#endif
