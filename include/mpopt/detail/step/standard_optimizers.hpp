// mpopt — the optimizer types a DeepSpeed configuration names, on the host backend over one process
// (make_optimizer's 36), as lists for the separately compiled mode: each rule's header declares its
// types extern, and <mpopt/src_optimizers.hpp> (or src/optimizers_*.cpp) defines them, with every
// member. A unit that uses one of them then compiles none of its code, only what it inlines.
#pragma once

#include "../../host.hpp"
#include "../../loss_scale.hpp"
#include "../../optimizer.hpp"
#include "../../partition.hpp"
#include "../../precision.hpp"
#include "../checkpoint/checkpoint.hpp"  // (in this mode without nlohmann/json or <filesystem>)

/// One optimizer type of rule R: its pipeline and its checkpoint adapter. (Not the facade, whose
/// members forward to them, inline: clang 14 would instantiate its members whose constraints fail.)
#define MPOPT_STANDARD_OPTIMIZER(EXTERN, P, S, PARTITION, R)                                                 \
  EXTERN template class mpopt::detail::step_pipeline<P, S, PARTITION, R, mpopt::host, mpopt::single_process>; \
  EXTERN template class mpopt::detail::checkpointing<                                                        \
      mpopt::detail::step_pipeline<P, S, PARTITION, R, mpopt::host, mpopt::single_process>>;
/// Under ZeRO stages 0, 1 and 2, or (the compressing rules) stage 0 only.
#define MPOPT_EVERY_STAGE(EXTERN, P, S, R)                     \
  MPOPT_STANDARD_OPTIMIZER(EXTERN, P, S, mpopt::replicated, R) \
  MPOPT_STANDARD_OPTIMIZER(EXTERN, P, S, mpopt::zero1, R)      \
  MPOPT_STANDARD_OPTIMIZER(EXTERN, P, S, mpopt::zero2, R)
#define MPOPT_STAGE_0_ONLY(EXTERN, P, S, R) MPOPT_STANDARD_OPTIMIZER(EXTERN, P, S, mpopt::replicated, R)

/// Rule R's types in one precision (with each scaler a configuration gives it), and the registry
/// and state they share.
#define MPOPT_RULE_PARTS(EXTERN, P, R)                                       \
  EXTERN template class mpopt::detail::tensor_registry<P, R, mpopt::host>; \
  EXTERN template struct mpopt::detail::step_state<P, R, mpopt::host>;
#define MPOPT_STANDARD_FP32(EXTERN, R, STAGES) \
  MPOPT_RULE_PARTS(EXTERN, mpopt::fp32, R) STAGES(EXTERN, mpopt::fp32, mpopt::no_scaling, R)
#define MPOPT_STANDARD_BF16(EXTERN, R, STAGES) \
  MPOPT_RULE_PARTS(EXTERN, mpopt::bf16, R) STAGES(EXTERN, mpopt::bf16, mpopt::no_scaling, R)
#define MPOPT_STANDARD_FP16(EXTERN, R, STAGES)                   \
  MPOPT_RULE_PARTS(EXTERN, mpopt::fp16, R)                       \
  STAGES(EXTERN, mpopt::fp16, mpopt::static_scale, R)            \
  STAGES(EXTERN, mpopt::fp16, mpopt::dynamic_scale, R)
/// Rule R's types in every precision: what its header declares extern.
#define MPOPT_STANDARD_OPTIMIZERS(EXTERN, R, STAGES) \
  MPOPT_STANDARD_FP32(EXTERN, R, STAGES) MPOPT_STANDARD_BF16(EXTERN, R, STAGES) MPOPT_STANDARD_FP16(EXTERN, R, STAGES)
/// Every rule's types in one precision (PRECISION: FP32, BF16 or FP16): what a factory unit defines.
#define MPOPT_STANDARD_OPTIMIZERS_IN(PRECISION)                         \
  MPOPT_STANDARD_##PRECISION(, mpopt::adam, MPOPT_EVERY_STAGE)          \
  MPOPT_STANDARD_##PRECISION(, mpopt::lamb, MPOPT_EVERY_STAGE)          \
  MPOPT_STANDARD_##PRECISION(, mpopt::onebit_lamb, MPOPT_STAGE_0_ONLY)  \
  MPOPT_STANDARD_##PRECISION(, mpopt::onebit_adam, MPOPT_STAGE_0_ONLY)  \
  MPOPT_STANDARD_##PRECISION(, mpopt::zero_one_adam, MPOPT_STAGE_0_ONLY)
