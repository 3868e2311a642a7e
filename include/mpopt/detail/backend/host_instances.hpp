// mpopt — the host passes of mpopt's own precisions (fp32, fp16, bf16) and rules, compiled once per
// program in the separately compiled mode (docs/install.md, "Faster builds"): each header that brings passes
// declares them here with EXTERN = extern, and <mpopt/src.hpp> defines them (EXTERN empty). They
// are most of what an optimizer costs to compile: three SIMD levels of every pass. A precision,
// rule or backend of the user's instantiates its passes where they run, from host_passes.hpp.
#pragma once

#include "../../host.hpp"
#include "../../precision.hpp"
#include "../passes/passes.hpp"

/// host::run over one pass type: a declaration (EXTERN = extern) or the definition (empty).
#define MPOPT_HOST_RUN(EXTERN, ...) \
  EXTERN template void mpopt::host::run<__VA_ARGS__>(const mpopt::detail::work_list&, const __VA_ARGS__&, bool);

/// LIST(EXTERN, P) for each of mpopt's own precisions.
#define MPOPT_FOR_OWN_PRECISIONS(LIST, EXTERN) LIST(EXTERN, mpopt::fp32) LIST(EXTERN, mpopt::fp16) LIST(EXTERN, mpopt::bf16)

namespace mpopt::detail {
template <>
inline constexpr bool host_precision_compiled<fp32> = true;
template <>
inline constexpr bool host_precision_compiled<fp16> = true;
template <>
inline constexpr bool host_precision_compiled<bf16> = true;
}  // namespace mpopt::detail

/// In a rule's header, beside its passes' declarations: they are compiled once, in every own precision.
#define MPOPT_HOST_RULE_COMPILED(Rule) \
  namespace mpopt::detail {            \
  template <>                          \
  inline constexpr bool host_rule_compiled<Rule> = true; \
  }

/// What every optimizer in precision P runs: state start, accumulation, the overflow-and-norm pass,
/// zeroing, and the ZeRO buckets' packing (gradients travel as fp32 in mpopt's own precisions).
#define MPOPT_HOST_STEP_PASSES(EXTERN, P)                                         \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::initialize_pass<P>)                       \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::accumulate_pass<P>)                       \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::gradient_norm_pass<P>)                    \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::zero_grad_pass<P>)                        \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::copy_params_pass<P>)                      \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::pack_gradients_pass<P, float>)            \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::unpack_gradients_pass<P, float>)

/// The passes over flat fp32 buffers: folding received gradients, and the compressed all-reduce's.
#define MPOPT_HOST_FLAT_PASSES(EXTERN)                                                                              \
  EXTERN template void mpopt::host::run_flat<mpopt::detail::fold_pass<float, float>>(                              \
      const mpopt::detail::fold_pass<float, float>&, bool);                                                         \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::sum_squares_pass)                                                           \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::copy_pass)                                                                  \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::add_into_pass)                                                              \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::compress_signs_pass)                                                        \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::combine_signs_pass)                                                         \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::decode_signs_pass)

/// A rule's stage in precision P.
#define MPOPT_HOST_RULE_STAGE(EXTERN, P, Rule, Stage) MPOPT_HOST_RUN(EXTERN, mpopt::detail::rule_pass<P, Rule, Stage>)

/// The compressing rules' driver passes in precision P (detail/passes/onebit_passes.hpp).
#define MPOPT_HOST_COMPRESSED_PASSES(EXTERN, P)                     \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::onebit_feed_pass<P>)        \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::onebit_momentum_pass<P>)    \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::onebit_adam_pass<P>)        \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::gradient_feed_pass<P>)      \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::averaged_gradient_pass<P>)  \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::local_step_pass<P>)         \
  MPOPT_HOST_RUN(EXTERN, mpopt::detail::sync_pass<P>)

MPOPT_FOR_OWN_PRECISIONS(MPOPT_HOST_STEP_PASSES, extern)
MPOPT_HOST_FLAT_PASSES(extern)
