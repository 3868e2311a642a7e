// The separately compiled mode's factory (include/mpopt/src_make_optimizer.hpp), a third of it: the 18
// fp16 optimizer types over one process. Three units, each under 1 GB of compiler memory.
#include <mpopt/make_optimizer.hpp>

namespace mpopt::detail {
MPOPT_FACTORY_PART(, fp16, static_scale)
MPOPT_FACTORY_PART(, fp16, dynamic_scale)
}  // namespace mpopt::detail
