// mpopt — the device backend's lane type: four fp32 lanes per thread, moved 16 bytes at a time
// (8 for 16-bit types), so a warp reads 512 contiguous bytes of fp32 state per load. On the GPU
// every operation is an explicitly rounded intrinsic (__fadd_rn, ...), so nvcc's -fmad cannot fuse
// a multiply into an add and change a result; off the GPU (the Thrust-OMP build) it is plain float
// arithmetic compiled without contraction, like the host lanes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../../numeric.hpp"
#include "../config.hpp"
#include "float_bits.hpp"
#include "lanes.hpp"

namespace mpopt::detail {

struct quad {
  float x[4];
  quad() = default;
  MPOPT_HOST_DEVICE quad(float s) : x{s, s, s, s} {}  // NOLINT: broadcasts read like scalars in formulas
};

/// One lane mask bit per lane.
struct quad_mask {
  bool x[4];
};

/// The last vector of a chunk: lanes [0, n) hold elements, n in 1..3. holds() spells out that lane
/// 0 always does and lane 3 never: two lane conditions instead of four, fewer registers.
struct quad_tail {
  unsigned n;
  MPOPT_HOST_DEVICE bool holds(unsigned j) const { return j == 0 || (j < 3 && j < n); }
};

namespace rn {
#if defined(__CUDA_ARCH__)
MPOPT_HOST_DEVICE float add(float a, float b) { return __fadd_rn(a, b); }
MPOPT_HOST_DEVICE float sub(float a, float b) { return __fsub_rn(a, b); }
MPOPT_HOST_DEVICE float mul(float a, float b) { return __fmul_rn(a, b); }
MPOPT_HOST_DEVICE float div(float a, float b) { return __fdiv_rn(a, b); }
#else
MPOPT_HOST_DEVICE float add(float a, float b) { return a + b; }
MPOPT_HOST_DEVICE float sub(float a, float b) { return a - b; }
MPOPT_HOST_DEVICE float mul(float a, float b) { return a * b; }
MPOPT_HOST_DEVICE float div(float a, float b) { return a / b; }
#endif
}  // namespace rn

template <class F>
MPOPT_HOST_DEVICE quad lanewise(quad a, quad b, F f) {
  quad r;
  for (int j = 0; j < 4; ++j) r.x[j] = f(a.x[j], b.x[j]);
  return r;
}

MPOPT_HOST_DEVICE quad operator+(quad a, quad b) { return lanewise(a, b, rn::add); }
MPOPT_HOST_DEVICE quad operator-(quad a, quad b) { return lanewise(a, b, rn::sub); }
MPOPT_HOST_DEVICE quad operator*(quad a, quad b) { return lanewise(a, b, rn::mul); }
MPOPT_HOST_DEVICE quad operator/(quad a, quad b) { return lanewise(a, b, rn::div); }
MPOPT_HOST_DEVICE quad operator-(quad a) { return lanewise(a, a, [](float x, float) { return -x; }); }
MPOPT_HOST_DEVICE quad max(quad a, quad b) { return lanewise(a, b, [](float x, float y) { return max(x, y); }); }
MPOPT_HOST_DEVICE quad min(quad a, quad b) { return lanewise(a, b, [](float x, float y) { return min(x, y); }); }
MPOPT_HOST_DEVICE quad sqrt(quad a) { return lanewise(a, a, [](float x, float) { return sqrt(x); }); }
MPOPT_HOST_DEVICE quad fma(quad a, quad b, quad c) {
  quad r;
  for (int j = 0; j < 4; ++j) r.x[j] = fma(a.x[j], b.x[j], c.x[j]);
  return r;
}
MPOPT_HOST_DEVICE quad_mask nonnegative(quad a) {
  return {{nonnegative(a.x[0]), nonnegative(a.x[1]), nonnegative(a.x[2]), nonnegative(a.x[3])}};
}
MPOPT_HOST_DEVICE quad select(quad_mask m, quad a, quad b) {
  quad r;
  for (int j = 0; j < 4; ++j) r.x[j] = select(m.x[j], a.x[j], b.x[j]);
  return r;
}

#if defined(__CUDA_ARCH__)
constexpr bool on_gpu = true;
#else
constexpr bool on_gpu = false;
#endif
/// Whether T converts by the GPU's conversion instructions here: fp16 on a GPU. Its integer form
/// (float_bits.hpp) is about 20 instructions a value, with which a turn of the norm pass's loop
/// issued 1.8 times bf16's instructions and Adam's update 1.27 times (suite 'sass'). cvt rounds to
/// nearest even, as float_to_half_bits does; only NaNs are made otherwise, so widen and narrow
/// mend those.
template <class T>
constexpr bool converts_by_cvt = on_gpu && std::is_same_v<T, half>;

/// By cvt where converts_by_cvt<T> (a NaN's bits aside), else as static_cast.
template <class T>
MPOPT_HOST_DEVICE float cvt_widen(T x) {
  if constexpr (converts_by_cvt<T>) {
    float f = 0;
#if defined(__CUDA_ARCH__)
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
#endif
    return f;
  } else {
    return static_cast<float>(x);
  }
}
template <class T>
MPOPT_HOST_DEVICE T cvt_narrow(float f) {
  if constexpr (converts_by_cvt<T>) {
    std::uint16_t h = 0;
#if defined(__CUDA_ARCH__)
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
#endif
    return half::from_bits(h);
  } else {
    return static_cast<T>(f);
  }
}

/// A 16-bit or fp32 value to float and back, with static_cast's bits.
template <class T>
MPOPT_HOST_DEVICE float widen(T x) {
  if constexpr (converts_by_cvt<T>) return (x.bits & 0x7FFFu) > 0x7C00u ? half_nan_to_float(x.bits) : cvt_widen(x);
  else return static_cast<float>(x);
}
template <class T>
MPOPT_HOST_DEVICE T narrow(float f) {
  if constexpr (converts_by_cvt<T>) return f != f ? half::from_bits(float_nan_to_half_bits(f)) : cvt_narrow<T>(f);
  else return static_cast<T>(f);
}
/// Four values at once: where converts_by_cvt<T>, one NaN test for the four (a NaN takes widen's
/// or narrow's exact path).
template <class T>
MPOPT_HOST_DEVICE quad widen4(const T (&e)[4]) {
  quad r;
  bool exact = !converts_by_cvt<T>;
  if constexpr (converts_by_cvt<T>) {
    // Two halves a word: a magnitude above 0x7C00 (a NaN) carries into its half's top bit.
    std::uint32_t w[2];
    std::memcpy(w, e, sizeof w);
    exact = (((w[0] & 0x7FFF7FFFu) + 0x03FF03FFu) | ((w[1] & 0x7FFF7FFFu) + 0x03FF03FFu)) & 0x80008000u;
  }
  if (exact) [[unlikely]] {
    for (int j = 0; j < 4; ++j) r.x[j] = widen(e[j]);
  } else {
    for (int j = 0; j < 4; ++j) r.x[j] = cvt_widen(e[j]);
  }
  return r;
}
template <class T>
MPOPT_HOST_DEVICE void narrow4(quad x, T (&e)[4]) {
  bool exact = !converts_by_cvt<T>;
  if constexpr (converts_by_cvt<T>) exact = x.x[0] != x.x[0] || x.x[1] != x.x[1] || x.x[2] != x.x[2] || x.x[3] != x.x[3];
  if (exact) [[unlikely]] {
    for (int j = 0; j < 4; ++j) e[j] = narrow<T>(x.x[j]);
  } else {
    for (int j = 0; j < 4; ++j) e[j] = cvt_narrow<T>(x.x[j]);
  }
}

/// Tells the compiler that p is device memory (global), which is all cuda.hpp takes: it cannot see
/// that through the tensor table, and without it used generic loads for the user's tensors.
MPOPT_HOST_DEVICE void in_device_memory([[maybe_unused]] const void* p) {
#if defined(__CUDA_ARCH__)
  __builtin_assume(__isGlobal(p));
#endif
}

/// Four lanes. With Aligned, full vectors of the user's tensors are single 16-byte (fp32) or
/// 8-byte (16-bit) accesses, which needs every chunk of them aligned to that; without, they go
/// element by element. State buffers (padded<T>) are always aligned and read whole.
template <bool Aligned>
struct quad_lanes {
  using vec = quad;
  using mask = quad_mask;
  using tail = quad_tail;
  static constexpr std::size_t width = 4;
  static constexpr bool reads_padding = true;
  static constexpr const char* name = Aligned ? "quad" : "quad (unaligned)";

  MPOPT_HOST_DEVICE static quad_tail first(std::size_t n) { return {unsigned(n)}; }

  template <class T>
  MPOPT_HOST_DEVICE static quad load(const T* p, full_t) {
    in_device_memory(p);
    if constexpr (Aligned) {
      return load_whole(p);
    } else {
      quad r;
      for (int j = 0; j < 4; ++j) r.x[j] = widen(p[j]);
      return r;
    }
  }
  template <class T>
  MPOPT_HOST_DEVICE static quad load(const T* p, quad_tail t) {
    in_device_memory(p);
    quad r(0.0f);  // constant lane indices only: the quad stays in registers
    for (unsigned j = 0; j < 4; ++j)
      if (t.holds(j)) r.x[j] = widen(p[j]);
    return r;
  }
  template <class T>
  MPOPT_HOST_DEVICE static void store(T* p, quad x, full_t) {
    in_device_memory(p);
    if constexpr (Aligned) {
      store_whole(p, x);
    } else {
      for (int j = 0; j < 4; ++j) p[j] = narrow<T>(x.x[j]);
    }
  }
  template <class T>
  MPOPT_HOST_DEVICE static void store(T* p, quad x, quad_tail t) {
    in_device_memory(p);
    for (unsigned j = 0; j < 4; ++j)
      if (t.holds(j)) p[j] = narrow<T>(x.x[j]);
  }
  /// A padded state buffer: always aligned, and whole at the tail.
  template <class T>
  MPOPT_HOST_DEVICE static quad load_padded(const T* p) {
    in_device_memory(p);
    return load_whole(p);
  }

  MPOPT_HOST_DEVICE static std::uint32_t bits_of(quad_mask m) {
    return std::uint32_t(m.x[0]) | std::uint32_t(m.x[1]) << 1 | std::uint32_t(m.x[2]) << 2 | std::uint32_t(m.x[3]) << 3;
  }
  MPOPT_HOST_DEVICE static quad_mask mask_of(std::uint32_t b) {
    return {{(b & 1u) != 0, (b & 2u) != 0, (b & 4u) != 0, (b & 8u) != 0}};
  }
  MPOPT_HOST_DEVICE static std::uint32_t bits_of(full_t) { return 0xFu; }
  MPOPT_HOST_DEVICE static std::uint32_t bits_of(quad_tail t) { return (1u << t.n) - 1u; }
  MPOPT_HOST_DEVICE static quad keep(quad x, quad, full_t) { return x; }
  MPOPT_HOST_DEVICE static quad keep(quad x, quad fallback, quad_tail t) {
    for (unsigned j = 0; j < 4; ++j)
      if (!t.holds(j)) x.x[j] = fallback.x[j];
    return x;
  }
  MPOPT_HOST_DEVICE static float max_lane(quad x) { return max(max(x.x[0], x.x[1]), max(x.x[2], x.x[3])); }
  template <class T>
  MPOPT_HOST_DEVICE static quad round_stochastic(quad x, std::uint32_t key, std::uint64_t index) {
    for (unsigned j = 0; j < 4; ++j) x.x[j] = stochastic_round<T>(x.x[j], rounding_noise(key, index + j));
    return x;
  }

 private:
  /// 16 bytes of float or 8 bytes of 16-bit values in one access (memcpy off the GPU: no aliasing
  /// questions, and the compiler emits one vector move).
  template <class T>
  MPOPT_HOST_DEVICE static quad load_whole(const T* p) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 2, "device lanes load fp32, fp16 and bf16");
    if constexpr (sizeof(T) == 4) {
#if defined(__CUDA_ARCH__)
      const float4 v = *reinterpret_cast<const float4*>(p);
      quad r;
      r.x[0] = v.x, r.x[1] = v.y, r.x[2] = v.z, r.x[3] = v.w;
      return r;
#else
      quad r;
      std::memcpy(r.x, p, sizeof r.x);
      return r;
#endif
    } else {
      T e[4];
#if defined(__CUDA_ARCH__)
      *reinterpret_cast<uint2*>(e) = *reinterpret_cast<const uint2*>(p);
#else
      std::memcpy(e, p, sizeof e);
#endif
      return widen4(e);
    }
  }
  template <class T>
  MPOPT_HOST_DEVICE static void store_whole(T* p, quad x) {
    if constexpr (sizeof(T) == 4) {
#if defined(__CUDA_ARCH__)
      *reinterpret_cast<float4*>(p) = make_float4(x.x[0], x.x[1], x.x[2], x.x[3]);
#else
      std::memcpy(p, x.x, sizeof x.x);
#endif
    } else {
      T e[4];
      narrow4(x, e);
#if defined(__CUDA_ARCH__)
      *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(e);
#else
      std::memcpy(p, e, sizeof e);
#endif
    }
  }
};

}  // namespace mpopt::detail
