// The training loop of docs/deepspeed-config.md's "Configuration from a DeepSpeed JSON", as written there, on a
// ZeRO-2 configuration with overlap_comm (as most real ones have), over the examples' factory
// (examples/configured_optimizer.hpp). Its forward reads the parameters: had step() returned
// before the other ranks' pieces arrived, the forward would read the last step's values. By
// default the loop gives the same bits every time, and with leave_param_gather_in_flight and a
// wait_params() before each forward, the same bits too: on two ranks those of the run without
// overlap_comm (on more, MPI's nonblocking reductions may add in another order than its blocking ones).
#include <doctest/doctest.h>

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <mpopt/numeric.hpp>

#include "../examples/configured_optimizer.hpp"

namespace {

/// Each rank pulls every weight towards targets of its own that move with the step: the loss is
/// 0.5 (w - t)^2, so the gradient w - t comes from the parameters as the forward reads them.
struct pull_model {
  std::vector<std::vector<mpopt::bfloat16>> w, g;

  explicit pull_model(const std::vector<std::size_t>& sizes) {
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      w.emplace_back(sizes[t]);
      g.emplace_back(sizes[t]);
      for (std::size_t i = 0; i < sizes[t]; ++i) w[t][i] = mpopt::bfloat16(0.5f * std::cos(0.3f * float(i) + float(t)));
    }
  }
  void forward_backward(int step, int rank) {
    for (std::size_t t = 0; t < w.size(); ++t)
      for (std::size_t i = 0; i < w[t].size(); ++i) {
        const float target = std::sin(0.1f * float(i) + float(t) + 0.7f * float(step) + 1.3f * float(rank));
        g[t][i] = mpopt::bfloat16(float(w[t][i]) - target);
      }
  }
  std::vector<std::uint16_t> bits() const {
    std::vector<std::uint16_t> out;
    for (const auto& tensor : w)
      for (const mpopt::bfloat16 x : tensor) {
        std::uint16_t b;
        std::memcpy(&b, &x, sizeof b);
        out.push_back(b);
      }
    return out;
  }
};

/// That page's loop for `steps` steps; `fast`: with leave_param_gather_in_flight, waiting before each
/// forward as its contract says. Returns the parameters' bits.
std::vector<std::uint16_t> train(bool overlap_comm, bool fast, int steps) {
  const std::string json = std::string(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
      "zero_optimization": {"stage": 2, "contiguous_gradients": true, "reduce_bucket_size": 3000,
                            "allgather_bucket_size": 3000, "overlap_comm": )") +
                           (overlap_comm ? "true" : "false") + "}}";
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  mpopt::deepspeed_config config = mpopt::deepspeed_config::parse_text(json, world);
  config.options.leave_param_gather_in_flight = fast;
  mpopt::any_optimizer opt = make_configured_optimizer(config);
  REQUIRE(opt.policies() == "bf16, no_scaling, zero2, adam, host, mpi");

  pull_model model({5000, 3001, 7});
  opt.add_group().add(model.w[0], model.g[0], "weight").add(model.w[1], model.g[1], "other weight");
  opt.add_group({.weight_decay = 0.0}).add(model.w[2], model.g[2], "bias");
  for (int step = 0; step < steps; ++step) {
    if (fast) opt.wait_params();
    model.forward_backward(step, rank);
    const mpopt::step_status status = opt.step();
    REQUIRE(status.applied);
    if (!fast) {  // step() returned with every parameter updated: waiting changes none
      const std::vector<std::uint16_t> returned = model.bits();
      opt.wait_params();
      CHECK(model.bits() == returned);
    }
  }
  opt.wait_params();
  // Under ZeRO each rank holds the state of a slice of each tensor, which owned(i) names: the
  // ranks' slices cover every element once.
  for (std::size_t i = 0; i < model.w.size(); ++i) {
    const mpopt::owned_elements o = opt.owned(i);
    CHECK(opt.master(i).size() == o.count);
    CHECK(o.first + o.count <= model.w[i].size());
    unsigned long long covered = o.count;
    MPI_Allreduce(MPI_IN_PLACE, &covered, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    CHECK(covered == model.w[i].size());
  }
  return model.bits();
}

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE("The documented DeepSpeed-configuration loop under ZeRO-2 with overlap_comm: the same bits every time, by "
            "default and with leave_param_gather_in_flight, and on two ranks those of a run without") {
    constexpr int steps = 6;
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const std::vector<std::uint16_t> first = train(true, false, steps);
    if (world <= 2) CHECK(first == train(false, false, steps));
    for (int run = 0; run < 2; ++run) {
      CAPTURE(run);
      CHECK(train(true, false, steps) == first);
      CHECK(train(true, true, steps) == first);
    }
  }
}
