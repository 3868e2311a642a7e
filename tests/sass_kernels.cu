// The device backend's kernels for suite 'sass' (sass_check.py), without the doctest TU's host
// code: the built-in rules' update passes for every precision (stochastic rounding too), each
// aligned and unaligned, and the passes that finish in their own kernel (the overflow-and-norm
// pass with the step's sums and decision, LAMB's moments with its trust ratios). The flat-buffer
// passes and the chunk totals come along (the class instantiation below).
#include <mpopt/adam.hpp>
#include <mpopt/cuda.hpp>
#include <mpopt/lamb.hpp>
#include <mpopt/precision.hpp>

namespace mpopt {

using cuda_passes = detail::backend_passes<cuda>;
template class detail::backend_passes<cuda>;  // its non-template members: the flat-buffer passes

#define MPOPT_UPDATE_KERNELS(P)                                                                                   \
  template void cuda_passes::initialize_state<P>(const detail::step_data<P>&, const float*);                      \
  template void cuda_passes::accumulate<P>(const detail::step_data<P>&, bool, float);                             \
  template void cuda_passes::gradient_norm<P>(const detail::step_data<P>&, double*);                              \
  template void cuda_passes::gradient_norm_sums<P>(const detail::step_data<P>&, double*, double*,                 \
                                                   const detail::step_rule*, detail::step_decision*);             \
  template void cuda_passes::rule_stage<adam, detail::update_stage, P>(const detail::step_data<P>&,                \
                                                                       const adam::scalars*, const float*, bool); \
  template void cuda_passes::rule_stage<lamb, detail::direction_stage, P>(const detail::step_data<P>&,            \
                                                                          const lamb::scalars*, const float*,     \
                                                                          bool);                                  \
  template void cuda_passes::rule_stage<lamb, detail::update_stage, P>(const detail::step_data<P>&,               \
                                                                       const lamb::scalars*, const float*, bool); \
  template void cuda_passes::rule_stage_scales<lamb, detail::direction_stage, P>(                                 \
      const detail::step_data<P>&, const lamb::scalars*, const std::size_t*, double*, double*, float*);          \
  template void cuda_passes::zero_grad<P>(const detail::step_data<P>&);

MPOPT_UPDATE_KERNELS(fp32)
MPOPT_UPDATE_KERNELS(fp16)
MPOPT_UPDATE_KERNELS(bf16)
MPOPT_UPDATE_KERNELS(fp16_stochastic)
MPOPT_UPDATE_KERNELS(bf16_stochastic)

}  // namespace mpopt
