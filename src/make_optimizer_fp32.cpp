// The separately compiled mode's factory (include/mpopt/src_make_optimizer.hpp), a third of it: the
// 9 fp32 optimizer types over one process.
#include <mpopt/make_optimizer.hpp>

namespace mpopt::detail {
MPOPT_FACTORY_PART(, fp32, no_scaling)
}  // namespace mpopt::detail
