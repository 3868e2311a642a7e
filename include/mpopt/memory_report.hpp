// mpopt — what memory the optimizer uses on this rank, buffer by buffer, so users can check it
// against what they measure (and against the ZeRO formulas once state is partitioned).
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <cstddef>
#include <string>
#include <vector>

#include "detail/config.hpp"

namespace mpopt {

struct memory_buffer {
  std::string name;
  std::string purpose;
  std::size_t bytes = 0;
  bool owned = true;  ///< allocated by the optimizer; false for the user's own tensors
};

struct memory_report {
  std::vector<memory_buffer> buffers;

  std::size_t owned_bytes() const { return sum(true); }
  std::size_t user_bytes() const { return sum(false); }

  /// One line per buffer, then the totals.
  MPOPT_DECL std::string to_string() const;

 private:
  MPOPT_DECL std::size_t sum(bool owned) const;
};

}  // namespace mpopt

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "memory_report.ipp"
#endif
