// Update rules of your own (user_rules.hpp: Lion, SGD with Nesterov momentum, LARS, Adagrad) trained
// like the built-in ones: fp16 weights with fp32 masters and dynamic loss scaling, gradient clipping, two
// parameter groups and a checkpoint. The model is a linear regression y = W x + b on a fixed
// random teacher; exits nonzero unless every rule brings the loss down at least tenfold.
//   build/examples/custom_rule [--steps N]
#include <mpopt/mpopt.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "user_rules.hpp"

namespace {

constexpr std::size_t inputs = 64, outputs = 16, batch = 32;

/// Trains W (outputs x inputs) and b with Rule for `steps` steps; returns the first and last loss.
template <class Rule>
std::pair<double, double> train(const typename Rule::options& weights, const typename Rule::options& bias, int steps) {
  using optimizer = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, Rule>;
  optimizer opt{{.clip_grad = 1.0}, {.init_scale = 1024}};
  std::vector<mpopt::half> w(inputs * outputs, mpopt::half(0.0f)), gw(w.size()), b(outputs, mpopt::half(0.0f)), gb(outputs);
  opt.add_group(weights).add(w, gw, "W");
  opt.add_group(bias).add(b, gb, "b");

  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> teacher(w.size()), x(inputs), err(outputs);
  for (float& t : teacher) t = normal(rng) / std::sqrt(float(inputs));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = mpopt::half(0.1f * normal(rng));  // not at zero: LARS scales by ||W||
  double first = 0, last = 0;
  for (int step = 1; step <= steps; ++step) {
    std::vector<float> dw(w.size(), 0.0f), db(outputs, 0.0f);
    double loss = 0;
    for (std::size_t n = 0; n < batch; ++n) {  // loss = mean over the batch of 0.5 |W x + b - T x - 0.5|^2
      for (float& xi : x) xi = normal(rng);
      for (std::size_t o = 0; o < outputs; ++o) {
        float y = float(b[o]) - 0.5f;
        for (std::size_t i = 0; i < inputs; ++i) y += (float(w[o * inputs + i]) - teacher[o * inputs + i]) * x[i];
        err[o] = y;
        loss += 0.5 * y * y / batch;
      }
      for (std::size_t o = 0; o < outputs; ++o) {
        db[o] += err[o] / batch;
        for (std::size_t i = 0; i < inputs; ++i) dw[o * inputs + i] += err[o] * x[i] / batch;
      }
    }
    const float scale = float(opt.loss_scale());  // backward seeded with the loss scale
    for (std::size_t i = 0; i < w.size(); ++i) gw[i] = mpopt::half(dw[i] * scale);
    for (std::size_t o = 0; o < outputs; ++o) gb[o] = mpopt::half(db[o] * scale);
    const mpopt::step_status st = opt.step();
    if (step == 1) first = loss;
    last = loss;
    if (step % (steps / 4) == 0 || !st.applied)
      std::printf("  %-4s step %4d  loss %.5f  %s  grad norm %.3f  loss scale %g\n", Rule::name.data(), step, loss,
                  st.applied ? "applied" : st.reason().data(), st.grad_norm, st.scale_after);
  }
  // The checkpoint names the rule's state as it declares it: momentum_buffer/W, exp_avg/b, ...
  const auto file = std::filesystem::temp_directory_path() / (std::string(Rule::name) + ".safetensors");
  opt.save(file);
  optimizer again{{.clip_grad = 1.0}, {.init_scale = 1024}};
  again.add_group(weights).add(w, gw, "W");
  again.add_group(bias).add(b, gb, "b");
  again.load(file);
  std::filesystem::remove(file);
  std::printf("  %-4s checkpoint reloaded at step %llu with %zu state buffer(s)\n", Rule::name.data(),
              static_cast<unsigned long long>(again.group(0).step()), Rule::state.size());
  return {first, last};
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 400;
  if (argc == 3 && std::string(argv[1]) == "--steps") steps = std::atoi(argv[2]);
  if (steps < 4) {
    std::fprintf(stderr, "usage: custom_rule [--steps N], N >= 4\n");
    return 2;
  }
  bool all_learned = true;
  auto report = [&](const char* rule, std::pair<double, double> loss) {
    const bool learned = loss.second < 0.1 * loss.first;
    std::printf("%s: loss %.4f -> %.4f %s\n\n", rule, loss.first, loss.second, learned ? "" : "(did not learn)");
    all_learned &= learned;
  };
  report("Lion", train<user_rules::lion>({.lr = 3e-3, .weight_decay = 0.01}, {.lr = 3e-3}, steps));
  report("SGD, Nesterov momentum",
         train<user_rules::sgd>({.lr = 0.05, .weight_decay = 1e-4, .nesterov = true}, {.lr = 0.05, .nesterov = true}, steps));
  report("LARS", train<user_rules::lars>({.lr = 1.0, .momentum = 0.9, .weight_decay = 1e-4, .eta = 0.02},
                                         {.lr = 0.05, .momentum = 0.9, .weight_decay = 0.0, .eta = 1.0}, steps));
  report("Adagrad", train<user_rules::adagrad>({.lr = 0.1, .initial_accumulator_value = 0.1}, {.lr = 0.1}, steps));
  return all_learned ? 0 : 1;
}
