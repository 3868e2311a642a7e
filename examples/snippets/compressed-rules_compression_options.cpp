// The snippet of docs/compressed-rules.md, "Compression options", made a translation unit; the
// stand-ins are opt (1-bit Adam, in one process), i and mask.
#include <mpopt/onebit_adam.hpp>
#include <mpopt/optimizer.hpp>

#include <cstddef>
#include <vector>

void compression_options() {
  mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::onebit_adam> opt;
  const std::size_t i = 0;
  std::vector<float> mask(4096, 1.0f);
  opt.add_group({.lr = 1e-3, .freeze_step = 400,
                 .compression = {.exclude_zero_variance = true, .zero_variance_ratio = 1e-3,
                                 .scale = mpopt::compression_scale::per_tensor}});  // the defaults
  opt.set_exp_avg_mask(i, mask);  // DeepSpeed's exp_avg_mask, of tensor i
}
