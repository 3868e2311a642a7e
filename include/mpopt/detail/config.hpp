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

// Code that runs once per run or only on error (checkpoints, setup, the cross-rank checks, reports):
// optimized for size, so that nothing is inlined into it that grows it. Per optimizer type it is
// then compiled into little code, and fast.
#if defined(__GNUC__)
#define MPOPT_COLD __attribute__((cold))
#else
#define MPOPT_COLD
#endif

// Cold code that does not depend on the element types (checkpoint files, checks, layouts, reports)
// is declared MPOPT_DECL in its header and defined in the .ipp file beside it. Header-only (the
// default) each header includes its definitions, inline. With MPOPT_SEPARATE_COMPILATION defined in
// every unit of a program, headers only declare, and one unit of the program includes
// <mpopt/src.hpp>, which defines them all once (docs/benchmarks.md, "Compile time").
#if defined(MPOPT_SEPARATE_COMPILATION)
#define MPOPT_DECL MPOPT_COLD
#else
#define MPOPT_DECL MPOPT_COLD inline
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

// Host SIMD chosen at run time (simd.hpp): on x86-64 with g++ or clang, the vector lane types are
// compiled for their instruction set whatever the flags, between MPOPT_TARGET_BEGIN(isa) and
// MPOPT_TARGET_END, and each pass is instantiated once per set behind an MPOPT_TARGET_ENTRY(isa)
// function, which inlines the whole pass (flatten) so its vector code runs in that set. The
// formulas' default-target copies are never called; g++ still notes once per file that they take
// AVX vectors by value (-Wpsabi; only -Wno-psabi silences it). Their calls must be inlined (an AVX
// function and a default one disagree on how a vector argument travels), which takes optimization:
// unoptimized builds (-O0), like nvcc's host pass, keep to the scalar lanes. A program may define
// MPOPT_X86_SIMD=0 in every unit to keep to them too: a sanitizer build compiles a fifth faster.
#if defined(MPOPT_X86_SIMD)
#if MPOPT_X86_SIMD
#error "mpopt: MPOPT_X86_SIMD may be defined only as 0 (the scalar lanes alone)"
#endif
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__) && defined(__OPTIMIZE__)
#define MPOPT_X86_SIMD 1
#define MPOPT_ISA_AVX2 "avx2,fma,f16c"
#define MPOPT_ISA_AVX512 "avx2,fma,f16c,avx512f,avx512bw"
#define MPOPT_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define MPOPT_TARGET_BEGIN(isa) MPOPT_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define MPOPT_TARGET_END MPOPT_PRAGMA(clang attribute pop)
#else
#define MPOPT_TARGET_BEGIN(isa) MPOPT_PRAGMA(GCC push_options) MPOPT_PRAGMA(GCC target(isa))
#define MPOPT_TARGET_END MPOPT_PRAGMA(GCC pop_options)
#endif
#define MPOPT_TARGET_ENTRY(isa) __attribute__((target(isa), flatten))
#else
#define MPOPT_X86_SIMD 0
#endif
