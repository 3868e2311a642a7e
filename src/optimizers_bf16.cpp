// The separately compiled mode's standard optimizers (include/mpopt/src_optimizers.hpp), a third of
// them: the 9 bf16 types, and make_optimizer's part that makes them.
#include <mpopt/make_optimizer.hpp>

MPOPT_STANDARD_OPTIMIZERS_IN(BF16)

namespace mpopt::detail {
MPOPT_FACTORY_PART(, bf16, no_scaling)
}  // namespace mpopt::detail
