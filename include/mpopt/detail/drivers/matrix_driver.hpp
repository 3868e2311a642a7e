// mpopt — the driver of a matrix rule (rule.hpp, matrix_rule): the rule's `direction` over every
// element, writing each matrix's input; then, per matrix this rank holds whole, the rule's matrix
// stage on it; then `update`, with each matrix's factor. The matrices are the registered shapes,
// flattened to rows x cols (detail::matrix_shape): the first dimension by the rest.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../error.hpp"
#include "../../memory_report.hpp"
#include "../../rule.hpp"
#include "../../tensor.hpp"
#include "../math/newton_schulz.hpp"
#include "../math/step_decision.hpp"
#include "../passes/passes.hpp"
#include "../step/tensor_registry.hpp"
#include "staged_driver.hpp"

namespace mpopt::detail {

/// What runs a matrix stage where a backend keeps its buffers: the host's BLAS for the host's memory;
/// for the device's, <mpopt/cuda_matrix.hpp> names cuBLAS.
template <memory_space Space>
struct matrix_engine {
  using type = void;
};
template <>
struct matrix_engine<memory_space::host> {
  using type = newton_schulz;
};

/// A matrix as a backend hands it to a matrix stage: row-major values where the backend keeps
/// them, and the engine that works on them there.
template <class Engine, class Backend>
class stage_matrix {
 public:
  stage_matrix(std::span<float> values, std::size_t rows, std::size_t cols, Engine& engine, const Backend& backend)
      : values_(values), rows_(rows), cols_(cols), engine_(&engine), backend_(&backend) {}
  std::size_t rows() const { return rows_; }
  std::size_t cols() const { return cols_; }
  void orthogonalize(const newton_schulz_settings& s) {
    if constexpr (Backend::space == memory_space::host) (*engine_)(values_, rows_, cols_, s);
    else (*engine_)(values_, rows_, cols_, s, *backend_);
  }

 private:
  std::span<float> values_;
  std::size_t rows_, cols_;
  Engine* engine_;
  const Backend* backend_;
};

template <class Rule, class Precision, class Backend, class Communicator>
class matrix_driver : public staged_driver<Rule, Precision, Backend, Communicator> {
  using engine = typename matrix_engine<Backend::space>::type;
  static_assert(!std::is_void_v<engine>,
                "a matrix rule (Muon) on the CUDA backend needs <mpopt/cuda_matrix.hpp>: its matrix stage on cuBLAS");
  template <class T>
  using buffer = typename Backend::template buffer<T>;
  template <class T>
  using shared = typename Backend::template shared_vector<T>;

 public:
  /// Each tensor is a matrix: a shape of two or more dimensions.
  template <class Groups>
  static void check_groups(const Groups& groups) {
    for (const auto& g : groups)
      for (std::size_t i = 0; i < g->size(); ++i) {
        const auto& shape = g->shape(i);
        if (shape.dims().size() < 2)
          fail(Rule::name, " works on matrices: tensor '", g->name(i), "' has ",
               shape.empty() ? std::string("no shape") : "the shape " + shape_text(shape),
               "; register each tensor with its shape of two or more dimensions (add(param, grad, name, {rows, "
               "cols})), and give vectors (biases, norms) and embeddings to another rule's group");
      }
  }

  /// The matrices this rank holds whole, and the buffer their stage works in (indexed as the state).
  template <class Context>
  void allocate(Context& c) {
    const std::size_t tensors = c.tensors.tensor_count;
    std::vector<std::size_t> owned(tensors, 0), state(tensors, 0);
    std::vector<bool> contiguous(tensors, true);
    std::size_t elements = 0;
    const work_list& work = *c.tensors.work;
    for (std::size_t k = 0; k < work.size(); ++k) {
      const chunk& ch = work[k];
      if (owned[ch.tensor] == 0) state[ch.tensor] = ch.state - ch.begin;
      contiguous[ch.tensor] = contiguous[ch.tensor] && ch.state - ch.begin == state[ch.tensor];
      owned[ch.tensor] += ch.size;
      elements = std::max(elements, ch.state + ch.size);
    }
    matrices_.clear();
    std::size_t t = 0;
    for (const auto& g : c.groups)
      for (std::size_t i = 0; i < g->size(); ++i, ++t) {
        const std::size_t size = c.tensors.tensors[t].size;
        if (owned[t] == 0) continue;  // another rank's
        if (owned[t] != size || !contiguous[t])
          fail(Rule::name, " works on whole matrices, and the layout splits tensor '", g->name(i), "' (",
               shape_text(g->shape(i)), ") across ranks; every layout keeps a matrix rule's tensors whole (lay_out)");
        const auto [rows, cols] = matrix_shape(g->shape(i));
        matrices_.push_back({std::uint32_t(t), std::uint32_t(c.tensors.tensors[t].group), state[t], rows, cols});
      }
    matrix_ = buffer<float>::zeroed((elements + 15) / 16 * 16);
    scale_.assign(tensors, 0.0f);
  }

  /// The direction over every element: each matrix's input.
  template <class Context>
  void begin(Context& c) {
    c.backend.template rule_stage<Rule, matrix_input_stage>(with_matrix(c), c.scalars, nullptr, true);
  }

  /// Each matrix's stage, then the update with its factor; nothing for a skipped step.
  template <class Context>
  void finish(Context& c) {
    step_decision decided;
    c.backend.synchronize();
    c.backend.to_host(&decided, c.gradients.decision, 1);
    if (decided.skip) return;
    for (const placed_matrix& m : matrices_) {
      stage_matrix view(std::span<float>(matrix_.data() + m.state, m.rows * m.cols), m.rows, m.cols, engine_, c.backend);
      scale_[m.tensor] = Rule::matrix(c.scalars[m.group], view);
    }
    c.backend.template rule_stage<Rule, update_stage>(with_matrix(c), c.scalars, scale_.data());
  }

  /// The matrix buffer and the iteration's; returns the bookkeeping bytes.
  std::size_t list_memory(memory_report& r) const {
    r.buffers.push_back({"matrix stage", "each matrix's input to its matrix stage and result (fp32)",
                         matrix_.size() * sizeof(float), true});
    r.buffers.push_back({"orthogonalization", "the Newton-Schulz iteration's buffers, for the largest matrix (fp32)",
                         engine_.bytes(), true});
    return matrices_.capacity() * sizeof(placed_matrix) + scale_.capacity() * sizeof(float);
  }

 private:
  struct placed_matrix {
    std::uint32_t tensor, group;
    std::size_t state;  ///< where its first element is in the state (and in matrix_)
    std::size_t rows, cols;
  };

  template <class Context>
  step_data<Precision> with_matrix(const Context& c) {
    step_data<Precision> d = c.gradients;
    d.matrix = matrix_.data();
    return d;
  }

  std::vector<placed_matrix> matrices_;
  buffer<float> matrix_;
  shared<float> scale_;  ///< per tensor: its matrix stage's factor, which the update reads
  engine engine_;
};

}  // namespace mpopt::detail
