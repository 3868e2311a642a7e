// mpopt — matrix rules (Muon, or yours) on the CUDA backend: their matrix stage where the backend
// keeps its buffers, on cuBLAS on a GPU (detail/math/device_newton_schulz.hpp). Include it beside
// <mpopt/cuda.hpp> and the rule's header, and link cuBLAS (-lcublas); optimizers of other rules, and
// those on the host, never include it.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include "cuda.hpp"
#include "detail/drivers/matrix_driver.hpp"
#include "detail/math/device_newton_schulz.hpp"

namespace mpopt::detail {

template <>
struct matrix_engine<memory_space::device> {
  using type = device_newton_schulz;
};

}  // namespace mpopt::detail
