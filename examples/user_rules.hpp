// Three update rules written as a user would, outside mpopt's headers (README, "Writing your own
// rule"): Lion, SGD with momentum (optionally Nesterov) and LARS. Each declares its options, its
// fp32 state, the scalars of a step and its element stages; mpopt::optimizer runs them on every
// precision, partition and backend. examples/custom_rule.cpp trains with them; the tests check them
// against float64 references (tests/custom_rules.cpp, tests/mpi_custom_rules.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include <mpopt/error.hpp>
#include <mpopt/rule.hpp>

namespace user_rules {

/// Bad options throw mpopt::error, like the built-in rules' (NaN fails too).
inline void require_in(const std::string& name, double x, double low, double high) {
  if (!(x >= low && x <= high))
    throw mpopt::error(name + " must be in [" + std::to_string(low) + ", " + std::to_string(high) + "], got " +
                       std::to_string(x));
}

/// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): the sign of an
/// interpolated momentum, with decoupled weight decay. One state buffer.
struct lion {
  struct options {
    double lr = 1e-4, beta1 = 0.9, beta2 = 0.99, weight_decay = 0.0;
    void validate(std::string_view group) const {
      const std::string g(group);
      require_in(g + ".lr", lr, 0, 1e30);
      require_in(g + ".beta1", beta1, 0, 1);
      require_in(g + ".beta2", beta2, 0, 1);
      require_in(g + ".weight_decay", weight_decay, 0, 1e30);
    }
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
  static nlohmann::json to_json(const options& o) {
    return {{"lr", o.lr}, {"beta1", o.beta1}, {"beta2", o.beta2}, {"weight_decay", o.weight_decay}};
  }
  static options from_json(const nlohmann::json& j) {
    return {j.at("lr").get<double>(), j.at("beta1").get<double>(), j.at("beta2").get<double>(),
            j.at("weight_decay").get<double>()};
  }
};

/// SGD with momentum, as torch.optim.SGD: L2 decay into the gradient, the buffer starts as the first
/// gradient, dampening after that; Nesterov looks ahead along the buffer. One state buffer.
struct sgd {
  struct options {
    double lr = 1e-2, momentum = 0.9, dampening = 0.0, weight_decay = 0.0;
    bool nesterov = false;
    void validate(std::string_view group) const {
      const std::string g(group);
      require_in(g + ".lr", lr, 0, 1e30);
      require_in(g + ".momentum", momentum, 0, 1);
      require_in(g + ".dampening", dampening, 0, 1);
      require_in(g + ".weight_decay", weight_decay, 0, 1e30);
      if (nesterov && (momentum == 0 || dampening != 0))
        throw mpopt::error(g + ".nesterov needs momentum > 0 and dampening 0");
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
  static nlohmann::json to_json(const options& o) {
    return {{"lr", o.lr}, {"momentum", o.momentum}, {"dampening", o.dampening},
            {"weight_decay", o.weight_decay}, {"nesterov", o.nesterov}};
  }
  static options from_json(const nlohmann::json& j) {
    return {j.at("lr").get<double>(), j.at("momentum").get<double>(), j.at("dampening").get<double>(),
            j.at("weight_decay").get<double>(), j.at("nesterov").get<bool>()};
  }
};

/// LARS (You et al. 2017, Algorithm 1): per tensor, a local learning rate
/// eta * ||w|| / (||g|| + weight_decay * ||w||) (1 if either norm is 0), then momentum on the
/// decayed gradient. The norms are a per-tensor reduction between two stages. One state buffer.
struct lars {
  struct options {
    double lr = 0.1, momentum = 0.9, weight_decay = 5e-4, eta = 1e-3;
    void validate(std::string_view group) const {
      const std::string g(group);
      require_in(g + ".lr", lr, 0, 1e30);
      require_in(g + ".momentum", momentum, 0, 1);
      require_in(g + ".weight_decay", weight_decay, 0, 1e30);
      require_in(g + ".eta", eta, 0, 1e30);
    }
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
  static nlohmann::json to_json(const options& o) {
    return {{"lr", o.lr}, {"momentum", o.momentum}, {"weight_decay", o.weight_decay}, {"eta", o.eta}};
  }
  static options from_json(const nlohmann::json& j) {
    return {j.at("lr").get<double>(), j.at("momentum").get<double>(), j.at("weight_decay").get<double>(),
            j.at("eta").get<double>()};
  }
};

}  // namespace user_rules
