// The snippet of docs/checkpoints.md, "Shapes", made a translation unit; the stand-ins are opt, group,
// options, weight and weight_grad.
#include <mpopt/adam.hpp>
#include <mpopt/optimizer.hpp>

#include <vector>

void shapes() {
  mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam> opt;
  auto& group = opt.add_group({.lr = 1e-3});
  const mpopt::adam::options options{.lr = 1e-3};
  std::vector<mpopt::half> weight(2048), weight_grad(2048);
  group.add(weight, weight_grad, "fc1.weight", {64, 32});  // or any range of integers
  opt.add_flat_group(options, {{"fc1.weight", 2048, {64, 32}}, {"fc1.bias", 64, {64}}});
}
