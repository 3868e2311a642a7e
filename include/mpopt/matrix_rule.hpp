// mpopt — what runs a matrix rule (rule.hpp, matrix_rule: Muon, or yours): include it where such a
// rule is defined. It brings the host's BLAS (cblas.h: OpenBLAS or BLIS), which the matrix stage's
// operations run on (on the CUDA backend, cuBLAS: cuda_matrix.hpp); optimizers of other rules never
// include it.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include "detail/drivers/matrix_driver.hpp"
#include "rule.hpp"
