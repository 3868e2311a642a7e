// Muon's orthogonalization (detail/math/newton_schulz.hpp) against a float64 reference written from
// torch.optim.Muon's documented iteration: X = G (transposed where it has more rows than columns)
// over max(||G||_F, eps), then k steps of X = a X + (b A + (c A) A) X with A = X X^T, in plain loops.
// In bf16 the reference rounds to bfloat16 where PyTorch's bf16 tensors do (the input, the normalized
// X, each product, each scaled term and sum), from exact values. Shapes: tall, wide, square, 1 x 1,
// a row, a column, odd sizes; a zero matrix; settings other than the defaults.
#include <cmath>
#include <cstddef>
#include <random>
#include <span>
#include <vector>

#include <doctest/doctest.h>

#include <mpopt/detail/math/newton_schulz.hpp>

#include "error_of.hpp"

namespace {

using mpopt::detail::newton_schulz_precision;
using mpopt::detail::newton_schulz_settings;

using matrix = std::vector<double>;  // row-major

/// a (r x k) times b (k x c).
matrix times(const matrix& a, const matrix& b, std::size_t r, std::size_t k, std::size_t c) {
  matrix out(r * c, 0.0);
  for (std::size_t i = 0; i < r; ++i)
    for (std::size_t j = 0; j < c; ++j)
      for (std::size_t l = 0; l < k; ++l) out[i * c + j] += a[i * k + l] * b[l * c + j];
  return out;
}

matrix transpose(const matrix& a, std::size_t r, std::size_t c) {
  matrix out(a.size());
  for (std::size_t i = 0; i < r; ++i)
    for (std::size_t j = 0; j < c; ++j) out[j * r + i] = a[i * c + j];
  return out;
}

/// The iteration in double; `bf16`: each value PyTorch's bf16 tensors hold, rounded to bfloat16.
matrix reference(const std::vector<float>& g, std::size_t rows, std::size_t cols, const newton_schulz_settings& s) {
  const bool bf16 = s.precision == newton_schulz_precision::bf16;
  auto r = [bf16](double v) { return bf16 ? double(float(mpopt::bfloat16(v))) : v; };
  const bool tall = rows > cols;
  const std::size_t m = tall ? cols : rows, n = tall ? rows : cols;
  matrix x(g.begin(), g.end());
  for (double& v : x) v = r(v);
  if (tall) x = transpose(x, rows, cols);
  double squares = 0;
  for (double v : x) squares += v * v;
  const double norm = r(std::max(r(std::sqrt(squares)), s.eps));
  for (double& v : x) v = r(v / norm);
  for (int step = 0; step < s.steps; ++step) {
    matrix a = times(x, transpose(x, m, n), m, n, m);
    for (double& v : a) v = r(v);
    matrix ca = a;
    for (double& v : ca) v = r(s.c * v);
    const matrix caa = times(ca, a, m, m, m);
    matrix b(a.size());
    for (std::size_t k = 0; k < b.size(); ++k) b[k] = r(r(s.b * a[k]) + r(caa[k]));
    const matrix bx = times(b, x, m, m, n);
    for (std::size_t k = 0; k < x.size(); ++k) x[k] = r(r(s.a * x[k]) + r(bx[k]));
  }
  return tall ? transpose(x, m, n) : x;
}

std::vector<float> random_matrix(std::size_t rows, std::size_t cols, unsigned seed, double scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<float> g(rows * cols);
  for (float& v : g) v = float(normal(gen));
  return g;
}

/// ||out - want||_F / ||want||_F.
double relative_error(std::span<const float> out, const matrix& want) {
  double diff = 0, size = 0;
  for (std::size_t k = 0; k < want.size(); ++k) {
    diff += (out[k] - want[k]) * (out[k] - want[k]);
    size += want[k] * want[k];
  }
  return std::sqrt(diff / size);
}

struct shape {
  std::size_t rows, cols;
};
const shape shapes[] = {{1, 1}, {1, 9}, {9, 1}, {3, 5}, {5, 3}, {16, 16}, {33, 70}, {70, 33}, {64, 64}};

}  // namespace

TEST_CASE("Newton-Schulz in fp32 is the float64 iteration to float rounding, tall, wide and square") {
  mpopt::detail::newton_schulz ns;
  const newton_schulz_settings s;
  for (const shape& sh : shapes) {
    const std::size_t rows = sh.rows, cols = sh.cols;
    for (double scale : {1e-3, 1.0, 30.0}) {
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(scale);
      std::vector<float> g = random_matrix(rows, cols, unsigned(rows * 100 + cols), scale);
      const matrix want = reference(g, rows, cols, s);
      ns(g, rows, cols, s);
      CHECK(relative_error(g, want) < 1e-5);
    }
  }
}

TEST_CASE("Newton-Schulz in bf16 rounds where PyTorch's bf16 tensors round") {
  mpopt::detail::newton_schulz ns;
  newton_schulz_settings s;
  s.precision = newton_schulz_precision::bf16;
  newton_schulz_settings fp32 = s;
  fp32.precision = newton_schulz_precision::fp32;
  for (const shape& sh : shapes) {
    const std::size_t rows = sh.rows, cols = sh.cols;
    CAPTURE(rows);
    CAPTURE(cols);
    std::vector<float> g = random_matrix(rows, cols, unsigned(rows * 100 + cols), 0.02);
    const matrix want = reference(g, rows, cols, s);
    const matrix in_fp32 = reference(g, rows, cols, fp32);
    ns(g, rows, cols, s);
    for (float v : g) CHECK(v == float(mpopt::bfloat16(v)));  // every value a bf16 one
    // A flipped rounding here and there (the product summed in float, the reference's exact), far
    // below the difference bf16 makes.
    const double error = relative_error(g, want);
    CHECK(error < 2e-3);
    if (rows * cols > 1) CHECK(relative_error(g, in_fp32) > 5 * error);
  }
}

TEST_CASE("Newton-Schulz with other coefficients, steps and eps; a zero matrix stays zero; sizes are checked") {
  mpopt::detail::newton_schulz ns;
  const newton_schulz_settings s{.a = 2.0, .b = -1.5, .c = 0.5, .steps = 9, .eps = 1e-3};
  std::vector<float> g = random_matrix(12, 20, 7, 1e-4);  // norm below eps: divided by eps
  const matrix want = reference(g, 12, 20, s);
  ns(g, 12, 20, s);
  CHECK(relative_error(g, want) < 1e-5);

  std::vector<float> zero(6 * 4, 0.0f);
  ns(zero, 6, 4, {});
  for (float v : zero) CHECK(v == 0.0f);
  std::vector<float> none;
  ns(none, 0, 5, {});
  std::vector<float> wrong(10);
  CHECK(error_of([&] { ns(wrong, 3, 4, {}); }) == "mpopt: newton_schulz: 10 values for a 3 x 4 matrix");
}
