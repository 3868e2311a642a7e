// mpopt — portability macros shared by host and device code. Needs no CUDA header.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define MPOPT_HOST_DEVICE __host__ __device__ __forceinline__
#define MPOPT_DEVICE_COMPILER 1
#else
// The per-element functors are a few instructions each; g++ otherwise leaves some out of line
// (quad's operator*, adam_update<quad>) in the Thrust-OpenMP build, costing it 5x in the update loop.
#if defined(__GNUC__)
#define MPOPT_HOST_DEVICE inline __attribute__((always_inline))
#else
#define MPOPT_HOST_DEVICE inline
#endif
#define MPOPT_DEVICE_COMPILER 0
#endif

// OpenMP is optional: without -fopenmp the host backend runs on one thread and emits no
// unknown-pragma warnings.
#if defined(_OPENMP)
#define MPOPT_PRAGMA_OMP(x) _Pragma(#x)
#else
#define MPOPT_PRAGMA_OMP(x)
#endif

// GCC 12's AVX-512 intrinsics fill unused lanes from self-initialized "undefined" vectors, which
// -Wmaybe-uninitialized reports once inlined into user code (GCC PR105593). GCC consults these
// pragmas along the inlining chain, so code between BEGIN and END silences it for every caller.
#if defined(__GNUC__) && !defined(__clang__)
#define MPOPT_INTRINSICS_BEGIN                                  \
  _Pragma("GCC diagnostic push")                                \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")         \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define MPOPT_INTRINSICS_END _Pragma("GCC diagnostic pop")
#else
#define MPOPT_INTRINSICS_BEGIN
#define MPOPT_INTRINSICS_END
#endif
