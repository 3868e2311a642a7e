// mpopt — Muon's orthogonalization where the CUDA backend keeps its buffers. On a GPU: the iteration
// of newton_schulz.hpp, the same values rounded in the same places, with its norm and products on
// cuBLAS (cublasSnrm2, cublasSgemm; in bf16 over bf16 values, so fp32 accumulation of exact
// products, as there) and its element steps as Thrust kernels, all on the backend's stream, which
// the host does not wait for. In the Thrust-OMP build, whose device memory is the host's,
// newton_schulz itself.
#pragma once

#include <cstddef>
#include <span>

#include "../backend/device_buffer.hpp"  // MPOPT_DEVICE_IS_GPU
#include "newton_schulz_settings.hpp"

#if MPOPT_DEVICE_IS_GPU
#include <algorithm>
#include <memory>
#include <type_traits>
#include <utility>

#include <cublas_v2.h>
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include "../../numeric.hpp"
#include "../options/validate.hpp"
#else
#include "newton_schulz.hpp"
#endif

namespace mpopt::detail {

#if MPOPT_DEVICE_IS_GPU

inline void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: ", what, " failed: ", cublasGetStatusString(s));
}

/// The iteration's element steps: one thread an element.
namespace newton_schulz_kernels {
MPOPT_HOST_DEVICE float kept(float v, bool bf16) { return bf16 ? float(bfloat16(v)) : v; }

/// Between G (rows x cols) and X (m x n, G's transpose where rows > cols): X = kept(G), or back.
struct copy_x {
  float* g;
  float* x;
  std::size_t cols, n;
  bool transposed, bf16, to_x;
  MPOPT_HOST_DEVICE void operator()(std::size_t k) const {
    const std::size_t i = k / cols, j = k % cols, at = transposed ? j * n + i : i * n + j;
    if (to_x)
      x[at] = kept(g[k], bf16);
    else
      g[k] = x[at];
  }
};
/// X = X / max(||X||, eps), the norm read where cuBLAS left it.
struct normalize {
  float* x;
  const float* norm;
  float eps;
  bool bf16;
  MPOPT_HOST_DEVICE void operator()(std::size_t k) const {
    const float n = kept(*norm, bf16);
    x[k] = kept(x[k] / kept(n < eps ? eps : n, bf16), bf16);  // (std::max's order: a NaN stays)
  }
};
/// A = kept(A), then c A.
struct gram_scaled {
  float* gram;
  float* scaled;
  float c;
  bool bf16;
  MPOPT_HOST_DEVICE void operator()(std::size_t k) const {
    gram[k] = kept(gram[k], bf16);
    scaled[k] = kept(c * gram[k], bf16);
  }
};
/// out = s x + y, each term and the sum kept.
struct axpy {
  const float* x;
  const float* y;
  float* out;
  float s;
  bool bf16;
  MPOPT_HOST_DEVICE void operator()(std::size_t k) const {
    out[k] = kept(kept(s * x[k], bf16) + kept(y[k], bf16), bf16);
  }
};
}  // namespace newton_schulz_kernels

/// The buffers and cuBLAS handle of one orthogonalization, kept between calls: nothing is allocated
/// once they have held the largest matrix.
class device_newton_schulz {
 public:
  /// Orthogonalizes the row-major rows x cols matrix g (device memory) in place, on `on`'s stream.
  template <class Backend>
  void operator()(std::span<float> g, std::size_t rows, std::size_t cols, const newton_schulz_settings& s,
                  const Backend& on) {
    if (g.size() != rows * cols) fail("newton_schulz: ", g.size(), " values for a ", rows, " x ", cols, " matrix");
    if (g.empty()) return;
    namespace k = newton_schulz_kernels;
    const bool transposed = rows > cols, bf16 = s.precision == newton_schulz_precision::bf16;
    const std::size_t m = std::min(rows, cols), n = std::max(rows, cols);
    reserve(x_, m * n);
    reserve(next_, m * n);
    reserve(gram_, m * m);
    reserve(update_, m * m);
    reserve(norm_, 1);
    if (!handle_) {
      cublasHandle_t h = nullptr;
      cublas_check(cublasCreate(&h), "cublasCreate");
      handle_.reset(h);
      cublas_check(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");  // fp32, no TF32
    }
    cublas_check(cublasSetStream(handle_.get(), on.stream()), "cublasSetStream");
    const auto policy = thrust::cuda::par_nosync.on(on.stream());
    const auto each = [&](std::size_t count, const auto& f) {
      thrust::for_each_n(policy, thrust::counting_iterator<std::size_t>(0), count, f);
    };
    float* x = x_.data();
    float* next = next_.data();

    each(m * n, k::copy_x{g.data(), x, cols, n, transposed, bf16, true});
    // The norm stays in device memory (the host waits for nothing): cuBLAS's, in fp32, where the
    // host's iteration sums the squares in double.
    cublas_check(cublasSetPointerMode(handle_.get(), CUBLAS_POINTER_MODE_DEVICE), "cublasSetPointerMode");
    cublas_check(cublasSnrm2(handle_.get(), blas_int(m * n), x, 1, norm_.data()), "cublasSnrm2");
    cublas_check(cublasSetPointerMode(handle_.get(), CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
    each(m * n, k::normalize{x, norm_.data(), float(s.eps), bf16});

    const float a = float(s.a), b = float(s.b), c = float(s.c);
    for (int step = 0; step < s.steps; ++step) {
      // A = X X^T: in cuBLAS's column-major terms, X is an n x m matrix and A = X^T X.
      gemm(CUBLAS_OP_T, m, m, n, x, n, x, n, gram_.data(), m);
      each(m * m, k::gram_scaled{gram_.data(), update_.data(), c, bf16});
      product(update_.data(), gram_.data(), next, m, m, m);  // (c A) A, as PyTorch groups it
      each(m * m, k::axpy{gram_.data(), next, update_.data(), b, bf16});
      product(update_.data(), x, next, m, n, m);  // B X
      each(m * n, k::axpy{x, next, next, a, bf16});
      std::swap(x, next);
    }
    each(m * n, k::copy_x{g.data(), x, cols, n, transposed, bf16, false});
  }

  /// The bytes its buffers hold.
  std::size_t bytes() const {
    return (x_.size() + next_.size() + gram_.size() + update_.size() + norm_.size()) * sizeof(float);
  }

 private:
  struct handle_destroyer {
    void operator()(cublasHandle_t h) const { cublasDestroy(h); }
  };

  static void reserve(device_buffer<float>& b, std::size_t n) {
    if (b.size() < n) b = device_buffer<float>(n);
  }
  /// cuBLAS's C = op(A) B, in its column-major terms (C is m x n).
  void gemm(cublasOperation_t op, std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda,
            const float* b, std::size_t ldb, float* c, std::size_t ldc) {
    const float one = 1.0f, zero = 0.0f;
    cublas_check(cublasSgemm(handle_.get(), op, CUBLAS_OP_N, blas_int(m), blas_int(n), blas_int(k), &one, a,
                             blas_int(lda), b, blas_int(ldb), &zero, c, blas_int(ldc)),
                 "cublasSgemm");
  }
  /// Row-major out (rows x cols) = lhs (rows x inner) times rhs (inner x cols): column-major, out^T =
  /// rhs^T lhs^T.
  void product(const float* lhs, const float* rhs, float* out, std::size_t rows, std::size_t cols, std::size_t inner) {
    gemm(CUBLAS_OP_N, cols, rows, inner, rhs, cols, lhs, inner, out, cols);
  }
  static int blas_int(std::size_t v) {
    if (v > std::size_t(1) << 30) fail("newton_schulz: a dimension of ", v, " is beyond cuBLAS's 32-bit sizes");
    return int(v);
  }

  device_buffer<float> x_, next_, gram_, update_, norm_;
  std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, handle_destroyer> handle_;
};

#else

/// The Thrust-OMP build's device memory is the host's: the host's iteration, on its BLAS.
class device_newton_schulz {
 public:
  template <class Backend>
  void operator()(std::span<float> g, std::size_t rows, std::size_t cols, const newton_schulz_settings& s,
                  const Backend&) {
    host_(g, rows, cols, s);
  }
  std::size_t bytes() const { return host_.bytes(); }

 private:
  newton_schulz host_;
};

#endif

}  // namespace mpopt::detail
