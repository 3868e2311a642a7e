// The separately compiled mode's standard optimizers (include/mpopt/src_optimizers.hpp), a third of
// them: the 18 fp16 types (static and dynamic loss scale), and make_optimizer's part that makes them. Three units, each under 1 GB of compiler memory.
#include <mpopt/make_optimizer.hpp>

MPOPT_STANDARD_OPTIMIZERS_IN(FP16)

namespace mpopt::detail {
MPOPT_FACTORY_PART(, fp16, static_scale)
MPOPT_FACTORY_PART(, fp16, dynamic_scale)
}  // namespace mpopt::detail
