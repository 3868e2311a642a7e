// Muon's orthogonalization (detail/math/newton_schulz.hpp, 5 steps) against the GEMM rate the BLAS
// reaches on this machine, in the same run (protocol and fields: bench/README.md).
//
//   orthogonalize [--repeat R] [--quick]
//
// First the peak: the best of R single-precision GEMMs of two square matrices (2048, or 256 with
// --quick). Then per matrix (768 x 768, 768 x 3072, 4096 x 4096; --quick: 64 x 64, 64 x 256) and
// precision (fp32, bf16), R rounds of one orthogonalization and, timed right after it, the plain
// iteration's GEMMs alone (X X^T, (c A) A and B X per step, 4 m^2 n + 2 m^3 flops for m <= n):
// `gemm_ratio` is their time over the orthogonalization's, per round (above 1: faster than those
// GEMMs, as the Gram matrix takes half of one by ssyrk), and `peak_ratio` the GEMMs' flops at the
// peak rate over the orthogonalization's time.
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <mpopt/detail/math/newton_schulz.hpp>

#include "common.hpp"

namespace {

using mpopt::detail::newton_schulz_precision;

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

/// The best GFLOP/s of `repeat` n x n x n GEMMs.
double gemm_peak(std::size_t n, int repeat) {
  const std::vector<float> a = random_values(n * n, 1), b = random_values(n * n, 2);
  std::vector<float> c(n * n);
  std::vector<double> seconds;
  for (int r = 0; r < repeat + 1; ++r)  // the first warms the BLAS's threads and buffers
    bench::timed(seconds, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(n), int(n), 1.0f, a.data(), int(n), b.data(),
                  int(n), 0.0f, c.data(), int(n));
    });
  seconds.erase(seconds.begin());
  return 2.0 * double(n) * double(n) * double(n) / bench::summarize(seconds).min / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int repeat = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--repeat" && i + 1 < argc) repeat = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: orthogonalize [--repeat R] [--quick]\n");
      return 2;
    }
  }
  if (quick) repeat = std::min(repeat, 2);
  const std::size_t peak_size = quick ? 256 : 2048;
  const double peak = gemm_peak(peak_size, repeat);
#if defined(OPENBLAS_VERSION)
  const char* blas = openblas_get_config();
#else
  const char* blas = "a CBLAS";
#endif
  std::printf("{\"case\": \"sgemm_peak\", \"n\": %zu, \"gflops\": %.1f, \"blas\": \"%s\"}\n", peak_size, peak, blas);

  struct shape {
    std::size_t rows, cols;
  };
  const std::vector<shape> shapes =
      quick ? std::vector<shape>{{64, 64}, {64, 256}} : std::vector<shape>{{768, 768}, {768, 3072}, {4096, 4096}};
  mpopt::detail::newton_schulz ns;
  for (const shape& sh : shapes) {
    const std::size_t rows = sh.rows, cols = sh.cols, mi = std::min(rows, cols), ni = std::max(rows, cols);
    for (const auto precision : {newton_schulz_precision::fp32, newton_schulz_precision::bf16}) {
      const mpopt::detail::newton_schulz_settings s{.precision = precision};
      const double m = double(mi), n = double(ni);
      const double flops = s.steps * (4 * m * m * n + 2 * m * m * m);
      const std::vector<float> g = random_values(rows * cols, 3);
      std::vector<float> x = g;
      ns(x, rows, cols, s);  // sizes the buffers
      // The plain iteration's GEMMs on buffers of its sizes.
      const std::vector<float> xs = random_values(mi * ni, 4), sq = random_values(mi * mi, 5);
      std::vector<float> out(mi * ni);
      auto gemm = [&](const float* a, const float* b, bool b_transposed, std::size_t r, std::size_t c, std::size_t k) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, b_transposed ? CblasTrans : CblasNoTrans, int(r), int(c), int(k), 1.0f,
                    a, int(k), b, int(b_transposed ? k : c), 0.0f, out.data(), int(c));
      };
      std::vector<double> seconds, gemm_seconds;
      for (int r = 0; r < repeat; ++r) {
        x = g;
        bench::timed(seconds, [&] { ns(x, rows, cols, s); });
        bench::timed(gemm_seconds, [&] {
          for (int k = 0; k < s.steps; ++k) {
            gemm(xs.data(), xs.data(), true, mi, mi, ni);
            gemm(sq.data(), sq.data(), false, mi, mi, mi);
            gemm(sq.data(), xs.data(), false, mi, ni, mi);
          }
        });
      }
      const bench::stats t = bench::summarize(seconds), ratio = bench::paired_ratio(gemm_seconds, seconds);
      const double gflops = flops / t.median / 1e9;
      std::printf("{\"case\": \"newton_schulz\", \"rows\": %zu, \"cols\": %zu, \"precision\": \"%s\", \"steps\": %d, "
                  "\"seconds\": %.4g, \"seconds_min\": %.4g, \"seconds_max\": %.4g, \"gemm_ratio\": %.3f, "
                  "\"gemm_ratio_min\": %.3f, \"gemm_ratio_max\": %.3f, \"peak_ratio\": %.3f}\n",
                  rows, cols, precision == newton_schulz_precision::bf16 ? "bf16" : "fp32", s.steps, t.median, t.min,
                  t.max, ratio.median, ratio.min, ratio.max, gflops / peak);
      std::fflush(stdout);
    }
  }
}
