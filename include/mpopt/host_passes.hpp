// mpopt — how the host backend runs a pass: each chunk in SIMD lanes at the level host::simd()
// chose (AVX-512, AVX2 or scalar), the pass compiled once for each instruction set.
//
// Header-only builds read it through host.hpp. In the separately compiled mode, mpopt's own passes
// are compiled once (detail/backend/host_instances.hpp), so a unit reads it, and <immintrin.h>,
// only when its optimizer has a rule or precision of the user's own; where it is missing, the
// optimizer stops compilation on a message that names this header.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <algorithm>
#include <cstddef>

#include "detail/config.hpp"
#if MPOPT_X86_SIMD
#include <immintrin.h>  // _mm256_zeroupper
#endif

#include "detail/lanes/avx2_lanes.hpp"
#include "detail/lanes/avx512_lanes.hpp"
#include "detail/lanes/lanes.hpp"
#include "detail/passes/square_sum.hpp"
#include "detail/passes/work_list.hpp"
#include "host.hpp"

namespace mpopt::detail {

/// The marker detail::host_passes_included looks for.
constexpr bool host_passes_defined(type_tag<host>) { return true; }

/// One chunk of a pass in lanes L: its vectors in order (or 16-element granules), then its sums.
template <class L, class Pass>
void run_host_chunk(const Pass& pass, std::size_t ci) {
  const auto s = pass.at(ci);
  const std::size_t n = pass.size(ci);
  host_sums<L> sums;
  if constexpr (granule_of<Pass>() > 0) {
    for (std::size_t g = 0; g < n; g += Pass::granule)
      pass.template apply_granule<L>(s, g, std::min(Pass::granule, n - g), sums);
  } else {
    for_each_vector<L>(n, [&](std::size_t i, auto tail) { pass.template apply<L>(s, i, tail, sums); });
  }
  sums.write(pass.out, ci);
}

#if MPOPT_X86_SIMD
// The pass compiled for each instruction set: everything it calls is inlined into these. Each
// clears the vector registers' upper halves on leaving (vzeroupper): g++ does so itself only from
// -O2 on, and without it the caller's SSE code (the default target's floating point, libm) runs
// two to three times slower after every pass in -O1, -Og and -Os builds.
template <class Pass>
MPOPT_TARGET_ENTRY(MPOPT_ISA_AVX512) void run_host_chunk_avx512(const Pass& pass, std::size_t ci) {
  run_host_chunk<avx512_lanes>(pass, ci);
  _mm256_zeroupper();
}
template <class Pass>
MPOPT_TARGET_ENTRY(MPOPT_ISA_AVX2) void run_host_chunk_avx2(const Pass& pass, std::size_t ci) {
  run_host_chunk<avx2_lanes>(pass, ci);
  _mm256_zeroupper();
}
#endif

/// One chunk of a pass at the current SIMD level.
template <class Pass>
auto host_chunk_runner() -> void (*)(const Pass&, std::size_t) {
  switch (host::simd()) {
#if MPOPT_X86_SIMD
    case simd_level::avx512: return run_host_chunk_avx512<Pass>;
    case simd_level::avx2: return run_host_chunk_avx2<Pass>;
#endif
    default: return run_host_chunk<scalar_lanes, Pass>;
  }
}

}  // namespace mpopt::detail

template <class Pass>
void mpopt::host::run(const detail::work_list& work, const Pass& pass, bool) {
  const auto chunk = detail::host_chunk_runner<Pass>();
  for_each_chunk(work, [&](std::size_t ci) { chunk(pass, ci); });
}

template <class Pass>
void mpopt::host::run_flat(const Pass& pass, bool) {
  const auto chunk = detail::host_chunk_runner<Pass>();
  for (std::size_t ci = 0; ci < pass.count(); ++ci) chunk(pass, ci);
}
