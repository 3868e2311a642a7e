// The snippet of docs/concepts.md, "Learning-rate schedules", made a translation unit; the stand-ins
// are opt, w and g.
#include <mpopt/adam.hpp>
#include <mpopt/lr_schedule.hpp>
#include <mpopt/optimizer.hpp>

#include <vector>

void schedule() {
  mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::adam> opt;
  std::vector<float> w(64), g(64);
  opt.add_group({.lr = 6e-4}).add(w, g, "w");
  opt.set_schedule(mpopt::warmup_cosine_lr{.total_num_steps = 10000, .warmup_num_steps = 500});
}
