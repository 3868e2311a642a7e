// mpopt — partitioning policies: which part of the optimizer state each rank owns.
#pragma once

#include <string_view>

namespace mpopt {

/// Every rank holds the full master and rule state and updates every element (plain data parallel).
struct replicated {
  static constexpr std::string_view name = "replicated";
  static constexpr bool sharded = false;  ///< every rank sees every element: norms are not summed over ranks
};

}  // namespace mpopt
