// mpopt — communicator policies: the collectives the optimizer runs across data-parallel ranks.
// Counts are elements, never bytes.
#pragma once

#include <span>
#include <string_view>

namespace mpopt {

enum class reduce_op { sum, max };

/// One rank: every collective is the identity.
struct single_process {
  static constexpr std::string_view name = "single_process";
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class T>
  void all_reduce(std::span<T>, reduce_op) {}
};

}  // namespace mpopt
