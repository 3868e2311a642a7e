// The README's usage snippet, compiled: fp16 weights with fp32 masters, dynamic loss scaling, AdamW,
// two parameter groups (decay on the weights, none on the bias), a checkpoint at the end.
#include <mpopt/adam.hpp>
#include <mpopt/checkpoint.hpp>
#include <mpopt/optimizer.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  using optimizer = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam>;
  optimizer opt{{.clip_grad = 1.0}, {.init_scale = 65536}};

  // Your model's tensors, in your types (here std::vector; see examples/custom_tensor.cpp for others).
  std::vector<mpopt::half> weight(4096, mpopt::half(0.0f)), weight_grad(4096);
  std::vector<mpopt::half> bias(16, mpopt::half(0.0f)), bias_grad(16);
  opt.add_group({.lr = 3e-2, .weight_decay = 0.01}).add(weight, weight_grad, "weight");
  opt.add_group({.lr = 3e-2, .weight_decay = 0.0}).add(bias, bias_grad, "bias");

  // A toy objective, 0.5 * |x - target|^2, so the backward pass is one line.
  auto target = [](std::size_t i) { return std::sin(0.01f * float(i)); };
  for (int step = 1; step <= 300; ++step) {
    const float scale = float(opt.loss_scale());  // seed dL/dy with the loss scale
    double loss = 0;
    for (std::size_t i = 0; i < weight.size(); ++i) {
      const float diff = float(weight[i]) - target(i);
      loss += 0.5 * diff * diff;
      weight_grad[i] = mpopt::half(scale * diff);
    }
    for (std::size_t i = 0; i < bias.size(); ++i) bias_grad[i] = mpopt::half(scale * (float(bias[i]) - 0.5f));

    const mpopt::step_status status = opt.step();  // never silent
    if (!status.applied)
      std::printf("step %3d %s: scale %g -> %g\n", step, status.reason().data(), status.scale_before, status.scale_after);
    else if (step % 50 == 0)
      std::printf("step %3d loss %.5f grad norm %.3f (clipped to %.3f) scale %g\n", step, loss, status.grad_norm,
                  status.grad_norm_clipped, status.scale_after);
  }
  opt.save("quickstart.safetensors");  // every tensor by name: params, fp32 masters, moments, scaler state
  std::printf("saved quickstart.safetensors\n");
}
