// eigen_tensor: training Eigen vectors and matrices in fp32, fp16 and bf16, with no cast.
//
// Two customization points meet here:
//   - mpopt::tensor_traits<T> says how to reach a tensor's elements (written below for Eigen's dense
//     Matrix, of which VectorXf is one);
//   - mpopt::numeric_traits<E> says which mpopt type an element type E has the bits of.
//     <mpopt/interop.hpp> declares Eigen::half as mpopt::half and Eigen::bfloat16 as mpopt::bfloat16,
//     so an fp16 optimizer takes a Matrix<Eigen::half, ...> as it is (and a bf16 one a
//     Matrix<Eigen::bfloat16, ...>): no reinterpret_cast, no copy. Handing an Eigen::half tensor
//     to a bf16 optimizer is a compile-time error.
// The model is a linear regression y = W x + b on a fixed random teacher, its forward and backward
// in Eigen (in float); the same loop runs with fp32, fp16 (dynamic loss scale) and bf16 parameters.
// Exits nonzero unless each run brings the loss down at least tenfold.
//
//   build/examples/eigen_tensor [--steps N]

#include <Eigen/Core>  // before <mpopt/interop.hpp>, which declares the types of headers already included

#include <mpopt/interop.hpp>
#include <mpopt/mpopt.hpp>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>

// How mpopt reaches the elements of any dense Eigen matrix or vector: data() and size(), in the
// column-major (or row-major) order they are stored in; an element-wise optimizer needs no shape.
template <class S, int Rows, int Cols, int Options, int MaxRows, int MaxCols>
struct mpopt::tensor_traits<Eigen::Matrix<S, Rows, Cols, Options, MaxRows, MaxCols>> {
  using matrix = Eigen::Matrix<S, Rows, Cols, Options, MaxRows, MaxCols>;
  using element_type = S;  // float, Eigen::half or Eigen::bfloat16: numeric_traits maps the last two
  static S* data(matrix& m) { return m.data(); }
  static std::size_t size(const matrix& m) { return std::size_t(m.size()); }
  static constexpr memory_space space = memory_space::host;
};

template <class T>
using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
template <class T>
using vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;

static_assert(mpopt::tensor_storing<vector<float>, float>);  // Eigen::VectorXf
static_assert(mpopt::tensor_storing<matrix<Eigen::half>, mpopt::half>);
static_assert(mpopt::tensor_storing<vector<Eigen::bfloat16>, mpopt::bfloat16>);
static_assert(!mpopt::tensor_storing<vector<Eigen::half>, mpopt::bfloat16>);  // bits of another format

namespace {

constexpr Eigen::Index inputs = 32, outputs = 8, batch = 64;

struct result {
  double first = 0, last = 0;
};

/// Trains W (outputs x inputs) and b, stored as T, with Adam in Precision under Scaler.
template <class Precision, class Scaler, class T>
result train(const char* label, int steps) {
  using optimizer = mpopt::optimizer<Precision, Scaler, mpopt::replicated, mpopt::adam>;
  optimizer opt({.clip_grad = 1.0});

  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  auto random = [&](Eigen::Index rows, Eigen::Index cols) {
    Eigen::MatrixXf m(rows, cols);
    for (Eigen::Index j = 0; j < cols; ++j)
      for (Eigen::Index i = 0; i < rows; ++i) m(i, j) = normal(rng);
    return m;
  };
  const Eigen::MatrixXf teacher = random(outputs, inputs) / std::sqrt(float(inputs));
  const Eigen::VectorXf teacher_bias = random(outputs, 1);

  // Parameters and gradients in T. The optimizer keeps their data pointers: they must not be
  // resized (assigning a same-sized expression, as below, keeps the storage).
  matrix<T> w = (0.1f * random(outputs, inputs)).template cast<T>(), dw(outputs, inputs);
  vector<T> b = vector<T>::Zero(outputs), db(outputs);
  opt.add_group({.lr = 2e-2, .weight_decay = 0.0}).add(w, dw, "W");
  opt.add_group({.lr = 2e-2, .weight_decay = 0.0}).add(b, db, "b");

  result r;
  for (int step = 1; step <= steps; ++step) {
    // Forward and backward in float: loss = mean over the batch of 0.5 |W x + b - y|^2.
    const Eigen::MatrixXf x = random(inputs, batch);
    const Eigen::MatrixXf y = (teacher * x).colwise() + teacher_bias;
    const Eigen::MatrixXf err = ((w.template cast<float>() * x).colwise() + b.template cast<float>()) - y;
    const double loss = 0.5 * double(err.squaredNorm()) / double(batch);
    const float scale = float(opt.loss_scale());  // backward seeded with the loss scale
    const T* before = dw.data();
    dw = (err * x.transpose() * (scale / float(batch))).template cast<T>();
    db = (err.rowwise().sum() * (scale / float(batch))).template cast<T>();
    if (dw.data() != before) {
      std::printf("%s: the gradient moved\n", label);
      std::exit(1);
    }
    const mpopt::step_status st = opt.step();
    if (step == 1) r.first = loss;
    r.last = loss;
    if (step % (steps / 5) == 0 || step == 1 || !st.applied)
      std::printf("  %-4s step %4d  loss %-9.3g  %s  grad norm %-9.3g  loss scale %g\n", label, step, loss,
                  st.applied ? "applied" : "skipped", st.grad_norm, st.scale_after);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 300;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--steps N]\n", argv[0]);
      return 2;
    }
  }
  if (steps < 5) {
    std::fprintf(stderr, "--steps must be at least 5\n");
    return 2;
  }

  std::printf("y = W x + b, W %dx%d, Adam, parameters and gradients in Eigen matrices and vectors\n", int(outputs),
              int(inputs));
  const std::pair<const char*, result> runs[] = {
      {"fp32", train<mpopt::fp32, mpopt::no_scaling, float>("fp32", steps)},
      {"fp16", train<mpopt::fp16, mpopt::dynamic_scale, Eigen::half>("fp16", steps)},
      {"bf16", train<mpopt::bf16, mpopt::no_scaling, Eigen::bfloat16>("bf16", steps)},
  };
  bool ok = true;
  for (const auto& [label, r] : runs) {
    const bool fell = r.last < r.first / 10;
    std::printf("%s: loss %.3g -> %.3g (%s)\n", label, r.first, r.last, fell ? "down tenfold or more" : "NOT down tenfold");
    ok = ok && fell;
  }
  return ok ? 0 : 1;  // a meson test: fail if training did not work
}
