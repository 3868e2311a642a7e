// mpopt — Muon's orthogonalization: k steps of the quintic Newton-Schulz iteration on a matrix, its
// products on the host's BLAS (cblas_ssyrk and cblas_sgemm: OpenBLAS or BLIS).
//
// For a rows x cols matrix G, with X its transpose where rows > cols (so that X X^T is the smaller
// Gram matrix), X = X / max(||X||_F, eps), then each step
//     A = X X^T,   B = b A + c A A,   X = a X + B X,
// and the result is X, transposed back: what torch.optim.Muon computes (_zeropower_via_newtonschulz,
// without addmm, whose `c * A @ A` is (c A) A). In bf16 every value the iteration holds is rounded to bfloat16 where PyTorch's
// bf16 tensors round: the input, the normalized X, each product (summed in fp32, as bf16 GEMMs do)
// and each scaled term and sum. The products of bf16 values are exact in fp32, so sgemm over them is
// a bf16 GEMM with fp32 accumulation.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "../../numeric.hpp"
#include "../config.hpp"
#include "../options/validate.hpp"
#include "newton_schulz_settings.hpp"

namespace mpopt::detail {

/// The buffers of one orthogonalization, kept between calls: none is allocated once they have held
/// the largest matrix.
class newton_schulz {
 public:
  /// Orthogonalizes the row-major rows x cols matrix g in place.
  void operator()(std::span<float> g, std::size_t rows, std::size_t cols, const newton_schulz_settings& s) {
    if (g.size() != rows * cols) fail("newton_schulz: ", g.size(), " values for a ", rows, " x ", cols, " matrix");
    if (g.empty()) return;
    const bool transposed = rows > cols;
    const std::size_t m = std::min(rows, cols), n = std::max(rows, cols);
    const bool bf16 = s.precision == newton_schulz_precision::bf16;
    x_.resize(m * n);
    next_.resize(m * n);
    gram_.resize(m * m);
    update_.resize(m * m);

    // X, rounded as the iteration keeps it, and normalized by its Frobenius norm.
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < cols; ++j) x_[transposed ? j * n + i : i * n + j] = kept(g[i * cols + j], bf16);
    double squares = 0;
    for (float v : x_) squares += double(v) * double(v);
    const float norm = kept(std::max(kept(float(std::sqrt(squares)), bf16), float(s.eps)), bf16);
    for (float& v : x_) v = kept(v / norm, bf16);

    const float a = float(s.a), b = float(s.b), c = float(s.c);
    for (int step = 0; step < s.steps; ++step) {
      gram(m, n);  // A = X X^T
      round_all(gram_, bf16);
      for (std::size_t k = 0; k < gram_.size(); ++k) update_[k] = kept(c * gram_[k], bf16);
      product(update_.data(), gram_.data(), next_.data(), m, m, m);  // (c A) A, as PyTorch groups it
      for (std::size_t k = 0; k < gram_.size(); ++k) update_[k] = kept(kept(b * gram_[k], bf16) + kept(next_[k], bf16), bf16);
      product(update_.data(), x_.data(), next_.data(), m, n, m);  // B X
      for (std::size_t k = 0; k < x_.size(); ++k) next_[k] = kept(kept(a * x_[k], bf16) + kept(next_[k], bf16), bf16);
      std::swap(x_, next_);
    }

    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < cols; ++j) g[i * cols + j] = x_[transposed ? j * n + i : i * n + j];
  }

 /// The bytes its buffers hold.
  std::size_t bytes() const {
    return (x_.capacity() + next_.capacity() + gram_.capacity() + update_.capacity()) * sizeof(float);
  }

 private:
  static float kept(float v, bool bf16) { return bf16 ? float(bfloat16(v)) : v; }
  static void round_all(std::vector<float>& v, bool bf16) {
    if (bf16)
      for (float& e : v) e = float(bfloat16(e));
  }
  /// The Gram matrix X X^T of the m x n X: its upper triangle by ssyrk (half a GEMM's work), mirrored.
  void gram(std::size_t m, std::size_t n) {
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, blas_int(m), blas_int(n), 1.0f, x_.data(), blas_int(n), 0.0f,
                gram_.data(), blas_int(m));
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < i; ++j) gram_[i * m + j] = gram_[j * m + i];
  }
  /// out (rows x cols) = lhs (rows x inner) times rhs (inner x cols).
  static void product(const float* lhs, const float* rhs, float* out, std::size_t rows, std::size_t cols,
                      std::size_t inner) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(rows), blas_int(cols), blas_int(inner), 1.0f, lhs,
                blas_int(inner), rhs, blas_int(cols), 0.0f, out, blas_int(cols));
  }
  static int blas_int(std::size_t v) {
    if (v > std::size_t(1) << 30) fail("newton_schulz: a dimension of ", v, " is beyond the BLAS's 32-bit sizes");
    return int(v);
  }

  std::vector<float> x_, next_, gram_, update_;
};

}  // namespace mpopt::detail
