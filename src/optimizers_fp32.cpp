// The separately compiled mode's standard optimizers (include/mpopt/src_optimizers.hpp), a third of
// them: the 9 fp32 types, and make_optimizer's part that makes them.
#include <mpopt/make_optimizer.hpp>

MPOPT_STANDARD_OPTIMIZERS_IN(FP32)

namespace mpopt::detail {
MPOPT_FACTORY_PART(, fp32, no_scaling)
}  // namespace mpopt::detail
