// mpopt — the separately compiled mode's factory unit: with MPOPT_SEPARATE_COMPILATION, a program that
// calls make_optimizer over one process includes this header in one of its units (beside the one
// that includes src.hpp), which compiles the 36 optimizer types a DeepSpeed configuration can name,
// once. A build may spread them over several units instead, MPOPT_FACTORY_PART lines in each (Meson's
// mpopt-compiled builds three: src/make_optimizer_*.cpp), which bounds a unit's memory below 1 GB.
#pragma once

#if !defined(MPOPT_SEPARATE_COMPILATION)
#error "<mpopt/src_make_optimizer.hpp> is for builds with MPOPT_SEPARATE_COMPILATION defined in every unit; header-only builds need no src_make_optimizer.hpp"
#endif

#include "make_optimizer.hpp"

namespace mpopt::detail {
MPOPT_FACTORY_PARTS()
}  // namespace mpopt::detail
