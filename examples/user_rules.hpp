// Four update rules written as a user would, outside mpopt's headers (docs/extending.md, "Writing your own
// rule"): Lion, SGD with momentum (optionally Nesterov), LARS and Adagrad. Each declares its options (each
// field once, with its check), its fp32 state, the scalars of a step and its element stages;
// mpopt::optimizer runs them on every precision, partition and backend. examples/custom_rule.cpp trains with them; the tests check them
// against float64 references (tests/custom_rules.cpp, tests/mpi_custom_rules.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <mpopt/error.hpp>
#include <mpopt/fields.hpp>
#include <mpopt/rule.hpp>

namespace user_rules {

using mpopt::field;
namespace checks = mpopt::checks;

/// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): the sign of an
/// interpolated momentum, with decoupled weight decay. One state buffer.
struct lion {
  struct options {
    double lr = 1e-4, beta1 = 0.9, beta2 = 0.99, weight_decay = 0.0;
    static constexpr auto fields = mpopt::fields(
        field{"lr", &options::lr, checks::rate}, field{"beta1", &options::beta1, checks::closed(0, 1)},
        field{"beta2", &options::beta2, checks::closed(0, 1)}, field{"weight_decay", &options::weight_decay, checks::rate});
  };
  static constexpr std::string_view name = "lion";
  static constexpr std::array<std::string_view, 1> state = {"exp_avg"};
  struct scalars {
    float lr, beta1, one_minus_beta1, beta2, one_minus_beta2, weight_decay;
  };
  static scalars prepare(const options& o, std::uint64_t) {
    return {float(o.lr), float(o.beta1), float(1 - o.beta1), float(o.beta2), float(1 - o.beta2), float(o.weight_decay)};
  }
  template <class E>
  MPOPT_HOST_DEVICE static void update(const scalars& k, E& e) {
    using V = typename E::vec;
    using namespace mpopt::math;
    const V g = e.grad(), w = e.param(), m = e.state(0);
    const V c = fma(V(k.beta1), m, V(k.one_minus_beta1) * g);
    e.set_param(fma(V(-k.lr), fma(V(k.weight_decay), w, sign(c)), w));
    e.set_state(0, fma(V(k.beta2), m, V(k.one_minus_beta2) * g));
  }
};

/// SGD with momentum, as torch.optim.SGD: L2 decay into the gradient, the buffer starts as the first
/// gradient, dampening after that; Nesterov looks ahead along the buffer. One state buffer.
struct sgd {
  struct options {
    double lr = 1e-2, momentum = 0.9, dampening = 0.0, weight_decay = 0.0;
    bool nesterov = false;
    static constexpr auto fields = mpopt::fields(
        field{"lr", &options::lr, checks::rate}, field{"momentum", &options::momentum, checks::closed(0, 1)},
        field{"dampening", &options::dampening, checks::closed(0, 1)},
        field{"weight_decay", &options::weight_decay, checks::rate}, field{"nesterov", &options::nesterov});
    /// What involves several fields.
    void validate(std::string_view group) const {
      if (nesterov && (momentum == 0 || dampening != 0))
        throw mpopt::error(std::string(group) + ".nesterov needs momentum > 0 and dampening 0");
    }
  };
  static constexpr std::string_view name = "sgd";
  static constexpr std::array<std::string_view, 1> state = {"momentum_buffer"};
  struct scalars {
    float lr, keep, take, weight_decay;  // buffer = keep * buffer + take * g
    bool nesterov;
    float momentum;
  };
  static scalars prepare(const options& o, std::uint64_t step) {
    const bool first = step == 1;  // the buffer starts as the gradient itself
    return {float(o.lr), first ? 0.0f : float(o.momentum), first ? 1.0f : float(1.0 - o.dampening),
            float(o.weight_decay), o.nesterov, float(o.momentum)};
  }
  template <class E>
  MPOPT_HOST_DEVICE static void update(const scalars& k, E& e) {
    using V = typename E::vec;
    using namespace mpopt::math;
    const V w = e.param();
    const V g = fma(V(k.weight_decay), w, e.grad());
    const V b = fma(V(k.keep), e.state(0), V(k.take) * g);
    e.set_state(0, b);
    e.set_param(fma(V(-k.lr), k.nesterov ? fma(V(k.momentum), b, g) : b, w));
  }
};

/// LARS (You et al. 2017, Algorithm 1): per tensor, a local learning rate
/// eta * ||w|| / (||g|| + weight_decay * ||w||) (1 if either norm is 0), then momentum on the
/// decayed gradient. The norms are a per-tensor reduction between two stages. One state buffer.
struct lars {
  struct options {
    double lr = 0.1, momentum = 0.9, weight_decay = 5e-4, eta = 1e-3;
    static constexpr auto fields = mpopt::fields(
        field{"lr", &options::lr, checks::rate}, field{"momentum", &options::momentum, checks::closed(0, 1)},
        field{"weight_decay", &options::weight_decay, checks::rate}, field{"eta", &options::eta, checks::rate});
  };
  static constexpr std::string_view name = "lars";
  static constexpr std::array<std::string_view, 1> state = {"momentum_buffer"};
  static constexpr std::string_view tensor_state = "local_lr";
  struct scalars {
    double lr, eta, weight_decay;
    float momentum, decay;
  };
  static scalars prepare(const options& o, std::uint64_t) {
    return {o.lr, o.eta, o.weight_decay, float(o.momentum), float(o.weight_decay)};
  }
  /// Stage 1 reads the weights and gradients only: their norms.
  template <class E>
  MPOPT_HOST_DEVICE static void direction(const scalars&, E& e) {
    e.norm(0, e.param());
    e.norm(1, e.grad());
  }
  MPOPT_HOST_DEVICE static float tensor_scale(const scalars& k, double w_norm, double g_norm, double& local_lr) {
    local_lr = w_norm > 0 && g_norm > 0 ? k.eta * w_norm / (g_norm + k.weight_decay * w_norm) : 1.0;
    return float(k.lr * local_lr);
  }
  template <class E>
  MPOPT_HOST_DEVICE static void update(const scalars& k, E& e) {
    using V = typename E::vec;
    using namespace mpopt::math;
    const V w = e.param();
    const V v = fma(V(k.momentum), e.state(0), V(e.tensor_scale()) * fma(V(k.decay), w, e.grad()));
    e.set_state(0, v);
    e.set_param(w - v);
  }
};

/// Adagrad, as torch.optim.Adagrad: L2 decay into the gradient, a running sum of squared gradients
/// that starts at initial_accumulator_value (per group: the rule declares its state's start), and
/// a learning rate lr / (1 + (t - 1) lr_decay). One state buffer.
struct adagrad {
  struct options {
    double lr = 1e-2, lr_decay = 0.0, weight_decay = 0.0, initial_accumulator_value = 0.0, eps = 1e-10;
    static constexpr auto fields = mpopt::fields(
        field{"lr", &options::lr, checks::rate}, field{"lr_decay", &options::lr_decay, checks::rate},
        field{"weight_decay", &options::weight_decay, checks::rate},
        field{"initial_accumulator_value", &options::initial_accumulator_value, checks::rate},
        field{"eps", &options::eps, checks::above(0)});
  };
  static constexpr std::string_view name = "adagrad";
  static constexpr std::array<std::string_view, 1> state = {"sum"};
  static float initial_state(const options& o, std::size_t) { return float(o.initial_accumulator_value); }
  struct scalars {
    float lr, weight_decay, eps;
  };
  static scalars prepare(const options& o, std::uint64_t step) {
    return {float(o.lr / (1 + double(step - 1) * o.lr_decay)), float(o.weight_decay), float(o.eps)};
  }
  template <class E>
  MPOPT_HOST_DEVICE static void update(const scalars& k, E& e) {
    using V = typename E::vec;
    using namespace mpopt::math;
    const V w = e.param();
    const V g = fma(V(k.weight_decay), w, e.grad());
    const V sum = fma(g, g, e.state(0));
    e.set_state(0, sum);
    e.set_param(w - V(k.lr) * g / (sqrt(sum) + V(k.eps)));
  }
};

}  // namespace user_rules
