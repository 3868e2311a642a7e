// The optimizer's memory per parameter, as memory_report() lists it, for fp16 and bf16 AdamW under
// each state precision (docs/concepts.md, "State precision"): today's fp32 master and moments, bf16
// moments, masters kept as 16-bit remainders, and moments quantized in blocks (8-bit, 4-bit, fp8).
// The tensors are a small GPT's (4 layers of width 256, a 2,048-token vocabulary: 3.7M
// parameters); the state is allocated (finalize()) and nothing is stepped. Exits nonzero if a
// report's bytes are not what its storage takes: 2 bytes a parameter for the 16-bit parameter, and
// per parameter 4 (fp32 master) or 2 (remainder16) plus, for each of the two moments, 4 (fp32),
// 2 (bf16), 1 + 4/256 (8-bit codes and fp32 scales of 256-element blocks), 1/2 + 4/128 (4-bit).
//
//   build/examples/state_memory
#include <mpopt/mpopt.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace {

/// A small GPT's parameter tensors: embeddings, then per layer the attention's and the MLP's
/// weights and biases and two layer norms, then the final norm.
std::vector<std::size_t> gpt_tensors(std::size_t layers, std::size_t width, std::size_t vocab, std::size_t context) {
  std::vector<std::size_t> sizes = {vocab * width, context * width};
  for (std::size_t l = 0; l < layers; ++l)
    for (std::size_t s : {width, width, 3 * width * width, 3 * width, width * width, width, width, width,
                          4 * width * width, 4 * width, 4 * width * width, width})
      sizes.push_back(s);
  sizes.push_back(width);
  sizes.push_back(width);
  return sizes;
}

/// The optimizer state (master and moments) per parameter of each storage, from its formula.
double expected_state(double master, double moment) { return master + 2 * moment; }

template <class Precision, class Scaler>
bool report(std::string_view what, double master, double moment) {
  using P = typename Precision::param_type;
  const auto sizes = gpt_tensors(4, 256, 2048, 128);
  std::vector<std::vector<P>> params, grads;
  mpopt::optimizer<Precision, Scaler, mpopt::replicated, mpopt::adam> opt;
  auto& group = opt.add_group({.lr = 3e-4, .weight_decay = 0.1});
  std::size_t n = 0;
  for (std::size_t s : sizes) {
    params.emplace_back(s);
    grads.emplace_back(s);
    group.add(params.back(), grads.back(), "t" + std::to_string(params.size()));
    n += s;
  }
  opt.finalize();
  const mpopt::memory_report r = opt.memory_report();
  double state = 0;
  for (const auto& b : r.buffers)
    if (b.name.starts_with("master") || b.name.starts_with("exp_avg")) state += double(b.bytes);
  const double per_param = state / double(n), expected = expected_state(master, moment);
  // The layout pads each tensor to a whole block: at most a block's worth per tensor.
  const bool right = std::abs(per_param - expected) <= expected * 2e-3;
  std::printf("%-44.*s state %6.3f B/param (expected %6.3f), with parameter and gradient %6.3f%s\n",
              int(what.size()), what.data(), per_param, expected, per_param + 2 * sizeof(P), right ? "" : "  WRONG");
  return right;
}

}  // namespace

int main() {
  std::printf("AdamW over %zu tensors of a small GPT; optimizer state per parameter (master and moments):\n",
              gpt_tensors(4, 256, 2048, 128).size());
  bool ok = true;
  ok &= report<mpopt::fp16, mpopt::dynamic_scale>("fp16, fp32 master, fp32 moments (today)", 4, 4);
  ok &= report<mpopt::with_state<mpopt::fp16, mpopt::blockwise8_state>, mpopt::dynamic_scale>(
      "fp16, fp32 master, 8-bit moments", 4, 1 + 4.0 / 256);
  ok &= report<mpopt::bf16, mpopt::no_scaling>("bf16, fp32 master, fp32 moments (today)", 4, 4);
  ok &= report<mpopt::with_state<mpopt::bf16, mpopt::bf16_state<>, mpopt::remainder16>, mpopt::no_scaling>(
      "bf16, remainder16 master, bf16 moments", 2, 2);
  ok &= report<mpopt::with_state<mpopt::bf16, mpopt::blockwise8_state, mpopt::remainder16>, mpopt::no_scaling>(
      "bf16, remainder16 master, 8-bit moments", 2, 1 + 4.0 / 256);
  ok &= report<mpopt::with_state<mpopt::bf16, mpopt::fp8_state, mpopt::remainder16>, mpopt::no_scaling>(
      "bf16, remainder16 master, fp8 moments", 2, 1 + 4.0 / 256);
  ok &= report<mpopt::with_state<mpopt::bf16, mpopt::blockwise4_state, mpopt::remainder16>, mpopt::no_scaling>(
      "bf16, remainder16 master, 4-bit moments", 2, 0.5 + 4.0 / 128);
  return ok ? 0 : 1;
}
