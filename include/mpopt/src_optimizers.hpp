// mpopt — the separately compiled mode's second unit: the optimizer types a DeepSpeed configuration
// names, on the host backend over one process (36: fp32, bf16, fp16 with a static or dynamic scale x
// Adam and LAMB under ZeRO 0-2, the compressing rules under stage 0), with every member, and
// make_optimizer's parts that make them. Every unit of such a program declares them extern (the rule
// headers do, detail/step/standard_optimizers.hpp), so one of its units includes this header, beside
// the one that includes src.hpp; a unit using one of these types then compiles none of its code.
// A build may spread them over units instead, one precision each (Meson's mpopt-compiled builds
// three: src/optimizers_*.cpp), which keeps a unit below 1 GB of compiler memory.
#pragma once

#if !defined(MPOPT_SEPARATE_COMPILATION)
#error "<mpopt/src_optimizers.hpp> is for builds with MPOPT_SEPARATE_COMPILATION defined in every unit; header-only builds need no src_optimizers.hpp"
#endif

#include "make_optimizer.hpp"

MPOPT_STANDARD_OPTIMIZERS_IN(FP32)
MPOPT_STANDARD_OPTIMIZERS_IN(BF16)
MPOPT_STANDARD_OPTIMIZERS_IN(FP16)

namespace mpopt::detail {
MPOPT_FACTORY_PARTS()
}  // namespace mpopt::detail
