// The snippet of docs/concepts.md, "The loss-spike guard", made a translation unit; the stand-ins are
// opt (built from o), its tensors, loss and log.
#include <mpopt/adam.hpp>
#include <mpopt/optimizer.hpp>

#include <string_view>
#include <vector>

void log(std::string_view, double) {}

void spike_guard(double loss) {
  mpopt::optimizer_options o;
  o.spike_guard = {.window = 128, .loss_z = 4, .norm_z = 4};  // a z of 0 turns its test off
  mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam> opt{o};
  std::vector<mpopt::half> w(64), g(64);
  opt.add_group({.lr = 1e-3}).add(w, g, "w");
  const mpopt::step_status st = opt.step(loss);  // this micro-batch's loss on this rank
  if (st.result == mpopt::step_result::skipped_loss_spike) log("loss z-score ", st.loss_z);
}
