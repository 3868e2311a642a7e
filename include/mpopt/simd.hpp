// mpopt — the SIMD instruction set the host backend's passes run in. The best this CPU has is
// chosen at run time (no -march flag is needed; the AVX2 and AVX-512 paths are always compiled on
// x86-64 with g++ or clang), unless the environment variable MPOPT_SIMD or host::use_simd() names
// another. Every level gives the same bits (sums have one lane layout, square_sum.hpp), so the
// choice only changes speed.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "detail/config.hpp"
#include "error.hpp"

#if MPOPT_X86_SIMD
#include <cpuid.h>
#endif

namespace mpopt {

enum class simd_level { scalar, avx2, avx512 };

constexpr std::string_view to_string(simd_level s) {
  switch (s) {
    case simd_level::avx2: return "avx2";
    case simd_level::avx512: return "avx512";
    default: return "scalar";
  }
}

/// Whether this CPU, its operating system and this build can run level s: AVX2 with FMA and F16C,
/// AVX-512 with F and BW (and the OS saving the registers each needs). Builds without the vector
/// paths (MPOPT_X86_SIMD, detail/config.hpp: not x86-64, unoptimized, nvcc) run scalar only.
inline bool cpu_supports(simd_level s) {
  if (s == simd_level::scalar) return true;
#if MPOPT_X86_SIMD
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool fma = c >> 12 & 1, osxsave = c >> 27 & 1, avx = c >> 28 & 1, f16c = c >> 29 & 1;
  if (!(fma && osxsave && avx && f16c)) return false;
  unsigned xcr0, xcr0_high;
  __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
  if ((xcr0 & 0x6) != 0x6 || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;  // SSE and AVX state
  const bool avx2 = b >> 5 & 1, avx512f = b >> 16 & 1, avx512bw = b >> 30 & 1;
  if (s == simd_level::avx2) return avx2;
  return avx2 && avx512f && avx512bw && (xcr0 & 0xE0) == 0xE0;  // opmask and zmm state
#else
  return false;
#endif
}

namespace detail {

inline simd_level best_simd() {
  if (cpu_supports(simd_level::avx512)) return simd_level::avx512;
  return cpu_supports(simd_level::avx2) ? simd_level::avx2 : simd_level::scalar;
}

inline void require_simd(simd_level s, std::string_view by) {
  if (cpu_supports(s)) return;
#if MPOPT_X86_SIMD
  throw error(std::string(by) + ": this CPU cannot run " + std::string(to_string(s)) + " (it can: " +
              std::string(to_string(best_simd())) + ")");
#else
  throw error(std::string(by) + ": " + std::string(to_string(s)) +
              " is not in this build, which runs the scalar path only (the vector paths need x86-64, g++ or "
              "clang outside nvcc, and optimization: -O1 or more)");
#endif
}

/// MPOPT_SIMD if set (scalar, avx2 or avx512), else the best level.
inline simd_level initial_simd() {
  const char* name = std::getenv("MPOPT_SIMD");
  if (name == nullptr || *name == '\0') return best_simd();
  for (simd_level s : {simd_level::scalar, simd_level::avx2, simd_level::avx512})
    if (to_string(s) == name) {
      require_simd(s, "MPOPT_SIMD");
      return s;
    }
  throw error("MPOPT_SIMD=" + std::string(name) + ": expected scalar, avx2 or avx512");
}

/// The level passes run at, for the whole process. Every level gives the same bits, so a change
/// while another thread steps is harmless.
inline std::atomic<simd_level>& simd_setting() {
  static std::atomic<simd_level> level{initial_simd()};
  return level;
}

}  // namespace detail
}  // namespace mpopt
