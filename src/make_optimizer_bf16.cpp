// The separately compiled mode's factory (include/mpopt/src_make_optimizer.hpp), a third of it: the
// 9 bf16 optimizer types over one process.
#include <mpopt/make_optimizer.hpp>

namespace mpopt::detail {
MPOPT_FACTORY_PART(, bf16, no_scaling)
}  // namespace mpopt::detail
