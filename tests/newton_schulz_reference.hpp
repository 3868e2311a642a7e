// The Newton-Schulz iteration in double, as torch.optim.Muon's documentation and code state it
// (docs/design.md 3.15), for the tests of newton_schulz.hpp and of Muon: X = G (transposed where it
// has more rows than columns) over max(||G||_F, eps), then k steps of X = a X + (b A + (c A) A) X with
// A = X X^T, in plain loops. In bf16 each value PyTorch's bf16 tensors hold is rounded to bfloat16,
// from exact values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include <mpopt/detail/math/newton_schulz.hpp>

namespace newton_schulz_reference {

using mpopt::detail::newton_schulz_precision;
using mpopt::detail::newton_schulz_settings;

using matrix = std::vector<double>;  // row-major

/// a (r x k) times b (k x c).
inline matrix times(const matrix& a, const matrix& b, std::size_t r, std::size_t k, std::size_t c) {
  matrix out(r * c, 0.0);
  for (std::size_t i = 0; i < r; ++i)
    for (std::size_t j = 0; j < c; ++j)
      for (std::size_t l = 0; l < k; ++l) out[i * c + j] += a[i * k + l] * b[l * c + j];
  return out;
}

inline matrix transpose(const matrix& a, std::size_t r, std::size_t c) {
  matrix out(a.size());
  for (std::size_t i = 0; i < r; ++i)
    for (std::size_t j = 0; j < c; ++j) out[j * r + i] = a[i * c + j];
  return out;
}

/// The iteration on g (rows x cols), in double; in bf16, each value PyTorch's bf16 tensors hold
/// rounded to bfloat16 (the input from the fp32 value PyTorch holds it in).
template <class T>
matrix reference(const std::vector<T>& g, std::size_t rows, std::size_t cols, const newton_schulz_settings& s) {
  const bool bf16 = s.precision == newton_schulz_precision::bf16;
  auto r = [bf16](double v) { return bf16 ? double(float(mpopt::bfloat16(v))) : v; };
  const bool tall = rows > cols;
  const std::size_t m = tall ? cols : rows, n = tall ? rows : cols;
  matrix x(g.begin(), g.end());
  for (double& v : x) v = r(float(v));  // the input: an fp32 tensor, as PyTorch's Muon holds it
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

/// ||got - want||_F / ||want||_F.
template <class T>
double relative_error(const std::vector<T>& got, const matrix& want) {
  double diff = 0, size = 0;
  for (std::size_t k = 0; k < want.size(); ++k) {
    diff += (double(got[k]) - want[k]) * (double(got[k]) - want[k]);
    size += want[k] * want[k];
  }
  return std::sqrt(diff / size);
}

}  // namespace newton_schulz_reference
