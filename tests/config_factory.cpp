// The optimizer a DeepSpeed configuration describes (include/mpopt/make_optimizer.hpp) behind
// mpopt::any_optimizer (include/mpopt/any_optimizer.hpp): every combination a configuration can name
// is built, carries every option it was given, and steps bit for bit like the typed optimizer of the
// same policies; tensors of the wrong element type are refused, naming them and both types.
#include <doctest/doctest.h>

#include <mpopt/make_optimizer.hpp>

#include "error_of.hpp"
#include "same_steps.hpp"
#include "temp_dir.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using mpopt::deepspeed_config;

using same_steps::check_same_steps;
using same_steps::model;
using same_steps::rule_options_of;
using same_steps::scaler_options_of;

template <class P, class S, class Part, class R>
using typed = mpopt::optimizer<P, S, Part, R, mpopt::host, mpopt::single_process>;

/// A model's own 16-bit types, declared to have mpopt::half's and mpopt::bfloat16's bits.
struct model_half {
  std::uint16_t bits;
};
struct model_bf16 {
  std::uint16_t bits;
};

}  // namespace

template <>
struct mpopt::numeric_traits<model_half> {
  using storage = mpopt::half;
};
template <>
struct mpopt::numeric_traits<model_bf16> {
  using storage = mpopt::bfloat16;
};

namespace {

const char* precisions[] = {
    R"("fp16": {"enabled": false})",
    R"("fp16": {"enabled": true, "loss_scale": 1024})",
    R"("fp16": {"enabled": true, "loss_scale": 0})",
    R"("bf16": {"enabled": true})",
};
const char* precision_names[] = {"fp32, no_scaling", "fp16, static_scale", "fp16, dynamic_scale", "bf16, no_scaling"};

}  // namespace

TEST_SUITE("config") {
  TEST_CASE("every combination a configuration names is built: precision x ZeRO stage x Adam, AdamW, Lamb, and "
            "OneBitLamb, OneBitAdam and ZeroOneAdam at stage 0") {
    int built = 0;
    for (int p = 0; p < 4; ++p)
      for (int stage = 0; stage <= 2; ++stage)
        for (std::string type : {"Adam", "AdamW", "Lamb", "OneBitLamb", "OneBitAdam", "ZeroOneAdam"}) {
          const bool compressing = type.starts_with("OneBit") || type == "ZeroOneAdam";
          if (compressing && stage > 0) continue;
          const std::string json = std::string("{") + precisions[p] + R"(, "zero_optimization": {"stage": )" +
                                   std::to_string(stage) + R"(}, "optimizer": {"type": ")" + type + R"("}})";
          CAPTURE(json);
          mpopt::any_optimizer opt = mpopt::make_optimizer(deepspeed_config::parse_text(json));
          const char* partitions[] = {"replicated", "zero1", "zero2"};
          const std::string rule = type == "Lamb"          ? "lamb"
                                   : type == "OneBitLamb"  ? "onebit_lamb"
                                   : type == "OneBitAdam"  ? "onebit_adam"
                                   : type == "ZeroOneAdam" ? "zero_one_adam"
                                                           : "adam";
          CHECK(opt.policies() == std::string(precision_names[p]) + ", " + partitions[stage] + ", " + rule +
                                      ", host, single_process");
          CHECK(opt.param_type() == (p == 0 ? mpopt::element_type::fp32 : p == 3 ? mpopt::element_type::bf16
                                                                                  : mpopt::element_type::fp16));
          CHECK(opt.grad_type() == opt.param_type());
          ++built;
        }
    CHECK(built == 48);  // 36 types: Adam and AdamW are one (mpopt::adam)
  }

  TEST_CASE("the built optimizer is the typed one and carries every option of the configuration") {
    const deepspeed_config c = deepspeed_config::parse_text(R"({
      "fp16": {"enabled": true, "initial_scale_power": 12, "loss_scale_window": 50, "hysteresis": 3,
               "consecutive_hysteresis": true, "min_loss_scale": 0.5},
      "zero_optimization": {"stage": 2, "reduce_bucket_size": 4096},
      "optimizer": {"type": "Adam", "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1,
                                               "adam_w_mode": false, "bias_correction": false}},
      "gradient_clipping": 0.5,
      "gradient_accumulation_steps": 3,
      "gradient_predivide_factor": 2
    })");
    mpopt::any_optimizer opt = mpopt::make_optimizer(c);
    using opt_t = typed<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam>;
    CHECK(opt.target<typed<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero1, mpopt::adam>>() == nullptr);
    CHECK(opt.target<typed<mpopt::bf16, mpopt::no_scaling, mpopt::zero2, mpopt::adam>>() == nullptr);
    opt_t* t = opt.target<opt_t>();
    REQUIRE(t != nullptr);
    CHECK(std::as_const(opt).target<opt_t>() == t);
    CHECK(t->config().clip_grad == 0.5);
    CHECK(t->config().accumulation_steps == 3);
    CHECK(t->config().bucket_elements == 4096);
    CHECK(t->config().gradient_predivide == 2.0);
    CHECK(t->config().skip_nonfinite);
    CHECK(&opt.config() == &t->config());
    const auto& s = t->scaler().config();
    CHECK(s.init_scale == 4096.0);
    CHECK(s.window == 50);
    CHECK(s.hysteresis == 3);
    CHECK(s.consecutive_hysteresis);
    CHECK(s.min_scale == 0.5);
    CHECK(opt.loss_scale() == 4096.0);

    std::vector<mpopt::half> w(10, mpopt::half(0.1f)), wg(10), b(3, mpopt::half(0.0f)), bg(3);
    opt.add_group().add(w, wg, "w");
    auto bias = opt.add_group({.lr = 1e-2, .weight_decay = 0.0, .beta1 = 0.5, .beta2 = 0.9, .eps = 1e-7});
    bias.add(b, bg, "b");
    const auto& g0 = t->group(0).options();
    CHECK(g0.lr == 3e-4);
    CHECK(g0.beta1 == 0.8);
    CHECK(g0.beta2 == 0.95);
    CHECK(g0.eps == 1e-6);
    CHECK(g0.weight_decay == 0.1);
    CHECK_FALSE(g0.decoupled_weight_decay);
    CHECK_FALSE(g0.bias_correction);
    const auto& g1 = t->group(1).options();
    CHECK(g1.lr == 1e-2);
    CHECK(g1.weight_decay == 0.0);
    CHECK(g1.beta1 == 0.5);
    CHECK(g1.beta2 == 0.9);
    CHECK(g1.eps == 1e-7);
    CHECK_FALSE(g1.decoupled_weight_decay);  // the rest from the configuration
    CHECK(bias.lr() == 1e-2);
    bias.set_lr(5e-3);
    CHECK(t->group(1).lr() == 5e-3);
    CHECK(opt.group_count() == 2);
    CHECK(opt.tensor_count() == 2);
    CHECK(opt.group(1).name(0) == "b");
    CHECK(opt.group(1).size() == 1);
  }

  TEST_CASE("Lamb's, OneBitLamb's, OneBitAdam's and ZeroOneAdam's options reach the typed optimizer's groups") {
    {
      const deepspeed_config c = deepspeed_config::parse_text(R"({"bf16": {"enabled": true, "check_grad_overflow": false},
        "zero_optimization": {"stage": 1},
        "optimizer": {"type": "Lamb", "params": {"lr": 0.02, "max_coeff": 0.3, "min_coeff": 0.05, "eps_inside_sqrt": true,
                                                 "bias_correction": false}}})");
      mpopt::any_optimizer opt = mpopt::make_optimizer(c);
      auto* t = opt.target<typed<mpopt::bf16, mpopt::no_scaling, mpopt::zero1, mpopt::lamb>>();
      REQUIRE(t != nullptr);
      CHECK_FALSE(t->config().skip_nonfinite);
      opt.add_group();
      const auto& o = t->group(0).options();
      CHECK(o.lr == 0.02);
      CHECK(o.max_coeff == 0.3);
      CHECK(o.min_coeff == 0.05);
      CHECK(o.eps_inside_sqrt);
      CHECK_FALSE(o.bias_correction);
    }
    {
      // docs/_pages/config-json.md, the 1-bit LAMB example, in fp16 with a static scale.
      const deepspeed_config c = deepspeed_config::parse_text(R"({"fp16": {"enabled": true, "loss_scale": 256},
        "optimizer": {"type": "OneBitLamb", "params": {"lr": 11e-3, "weight_decay": 0.01, "bias_correction": false,
          "max_coeff": 0.3, "min_coeff": 0.01, "freeze_step": 1000, "cuda_aware": false, "comm_backend_name": "nccl",
          "coeff_beta": 0.9, "factor_max": 4.0, "factor_min": 0.5, "factor_threshold": 0.1}}})");
      mpopt::any_optimizer opt = mpopt::make_optimizer(c);
      auto* t = opt.target<typed<mpopt::fp16, mpopt::static_scale, mpopt::replicated, mpopt::onebit_lamb>>();
      REQUIRE(t != nullptr);
      CHECK(opt.loss_scale() == 256.0);
      opt.add_group();
      const auto& o = t->group(0).options();
      CHECK(o.lr == 11e-3);
      CHECK(o.freeze_step == 999);
      CHECK(o.max_coeff == 0.3);
      CHECK(o.factor_max == 4.0);
    }
    {
      // docs/_pages/config-json.md, the 1-bit Adam example.
      const deepspeed_config c = deepspeed_config::parse_text(R"({"fp16": {"enabled": true},
        "optimizer": {"type": "OneBitAdam", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8,
          "weight_decay": 3e-7, "freeze_step": 400, "cuda_aware": false, "comm_backend_name": "nccl"}}})");
      mpopt::any_optimizer opt = mpopt::make_optimizer(c);
      auto* t = opt.target<typed<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::onebit_adam>>();
      REQUIRE(t != nullptr);
      opt.add_group();
      const auto& o = t->group(0).options();
      CHECK(o.lr == 0.001);
      CHECK(o.beta1 == 0.8);
      CHECK(o.weight_decay == 3e-7);
      CHECK(o.freeze_step == 399);  // DeepSpeed's 400 counts its set-up call
    }
    {
      // docs/_pages/config-json.md, the 0/1 Adam example.
      const deepspeed_config c = deepspeed_config::parse_text(R"({"bf16": {"enabled": true},
        "optimizer": {"type": "ZeroOneAdam", "params": {"lr": 1e-3, "weight_decay": 0.01, "bias_correction": false,
          "var_freeze_step": 1000, "var_update_scaler": 16, "local_step_scaler": 1000, "local_step_clipper": 16,
          "cuda_aware": false, "comm_backend_name": "nccl"}}})");
      mpopt::any_optimizer opt = mpopt::make_optimizer(c);
      auto* t = opt.target<typed<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::zero_one_adam>>();
      REQUIRE(t != nullptr);
      opt.add_group();
      const auto& o = t->group(0).options();
      CHECK(o.weight_decay == 0.01);
      CHECK(o.var_freeze_step == 1000);  // phase 1 ends after DeepSpeed's s = 1001: 1000 updates
      CHECK(o.var_update_scaler == 16);
      CHECK(o.local_step_scaler == 1000);
      CHECK(o.local_step_clipper == 16);
    }
  }

  TEST_CASE("a factory-made optimizer steps bit for bit like the typed optimizer of the same policies") {
    SUBCASE("fp16, dynamic scale, ZeRO-2, AdamW, accumulation over 2 micro-steps, an overflow") {
      check_same_steps<typed<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam>>(
          R"({"fp16": {"enabled": true, "initial_scale_power": 10, "loss_scale_window": 3},
              "zero_optimization": {"stage": 2, "reduce_bucket_size": 300},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
              "gradient_accumulation_steps": 2, "gradient_clipping": 0.1})",
          24, 7);
    }
    SUBCASE("bf16, ZeRO-1 with overlap_comm (its reductions start in grad_ready), AdamW") {
      check_same_steps<typed<mpopt::bf16, mpopt::no_scaling, mpopt::zero1, mpopt::adam>>(
          R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 1, "overlap_comm": true, "reduce_bucket_size": 300},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}})",
          8, -1);
    }
    SUBCASE("fp16, static scale, no ZeRO, Adam with L2 decay, an overflow") {
      check_same_steps<typed<mpopt::fp16, mpopt::static_scale, mpopt::replicated, mpopt::adam>>(
          R"({"fp16": {"enabled": true, "loss_scale": 128},
              "optimizer": {"type": "Adam", "params": {"lr": 2e-3, "weight_decay": 0.05, "adam_w_mode": false}}})",
          12, 4);
    }
    SUBCASE("bf16, ZeRO-1, Lamb") {
      check_same_steps<typed<mpopt::bf16, mpopt::no_scaling, mpopt::zero1, mpopt::lamb>>(
          R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 1},
              "optimizer": {"type": "Lamb", "params": {"lr": 1e-2, "weight_decay": 0.01, "max_coeff": 0.3}}})",
          12, -1);
    }
    SUBCASE("fp32, OneBitLamb past its warm-up") {
      check_same_steps<typed<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::onebit_lamb>>(
          R"({"optimizer": {"type": "OneBitLamb", "params": {"lr": 1e-2, "freeze_step": 4}}, "gradient_clipping": 0})",
          12, -1);
    }
    SUBCASE("fp16, dynamic scale, OneBitAdam past its warm-up, an overflow") {
      check_same_steps<typed<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::onebit_adam>>(
          R"({"fp16": {"enabled": true, "initial_scale_power": 10},
              "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3, "freeze_step": 4}}})",
          12, 7);
    }
    SUBCASE("bf16, ZeroOneAdam through both phases") {
      check_same_steps<typed<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::zero_one_adam>>(
          R"({"bf16": {"enabled": true},
              "optimizer": {"type": "ZeroOneAdam", "params": {"lr": 1e-3, "var_freeze_step": 6, "var_update_scaler": 2,
                                                               "local_step_scaler": 2, "local_step_clipper": 4}}})",
          16, -1);
    }
  }

  TEST_CASE("a tensor whose element type is not the precision's is refused, naming it and both types; nothing "
            "is registered") {
    mpopt::any_optimizer opt =
        mpopt::make_optimizer(deepspeed_config::parse_text(R"({"fp16": {"enabled": true}, "optimizer": {"type": "Adam"}})"));
    auto g = opt.add_group();
    std::vector<float> p(8, 0.0f), gr(8, 0.0f);
    std::vector<mpopt::half> hp(8, mpopt::half(0.0f)), hg(8, mpopt::half(0.0f));
    std::vector<mpopt::bfloat16> bg(8, mpopt::bfloat16(0.0f));
    std::string msg = error_of([&] { g.add(p, gr, "embedding"); });
    CHECK(msg == "mpopt: tensor 'embedding': its parameter holds fp32 elements, but the optimizer trains in fp16, whose "
                 "parameters are fp16");
    msg = error_of([&] { g.add(hp, bg, "embedding"); });
    CHECK(msg == "mpopt: tensor 'embedding': its gradient holds bf16 elements, but the optimizer trains in fp16, whose "
                 "gradients are fp16");
    msg = error_of([&] { g.add(p, hg); });  // unnamed: the name the typed optimizer would give it
    CHECK(msg.find("tensor 'group 0.0': its parameter holds fp32") != std::string::npos);
    CHECK(g.size() == 0);
    CHECK(opt.tensor_count() == 0);
    g.add(hp, hg, "embedding");  // the name is still free
    CHECK(g.size() == 1);
    // The typed optimizer's own checks come through as they are.
    CHECK(error_of([&] { g.add(hp, hg, "embedding"); }).find("tensor name 'embedding' is used twice") != std::string::npos);
    CHECK(error_of([&] { opt.group(3); }).find("there are 1 groups, no group 3") != std::string::npos);
  }

  TEST_CASE("a factory-made optimizer takes a schedule as the typed one does") {
    mpopt::any_optimizer a = mpopt::make_optimizer(
        deepspeed_config::parse_text(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})"));
    const mpopt::lr_schedule s = mpopt::warmup_lr{.warmup_num_steps = 5};
    std::vector<float> p(20, 0.5f), g(20, 0.01f);
    auto group = a.add_group();
    group.add(p, g, "w");
    a.set_schedule(s);
    REQUIRE(a.schedule());
    for (std::uint64_t k = 0; k < 8; ++k) {
      CHECK(a.step().applied);
      CHECK(group.lr() == mpopt::scheduled_rate(s, k, 1e-2));
    }
    CHECK(error_of([&] { a.set_schedule(mpopt::step_decay{}); }).find("step_decay.step_size") != std::string::npos);
    a.clear_schedule();
    CHECK_FALSE(a.schedule());
  }

  TEST_CASE("a Hugging Face file with \"auto\" values runs with them given from code, offload_optimizer included") {
    const char* zero2 = R"({
      "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 10},
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                    "warmup_num_steps": "auto"}},
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                            "overlap_comm": true, "reduce_bucket_size": "auto"},
      "gradient_accumulation_steps": "auto",
      "gradient_clipping": "auto",
      "train_micro_batch_size_per_gpu": "auto"
    })";
    CHECK(error_of([&] { (void)deepspeed_config::parse_text(zero2); }).rfind("mpopt: 12 problems:", 0) == 0);
    const nlohmann::json from_code = {
        {"fp16.enabled", true}, {"optimizer.params.lr", 2e-3}, {"optimizer.params.betas", {0.9, 0.99}},
        {"optimizer.params.eps", 1e-8}, {"optimizer.params.weight_decay", 0.0}, {"scheduler.params.warmup_min_lr", 0},
        {"scheduler.params.warmup_max_lr", 2e-3}, {"scheduler.params.warmup_num_steps", 10},
        {"zero_optimization.reduce_bucket_size", 64}, {"gradient_accumulation_steps", 2}, {"gradient_clipping", 1.0},
        {"train_micro_batch_size_per_gpu", 4}};
    const deepspeed_config c = deepspeed_config::parse_text(zero2, 1, from_code);
    CHECK(c.offload_optimizer);
    mpopt::any_optimizer opt = mpopt::make_optimizer(c);
    std::vector<mpopt::half> p(40, mpopt::half(0.5f)), g(40);
    opt.add_group().add(p, g, "w");
    const mpopt::lr_schedule s = *c.schedule;
    for (std::uint64_t k = 0; k < 6; ++k) {
      for (int micro = 0; micro < 2; ++micro) {
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = mpopt::half(float(opt.loss_scale()) * 0.01f * float(i % 7));
        opt.step();
      }
      CHECK(opt.group(0).step() == k + 1);
      CHECK(opt.group(0).lr() == mpopt::scheduled_rate(s, k, 2e-3));
    }
    CHECK(p[1] != mpopt::half(0.5f));
  }

  TEST_CASE("a factory-made optimizer saves into a byte buffer and a stream, and loads from them") {
    const deepspeed_config c = deepspeed_config::parse_text(R"({"bf16": {"enabled": true}, "optimizer": {"type": "Lamb"}})");
    std::vector<mpopt::bfloat16> p(30, mpopt::bfloat16(0.5f)), g(30, mpopt::bfloat16(0.01f)), q = p, h = g;
    mpopt::any_optimizer a = mpopt::make_optimizer(c), b = mpopt::make_optimizer(c);
    a.add_group().add(p, g, "w");
    b.add_group().add(q, h, "w");
    for (int s = 0; s < 3; ++s) CHECK(a.step().applied);
    std::vector<std::byte> bytes;
    a.save(bytes);
    std::stringstream stream;
    a.save(stream);
    CHECK(stream.str() == std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    b.load(bytes);
    CHECK(std::ranges::equal(a.master(0), b.master(0)));
    CHECK(b.group(0).step() == 3);
    CHECK(b.step().applied);
    b.load(stream);  // back to the saved state
    CHECK(b.group(0).step() == 3);
    CHECK(std::ranges::equal(a.master(0), b.master(0)));
  }

  TEST_CASE("a configuration's scheduler block is followed, saved, and restored into a factory-made optimizer") {
    const char* scheduled = R"({"fp16": {"enabled": true, "initial_scale_power": 8}, "optimizer": {"type": "AdamW",
        "params": {"lr": 3e-3}}, "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 20,
        "warmup_num_steps": 4, "warmup_type": "linear"}}})";
    const deepspeed_config c = deepspeed_config::parse_text(scheduled);
    REQUIRE(c.schedule);
    auto train = [&](mpopt::any_optimizer& opt, std::vector<mpopt::half>& p, std::vector<mpopt::half>& g, int from, int to) {
      for (int step = from; step < to; ++step) {
        for (std::size_t i = 0; i < g.size(); ++i)
          g[i] = mpopt::half(float(opt.loss_scale()) * 0.01f * std::sin(0.5f * float(i) + 0.2f * float(step)));
        CHECK(opt.step().applied);
        CHECK(opt.group(0).lr() == mpopt::scheduled_rate(*c.schedule, std::uint64_t(step), 3e-3));
      }
      CHECK(p[0] != mpopt::half(0.5f));
    };
    std::vector<mpopt::half> p(24, mpopt::half(0.5f)), g(24), q = p, h(24), r = p, k(24);
    mpopt::any_optimizer whole = mpopt::make_optimizer(c);
    REQUIRE(whole.schedule());
    whole.add_group().add(p, g, "w");
    train(whole, p, g, 0, 16);

    temp_dir dir;
    mpopt::any_optimizer first = mpopt::make_optimizer(c);
    first.add_group().add(q, h, "w");
    train(first, q, h, 0, 9);
    first.save(dir / "at9.safetensors");
    // Made without the scheduler block: the checkpoint brings the schedule.
    deepspeed_config plain = c;
    plain.schedule.reset();
    mpopt::any_optimizer resumed = mpopt::make_optimizer(plain);
    CHECK_FALSE(resumed.schedule());
    resumed.add_group().add(r, k, "w");
    resumed.load(dir / "at9.safetensors");
    REQUIRE(resumed.schedule());
    train(resumed, r, k, 9, 16);
    CHECK(std::memcmp(p.data(), r.data(), sizeof(mpopt::half) * p.size()) == 0);
    CHECK(resumed.group(0).lr() == whole.group(0).lr());
  }

  TEST_CASE("raw host buffers go in with their length, and train like the same buffers as views, also where the "
            "optimizer holds the gradients") {
    const char* json = R"({"bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})";
    mpopt::any_optimizer a = mpopt::make_optimizer(deepspeed_config::parse_text(json));
    mpopt::any_optimizer b = mpopt::make_optimizer(deepspeed_config::parse_text(json));
    // An engine's parameters as pieces of one allocation, and its gradients of another.
    std::vector<mpopt::bfloat16> pa(15), ga(15), pb(15), gb(15);
    for (std::size_t i = 0; i < 15; ++i) {
      pa[i] = pb[i] = mpopt::bfloat16(std::sin(float(i)));
      ga[i] = gb[i] = mpopt::bfloat16(0.1f * std::cos(float(i)));
    }
    a.add_group().add(pa.data(), ga.data(), 12, "w", {3, 4}).add(pa.data() + 12, ga.data() + 12, 3, "b");
    b.add_group()
        .add(mpopt::view<mpopt::bfloat16>{pb.data(), 12}, mpopt::view<mpopt::bfloat16>{gb.data(), 12}, "w", {3, 4})
        .add(mpopt::view<mpopt::bfloat16>{pb.data() + 12, 3}, mpopt::view<mpopt::bfloat16>{gb.data() + 12, 3}, "b");
    CHECK(a.group(0).name(1) == "b");
    // A length the shape does not hold is refused as for any tensor.
    CHECK(error_of([&] { a.group(0).add(pa.data(), ga.data(), 5, "odd", {2, 3}); }).find("tensor 'odd': shape [2, 3]") !=
          std::string::npos);
    // Parameters alone: the optimizer holds their gradients and hands them back, as elements of the
    // parameters' type or of one named; a type without the gradients' bits is refused first.
    mpopt::any_optimizer c = mpopt::make_optimizer(deepspeed_config::parse_text(json));
    std::vector<mpopt::bfloat16> pc(pb);
    auto group = c.add_group();
    const std::span<mpopt::bfloat16> held_w = group.add(pc.data(), 12, "w", {3, 4});
    CHECK(error_of([&] { group.add<float>(pc.data() + 12, 3, "b"); }).find("gradients hold bf16, not fp32") !=
          std::string::npos);
    CHECK(error_of([&] { group.add<mpopt::bfloat16>(reinterpret_cast<float*>(pc.data() + 12), 3, "b"); })
              .find("tensor 'b': its parameter holds fp32 elements") != std::string::npos);
    CHECK(group.size() == 1);
    const std::span<mpopt::bfloat16> held_b = group.add<mpopt::bfloat16>(pc.data() + 12, 3);
    CHECK(group.name(1) == "group 0.1");
    CHECK(held_b.data() == group.grad<mpopt::bfloat16>(1).data());
    std::copy(ga.begin(), ga.begin() + 12, held_w.begin());
    std::copy(ga.begin() + 12, ga.end(), held_b.begin());
    for (int k = 0; k < 3; ++k) {
      const mpopt::step_status sa = a.step(), sb = b.step(), sc = c.step();
      CHECK(sa.applied);
      CHECK(sa.grad_norm == sb.grad_norm);
      CHECK(sa.grad_norm == sc.grad_norm);
    }
    CHECK(std::memcmp(pa.data(), pb.data(), sizeof(mpopt::bfloat16) * pa.size()) == 0);
    CHECK(std::memcmp(pa.data(), pc.data(), sizeof(mpopt::bfloat16) * pa.size()) == 0);
    CHECK(pa[0].bits != mpopt::bfloat16(std::sin(0.0f)).bits);  // it trained
  }

  TEST_CASE("tensors of a type with the precision's bits go in as they are, with their shapes; other bits are "
            "refused naming both types") {
    mpopt::any_optimizer opt =
        mpopt::make_optimizer(deepspeed_config::parse_text(R"({"fp16": {"enabled": true}, "optimizer": {"type": "Adam"}})"));
    std::vector<model_half> p(6, model_half{0x3c00}), g(6, model_half{0x3800});  // 1.0 and 0.5
    std::vector<model_bf16> bp(6), bg(6);
    auto group = opt.add_group();
    group.add(p, g, "w", {2, 3});
    using opt_t = typed<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam>;
    REQUIRE(opt.target<opt_t>() != nullptr);
    CHECK(opt.target<opt_t>()->group(0).shape(0) == mpopt::tensor_shape{2, 3});
    CHECK(error_of([&] { group.add(bp, bg, "b"); }) ==
          "mpopt: tensor 'b': its parameter holds bf16 elements, but the optimizer trains in fp16, whose parameters "
          "are fp16");
    CHECK(error_of([&] { group.add(p, g, "w2", {4}); }).find("tensor 'w2': shape [4] holds 4 elements") !=
          std::string::npos);
    CHECK(group.size() == 1);
    CHECK(opt.step().applied);
    CHECK(p[0].bits != 0x3c00);  // the optimizer wrote the model's own type
    CHECK(mpopt::half(opt.master(0)[0]).bits == p[0].bits);  // the master, rounded to nearest
  }

  TEST_CASE("flat groups hand out views of the precision's type; another type is refused") {
    mpopt::any_optimizer opt =
        mpopt::make_optimizer(deepspeed_config::parse_text(R"({"bf16": {"enabled": true}, "optimizer": {"type": "Lamb"}})"));
    auto g = opt.add_flat_group({.weight_decay = 0.0}, {{"w", 12}, {"b", 3}});
    const std::span<mpopt::bfloat16> w = g.param<mpopt::bfloat16>(0);
    CHECK(w.size() == 12);
    CHECK(g.grad<mpopt::bfloat16>(1).size() == 3);
    CHECK(g.name(1) == "b");
    CHECK(error_of([&] { (void)g.param<float>(0); }) == "mpopt: tensor 'w': its parameter holds bf16, not fp32");
    CHECK(error_of([&] { (void)g.grad<mpopt::half>(1); }) == "mpopt: tensor 'b': its gradient holds bf16, not fp16");
    for (auto& x : w) x = mpopt::bfloat16(1.0f);
    for (auto& x : g.grad<mpopt::bfloat16>(0)) x = mpopt::bfloat16(0.5f);
    CHECK(opt.step().applied);
    CHECK(opt.master(0)[0] < 1.0f);  // a step far below bf16's spacing at 1: the master moves
    CHECK(opt.memory_report().owned_bytes() > 0);
  }

  TEST_CASE("save and load through any_optimizer resume bit for bit") {
    const std::string json = R"({"fp16": {"enabled": true, "initial_scale_power": 8}, "zero_optimization": {"stage": 1},
                                 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}}})";
    temp_dir dir;
    const auto file = dir / "state.safetensors";
    model<mpopt::half> m1, m2;
    mpopt::any_optimizer a = mpopt::make_optimizer(deepspeed_config::parse_text(json));
    a.add_group().add(m1.p[0], m1.g[0], "w0").add(m1.p[1], m1.g[1], "w1").add(m1.p[2], m1.g[2], "w2");
    for (int k = 0; k < 4; ++k) {
      m1.backward(k, a.loss_scale(), -1);
      a.step();
    }
    a.save(file);
    mpopt::any_optimizer b = mpopt::make_optimizer(deepspeed_config::parse_text(json));
    b.add_group().add(m2.p[0], m2.g[0], "w0").add(m2.p[1], m2.g[1], "w1").add(m2.p[2], m2.g[2], "w2");
    b.load(file);
    for (int k = 4; k < 8; ++k) {
      m1.backward(k, a.loss_scale(), -1);
      m2.backward(k, b.loss_scale(), -1);
      CHECK(a.step().applied);
      CHECK(b.step().applied);
    }
    for (std::size_t t = 0; t < 3; ++t)
      CHECK(std::memcmp(m1.p[t].data(), m2.p[t].data(), m1.p[t].size() * sizeof(mpopt::half)) == 0);
    CHECK(a.group(0).step() == 8);
    CHECK(b.group(0).step() == 8);
  }

  TEST_CASE("make_optimizer takes a parsed JSON; a configuration read for other ranks, or a hand-made one it cannot "
            "build, is refused") {
    mpopt::any_optimizer opt = mpopt::make_optimizer(nlohmann::json::parse(R"({"optimizer": {"type": "Lamb"}})"));
    CHECK(opt.policies() == "fp32, no_scaling, replicated, lamb, host, single_process");
    CHECK(error_of([] { mpopt::make_optimizer(nlohmann::json::parse(R"({"optimizer": {"type": "Lamb"}, "fp16": {"enabled": 1}})")); })
              .find("fp16.enabled must be true or false") != std::string::npos);

    // train_batch_size 64 / (8 per rank x 4 ranks): 2 steps for 4 ranks; 8 for this one.
    const deepspeed_config four = deepspeed_config::parse_text(
        R"({"optimizer": {"type": "Adam"}, "train_batch_size": 64, "train_micro_batch_size_per_gpu": 8})", 4);
    CHECK(error_of([&] { mpopt::make_optimizer(four); })
              .find("the configuration was read for 4 ranks, which its train_batch_size divides into 2 accumulation "
                    "steps; the communicator has 1") != std::string::npos);
    deepspeed_config c;
    c.precision = mpopt::config_precision::fp16;  // with no scaler
    CHECK(error_of([&] { mpopt::make_optimizer(c); }).find("fp16 from a DeepSpeed configuration has a loss scale") !=
          std::string::npos);
    c = {};
    c.zero_stage = 3;
    CHECK(error_of([&] { mpopt::make_optimizer(c); }).find("zero_optimization.stage: 3 is not supported") != std::string::npos);
    c = {};
    c.rule = mpopt::config_rule::onebit_lamb;
    c.zero_stage = 2;
    CHECK(error_of([&] { mpopt::make_optimizer(c); }).find("does not go with 1-bit LAMB") != std::string::npos);
    c.rule = mpopt::config_rule::zero_one_adam;
    CHECK(error_of([&] { mpopt::make_optimizer(c); }).find("does not go with 0/1 Adam") != std::string::npos);
    c = {};
    c.adam_options.beta1 = 1.5;  // checked where the typed optimizer checks it: at add_group
    mpopt::any_optimizer bad = mpopt::make_optimizer(c);
    CHECK(error_of([&] { bad.add_group(); }).find("group 0.beta1 must be in [0, 1)") != std::string::npos);
    CHECK(bad.group_count() == 0);
  }
}
