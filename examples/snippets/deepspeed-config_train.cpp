// The second snippet of docs/deepspeed-config.md, "Configuration from a DeepSpeed JSON" (everywhere
// else), made a translation unit; the stand-ins are make_from's declaration (defined in
// deepspeed-config_factory.cpp), weight, weight_grad, bias, bias_grad, data and model.
#include <filesystem>
#include <vector>

// everywhere else:
#include <mpopt/any_optimizer.hpp>

mpopt::any_optimizer make_from(const std::filesystem::path& file);

std::vector<float> weight(4096), weight_grad(4096), bias(16), bias_grad(16);
std::vector<int> data;
struct {
  void forward_backward(int, double) {}
} model;

void train() {
  mpopt::any_optimizer opt = make_from("ds_config.json");
  opt.add_group().add(weight, weight_grad, "weight");                 // the configuration's options
  opt.add_group({.weight_decay = 0.0}).add(bias, bias_grad, "bias");  // ... except where a group says
  for (auto& batch : data) {
    model.forward_backward(batch, opt.loss_scale());
    mpopt::step_status status = opt.step();
    (void)status;  // read as in README.md's quickstart
  }
  opt.save("step-1000.safetensors");
}
