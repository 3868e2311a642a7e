// The snippet of README.md, "Quickstart", made a translation unit; the stand-ins are data, model and log
// (examples/quickstart.cpp is the runnable form).
#include <mpopt/adam.hpp>
#include <mpopt/checkpoint.hpp>  // save() and load(); <mpopt/mpopt.hpp> includes every header
#include <mpopt/optimizer.hpp>

#include <string_view>
#include <vector>

std::vector<int> data;
struct {
  void forward_backward(int, double) {}
} model;
void log(std::string_view, double) {}

void quickstart() {
  using optimizer = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam>;
  optimizer opt{{.clip_grad = 1.0}, {.init_scale = 65536}};

  std::vector<mpopt::half> weight(4096), weight_grad(4096), bias(16), bias_grad(16);
  opt.add_group({.lr = 3e-2, .weight_decay = 0.01}).add(weight, weight_grad, "weight");
  opt.add_group({.lr = 3e-2, .weight_decay = 0.0}).add(bias, bias_grad, "bias");

  for (auto& batch : data) {
    model.forward_backward(batch, /*seed dL/dy with*/ opt.loss_scale());  // writes weight_grad, bias_grad
    mpopt::step_status status = opt.step();                               // never silent
    if (!status.applied) log(status.reason(), status.scale_after);
  }
  opt.save("step-1000.safetensors");
}
