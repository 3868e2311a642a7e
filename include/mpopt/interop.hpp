// mpopt — numeric_traits for other libraries' 16-bit types, so their tensors go to the optimizer with
// no cast: Eigen::half and Eigen::bfloat16 (Eigen 3.4 or later), CUDA's __half and __nv_bfloat16.
//
// Include it after those libraries' headers: each adapter is declared only when its library's header
// was already included (this header includes none of them, and costs nothing without them). It has
// no include guard, on purpose: including it again after more headers adds what they brought, and
// each adapter is declared at most once. (std::float16_t and std::bfloat16_t need nothing: see
// numeric.hpp.)
#include "version.hpp"  // first: C++20, or a clear error

#include "numeric.hpp"

// Eigen: Eigen/Core defines EIGEN_CORE_H (its include guard) and the version macros.
#if defined(EIGEN_CORE_H) && defined(EIGEN_WORLD_VERSION) && !defined(MPOPT_INTEROP_EIGEN)
#if EIGEN_VERSION_AT_LEAST(3, 4, 0)
#define MPOPT_INTEROP_EIGEN
template <>
struct mpopt::numeric_traits<Eigen::half> {  // IEEE binary16
  using storage = mpopt::half;
};
template <>
struct mpopt::numeric_traits<Eigen::bfloat16> {  // the top 16 bits of a float
  using storage = mpopt::bfloat16;
};
#endif
#endif

// CUDA: cuda_fp16.h and cuda_bf16.h, compiled by nvcc or by a host compiler.
#if defined(__CUDA_FP16_H__) && !defined(MPOPT_INTEROP_CUDA_FP16)
#define MPOPT_INTEROP_CUDA_FP16
template <>
struct mpopt::numeric_traits<__half> {
  using storage = mpopt::half;
};
#endif
#if defined(__CUDA_BF16_H__) && !defined(MPOPT_INTEROP_CUDA_BF16)
#define MPOPT_INTEROP_CUDA_BF16
template <>
struct mpopt::numeric_traits<__nv_bfloat16> {
  using storage = mpopt::bfloat16;
};
#endif
