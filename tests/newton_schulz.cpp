// Muon's orthogonalization (detail/math/newton_schulz.hpp) against the float64 iteration of
// newton_schulz_reference.hpp, in fp32 and in bf16 (the reference rounding where PyTorch's bf16
// tensors do). Shapes: tall, wide, square, 1 x 1, a row, a column, odd sizes; a zero matrix;
// settings other than the defaults.
#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include <mpopt/detail/math/newton_schulz.hpp>

#include "error_of.hpp"
#include "newton_schulz_reference.hpp"

namespace {

using namespace newton_schulz_reference;

std::vector<float> random_matrix(std::size_t rows, std::size_t cols, unsigned seed, double scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<float> g(rows * cols);
  for (float& v : g) v = float(normal(gen));
  return g;
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
