// custom_tensor: teaching mpopt about your own tensor type.
//
// mpopt does not ask for a particular tensor class. It reads parameters and gradients, and writes
// parameters, through mpopt::tensor_traits<T>, which answers four questions about a T:
//   - what are its elements?              element_type: float, mpopt::half or mpopt::bfloat16 (or a
//                                         type with their bits: examples/eigen_tensor.cpp)
//   - where do they start?                data(t): a pointer to contiguous elements
//   - how many are there?                 size(t)
//   - in which memory do they live?       space: memory_space::host for the host backend
// std::vector, std::span and mpopt::view<E> (a raw pointer and a size) come with traits. For any
// other type you write the traits yourself: below, for a matrix class of the kind older code bases
// have, and then a few steps of Adam fit a least-squares problem stored in such matrices.
//
//   build/examples/custom_tensor

#include <mpopt/mpopt.hpp>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <random>

// --- 1. The foreign type -----------------------------------------------------------------------
// A row-major matrix that owns its storage and knows its shape. Not a vector, not a span, no
// begin()/end(): mpopt cannot guess how to read it.

namespace legacy {

struct matrix {
  std::unique_ptr<float[]> storage;
  int rows = 0, cols = 0;

  matrix(int r, int c) : storage(new float[std::size_t(r) * std::size_t(c)]()), rows(r), cols(c) {}
  float& operator()(int r, int c) { return storage[std::size_t(r) * std::size_t(cols) + std::size_t(c)]; }
  float operator()(int r, int c) const { return storage[std::size_t(r) * std::size_t(cols) + std::size_t(c)]; }
};

}  // namespace legacy

// --- 2. The adapter: a dozen lines --------------------------------------------------------------
// Specialize mpopt::tensor_traits in namespace mpopt. The optimizer treats the tensor as a flat run
// of size() elements starting at data(); the shape does not matter to an element-wise optimizer
// (LAMB's trust ratio is per registered tensor, so also shape-agnostic).

namespace mpopt {

template <>
struct tensor_traits<legacy::matrix> {
  using element_type = float;  // must be the optimizer's param_type (or grad_type, for a gradient)
  static float* data(legacy::matrix& m) { return m.storage.get(); }
  static std::size_t size(const legacy::matrix& m) { return std::size_t(m.rows) * std::size_t(m.cols); }
  static constexpr memory_space space = memory_space::host;  // device memory: the host backend refuses it
};

}  // namespace mpopt

// The concept mpopt::tensor checks the traits; a mistake shows up here rather than deep inside
// the optimizer. (If your class is a template over its element type, one partial specialization
// `template <class E> struct tensor_traits<my::tensor<E>> { using element_type = E; ... };` covers
// float, mpopt::half and mpopt::bfloat16 at once.)
static_assert(mpopt::tensor<legacy::matrix>);
static_assert(mpopt::tensor_of<legacy::matrix, float>);

// --- 3. Using it --------------------------------------------------------------------------------
// Least squares: find W (4x8) and b (4x1) minimizing the mean of 0.5 * |W x + b - y|^2 over n
// samples, where y = W_true x + b_true + a little noise. Parameters and gradients are all
// legacy::matrix objects; the optimizer updates W and b in place, through the traits.

int main() {
  constexpr int n_out = 4, n_in = 8, n = 256;
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  legacy::matrix w_true(n_out, n_in), b_true(n_out, 1), x(n, n_in), y(n, n_out);
  for (int o = 0; o < n_out; ++o) {
    for (int i = 0; i < n_in; ++i) w_true(o, i) = normal(gen);
    b_true(o, 0) = normal(gen);
  }
  for (int s = 0; s < n; ++s) {
    for (int i = 0; i < n_in; ++i) x(s, i) = normal(gen);
    for (int o = 0; o < n_out; ++o) {
      float v = b_true(o, 0) + 0.01f * normal(gen);
      for (int i = 0; i < n_in; ++i) v += w_true(o, i) * x(s, i);
      y(s, o) = v;
    }
  }

  // The model's parameters and their gradients, in the legacy type. They start at zero.
  legacy::matrix w(n_out, n_in), dw(n_out, n_in), b(n_out, 1), db(n_out, 1);

  // fp32 parameters, no loss scaling, Adam. Register the legacy matrices like any other tensor:
  // the optimizer keeps their data pointers, so they must stay alive and must not reallocate.
  using optimizer = mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::adam>;
  optimizer opt({.clip_grad = 0.0});  // plain Adam: no gradient clipping
  auto& group = opt.add_group({.lr = 0.05});
  group.add(w, dw, "W");
  group.add(b, db, "b");

  // Forward and backward of the least-squares loss, in plain loops over the legacy type.
  auto loss_and_gradients = [&] {
    double loss = 0;
    for (int o = 0; o < n_out; ++o) {
      db(o, 0) = 0;
      for (int i = 0; i < n_in; ++i) dw(o, i) = 0;
    }
    for (int s = 0; s < n; ++s)
      for (int o = 0; o < n_out; ++o) {
        float r = b(o, 0) - y(s, o);  // residual of output o
        for (int i = 0; i < n_in; ++i) r += w(o, i) * x(s, i);
        loss += 0.5 * double(r) * r / n;
        db(o, 0) += r / n;
        for (int i = 0; i < n_in; ++i) dw(o, i) += r * x(s, i) / n;
      }
    return loss;
  };

  std::printf("fitting y = W x + b (W %dx%d, b %dx1) to %d samples with Adam, parameters in legacy::matrix\n",
              n_out, n_in, n_out, n);
  const double initial = loss_and_gradients();
  double loss = initial;
  for (int step = 1; step <= 300; ++step) {
    // The backward above wrote the gradients (times opt.loss_scale(), which is 1 without scaling).
    const mpopt::step_status st = opt.step();
    if (!st.applied) {
      std::printf("step %d was not applied: %s\n", step, std::string(st.reason()).c_str());
      return 1;
    }
    loss = loss_and_gradients();
    if (step % 30 == 0) std::printf("step %3d  loss %.6f  grad-norm %.5f\n", step, loss, st.grad_norm);
    if (step == 150) group.set_lr(0.01);  // a smaller step to settle into the minimum
  }

  float max_error = 0;
  for (int o = 0; o < n_out; ++o) {
    max_error = std::fmax(max_error, std::fabs(b(o, 0) - b_true(o, 0)));
    for (int i = 0; i < n_in; ++i) max_error = std::fmax(max_error, std::fabs(w(o, i) - w_true(o, i)));
  }
  std::printf("loss %.6f -> %.6f; largest error of a fitted coefficient: %.4f\n", initial, loss, max_error);
  return loss < 0.01 * initial ? 0 : 1;  // a meson test: fail if the fit did not work
}
