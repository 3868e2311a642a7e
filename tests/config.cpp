// Reading the optimizer part of a DeepSpeed configuration (include/mpopt/deepspeed_config.hpp):
// what each key becomes, DeepSpeed's defaults for absent keys, and an mpopt::error naming the key's
// path for every key or value mpopt does not take. The configurations are DeepSpeed's own, copied
// from its documentation pages (deepspeed.ai, the docs/ folder of deepspeedai/DeepSpeed) and unit
// tests, each cited where it is used. The optimizers these make are tested in config_factory.cpp.
#include <doctest/doctest.h>

#include <mpopt/deepspeed_config.hpp>
#include <mpopt/detail/options/schedule_json.hpp>

#include "error_of.hpp"
#include "temp_dir.hpp"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <initializer_list>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace {

using mpopt::config_precision;
using mpopt::config_rule;
using mpopt::config_scaler;
using mpopt::deepspeed_config;

deepspeed_config parse(const std::string& json, int world_size = 1) { return deepspeed_config::parse_text(json, world_size); }

/// The problem of `message` (one, or one line of several) that starts with `path`, or "".
std::string problem_at(const std::string& message, const std::string& path) {
  std::vector<std::string> lines;
  for (std::size_t at = 0; at <= message.size();) {
    const std::size_t end = std::min(message.find('\n', at), message.size());
    lines.push_back(message.substr(at, end - at));
    at = end + 1;
  }
  if (lines.size() == 1) return lines[0].rfind("mpopt: " + path, 0) == 0 ? lines[0] : "";
  for (std::size_t i = 1; i < lines.size(); ++i)
    if (lines[i].rfind("  " + path, 0) == 0) return lines[i];
  return "";
}

/// The configuration is refused with a problem that starts with the key path and says `rest`.
#define CHECK_REFUSED(json, path, rest)                                                   \
  do {                                                                                    \
    const std::string msg_ = error_of([&] { (void)parse(json); });                        \
    INFO("configuration: ", json);                                                        \
    INFO("message: ", msg_);                                                              \
    const std::string problem_ = problem_at(msg_, path);                                  \
    CHECK(!problem_.empty());                                                             \
    CHECK(problem_.find(rest) != std::string::npos);                                      \
  } while (0)

bool ignored(const deepspeed_config& c, const std::string& path) {
  return std::find(c.ignored_keys.begin(), c.ignored_keys.end(), path) != c.ignored_keys.end();
}

/// A complete, valid configuration with one member replaced or added: `section` is a key of the
/// top level, `body` its JSON value.
std::string with(const std::string& section, const std::string& body, const std::string& type = "Adam") {
  std::string s = R"({"optimizer": {"type": ")" + type + R"("})";
  return s + ", \"" + section + "\": " + body + "}";
}
std::string params(const std::string& type, const std::string& body) {
  return R"({"optimizer": {"type": ")" + type + R"(", "params": )" + body + "}}";
}


/// An options table the reader has no code for: read_params_through_table reads its fields from
/// optimizer.params by their names.
struct momentum_options {
  double lr = 0.01;
  double momentum = 0.9;
  bool nesterov = false;
  std::uint32_t warmup = 10;
  double beta1 = 0.5;  // a field DeepSpeed's keys below do not name
  mpopt::compression_options compression = {};
  static constexpr auto fields = mpopt::fields(
      mpopt::field{"lr", &momentum_options::lr, mpopt::checks::rate},
      mpopt::field{"momentum", &momentum_options::momentum, mpopt::checks::beta},
      mpopt::field{"nesterov", &momentum_options::nesterov},
      mpopt::field{"warmup", &momentum_options::warmup, mpopt::checks::at_least(1)},
      mpopt::field{"beta1", &momentum_options::beta1, mpopt::checks::beta},
      mpopt::field{"compression", &momentum_options::compression});
};

momentum_options read_momentum(const std::string& json, std::initializer_list<std::string_view> by_hand = {}) {
  const nlohmann::json j = nlohmann::json::parse(json);
  const mpopt::detail::config_object p(j, "optimizer.params");
  momentum_options o;
  mpopt::detail::read_params_through_table(
      p, {"lr", "momentum", "nesterov", "warmup", "dampening", "exclude_zero_variance", "zero_variance_ratio"},
      "Momentum", mpopt::detail::field_refs(o), by_hand);
  return o;
}

/// Each leaf field of a table (a nested group's by their own names) and its value as text.
void flatten(std::span<const mpopt::detail::field_ref> fields, std::map<std::string, std::string>& out) {
  for (const auto& f : fields) {
    if (f.kind == mpopt::detail::field_kind::group) flatten(f.members(f.at), out);
    else out[std::string(f.name)] = mpopt::detail::field_text(f);
  }
}
template <class O>
std::map<std::string, std::string> flat_fields(const O& o) {
  std::map<std::string, std::string> out;
  flatten(mpopt::detail::field_refs(o), out);
  return out;
}

/// Reads `body` as optimizer.params of `type`, which sets every key DeepSpeed names like a field of
/// the rule's table to a value not the default, and checks each such field holds it. The table's
/// other fields are `by_hand`: a DeepSpeed key maps to them another way (the caller checks those),
/// or, where body does not name them, they are refused as keys.
template <class O>
O every_field_read(const std::string& type, const std::string& body, O deepspeed_config::*rule_options,
                   std::initializer_list<std::string_view> by_hand) {
  INFO("optimizer.type ", type);
  const nlohmann::json j = nlohmann::json::parse(body);
  const O read = parse(params(type, body)).*rule_options;
  const std::map<std::string, std::string> defaults = flat_fields(O{}), values = flat_fields(read);
  for (const auto& field : defaults) {
    const std::string& name = field.first;
    INFO("field ", name);
    if (std::ranges::find(by_hand, name) != by_hand.end()) {
      if (!j.contains(name))
        CHECK_REFUSED(params(type, "{\"" + name + "\": 0}"), "optimizer.params." + name, ": unknown key");
      continue;
    }
    REQUIRE(j.contains(name));  // a field DeepSpeed names the same: the test gives it
    const nlohmann::json& v = j[name];
    const std::string given =
        v.is_boolean() ? (v.get<bool>() ? "true" : "false") : mpopt::detail::shortest_text(v.get<double>());
    CHECK(given != field.second);
    CHECK(values.at(name) == given);
  }
  return read;
}

}  // namespace

TEST_SUITE("config") {
  TEST_CASE("absent keys take DeepSpeed's defaults: fp32, no ZeRO, AdamW as FusedAdam builds it, clipping 1, "
            "buckets of 5e8, one micro-step") {
    const deepspeed_config c = parse(R"({"optimizer": {"type": "Adam"}})");
    CHECK(c.precision == config_precision::fp32);
    CHECK(c.scaler == config_scaler::none);
    CHECK(c.zero_stage == 0);
    CHECK(c.rule == config_rule::adam);
    CHECK(c.adam_options.lr == 1e-3);
    CHECK(c.adam_options.beta1 == 0.9);
    CHECK(c.adam_options.beta2 == 0.999);
    CHECK(c.adam_options.eps == 1e-8);
    CHECK(c.adam_options.weight_decay == 0.0);
    CHECK(c.adam_options.decoupled_weight_decay);  // adam_w_mode defaults to true
    CHECK(c.adam_options.bias_correction);
    CHECK(c.options.clip_grad == 1.0);  // gradient_clipping: 1.0 since DeepSpeed 0.19.3
    CHECK(c.options.accumulation_steps == 1);
    CHECK(c.options.gradient_predivide == 1.0);
    CHECK(c.options.bucket_elements == 500000000);
    CHECK(c.options.combine == mpopt::accumulation::mean);
    CHECK(c.options.skip_nonfinite);
    CHECK(c.ignored_keys.empty());
    CHECK(c.summary() == "fp32, no ZeRO, AdamW");

    // A default-constructed deepspeed_config is the same configuration.
    const deepspeed_config d;
    CHECK(d.options.clip_grad == c.options.clip_grad);
    CHECK(d.options.bucket_elements == c.options.bucket_elements);
    CHECK(d.rule == c.rule);
    CHECK(d.adam_options.decoupled_weight_decay == c.adam_options.decoupled_weight_decay);
  }

  TEST_CASE("config-json, FP16 training options: the documented block is a dynamic scale of 2^16, window 1000, "
            "hysteresis 2, minimum 1") {
    // docs/_pages/config-json.md, "FP16 training options" (fp16_master_weights_and_grads as documented: false).
    const deepspeed_config c = parse(R"({
      "optimizer": {"type": "Adam"},
      "fp16": {
        "enabled": true,
        "auto_cast": false,
        "loss_scale": 0,
        "initial_scale_power": 16,
        "loss_scale_window": 1000,
        "hysteresis": 2,
        "consecutive_hysteresis": false,
        "min_loss_scale": 1,
        "fp16_master_weights_and_grads": false
      }
    })");
    CHECK(c.precision == config_precision::fp16);
    CHECK(c.scaler == config_scaler::dynamic_scale);
    CHECK(c.dynamic_options.init_scale == 65536.0);
    CHECK(c.dynamic_options.window == 1000);
    CHECK(c.dynamic_options.hysteresis == 2);
    CHECK(c.dynamic_options.min_scale == 1.0);
    CHECK_FALSE(c.dynamic_options.consecutive_hysteresis);
    CHECK(c.dynamic_options.on_min_scale == mpopt::at_min_scale::raise);
    CHECK(ignored(c, "fp16.auto_cast"));
    CHECK(c.summary() == "fp16 with a dynamic loss scale, no ZeRO, AdamW");
  }

  TEST_CASE("fp16 keys map one to one; a loss_scale above 0 is a static scale") {
    const deepspeed_config c = parse(with("fp16", R"({"enabled": true, "initial_scale_power": 12, "loss_scale_window": 7,
                                                     "hysteresis": 1, "consecutive_hysteresis": true, "min_loss_scale": 0.25})"));
    CHECK(c.dynamic_options.init_scale == 4096.0);
    CHECK(c.dynamic_options.window == 7);
    CHECK(c.dynamic_options.hysteresis == 1);
    CHECK(c.dynamic_options.consecutive_hysteresis);
    CHECK(c.dynamic_options.min_scale == 0.25);
    // DeepSpeed's unit test of a static scale (tests/unit/runtime/half_precision/test_fp16.py,
    // TestZeroStaticScale): "fp16": {"enabled": true, "loss_scale": 138.}, ZeRO stage 1 and 2.
    for (int stage : {1, 2}) {
      const deepspeed_config s = parse(R"({"train_batch_size": 4, "steps_per_print": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 0.00015}},
        "fp16": {"enabled": true, "loss_scale": 138.0},
        "zero_optimization": {"stage": )" + std::to_string(stage) + "}}");
      CHECK(s.scaler == config_scaler::static_scale);
      CHECK(s.static_options.scale == 138.0);
      CHECK(s.zero_stage == stage);
    }
    // fp16 off: the fp16 values are not used (as in DeepSpeed), only checked for their types.
    const deepspeed_config off = parse(with("fp16", R"({"enabled": false, "loss_scale_window": 0})"));
    CHECK(off.precision == config_precision::fp32);
  }

  TEST_CASE("DeepSpeed's loss-scale unit tests: Lamb in fp16 with initial_scale_power 8 and loss_scale_window 2") {
    // tests/unit/runtime/half_precision/test_dynamic_loss_scale.py, TestUnfused.test_no_overflow.
    const deepspeed_config c = parse(R"({
      "train_batch_size": 1,
      "steps_per_print": 1,
      "optimizer": {"type": "Lamb", "params": {"lr": 0.00015}},
      "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 8, "loss_scale_window": 2}
    })");
    CHECK(c.rule == config_rule::lamb);
    CHECK(c.lamb_options.lr == 0.00015);
    CHECK(c.lamb_options.min_coeff == 0.01);  // FusedLamb's defaults
    CHECK(c.lamb_options.max_coeff == 10.0);
    CHECK(c.lamb_options.bias_correction);
    CHECK_FALSE(c.lamb_options.eps_inside_sqrt);
    CHECK(c.dynamic_options.init_scale == 256.0);
    CHECK(c.dynamic_options.window == 2);
    CHECK(c.options.accumulation_steps == 1);
    CHECK(ignored(c, "steps_per_print"));
  }

  TEST_CASE("config-json, Optimizer Parameters: the Adam example, and adam_w_mode") {
    // docs/_pages/config-json.md, "Example of optimizer with Adam".
    const deepspeed_config c = parse(R"({
      "optimizer": {
        "type": "Adam",
        "params": {
          "lr": 0.001,
          "betas": [0.8, 0.999],
          "eps": 1e-8,
          "weight_decay": 3e-7
        }
      }
    })");
    CHECK(c.adam_options.lr == 0.001);
    CHECK(c.adam_options.beta1 == 0.8);
    CHECK(c.adam_options.beta2 == 0.999);
    CHECK(c.adam_options.eps == 1e-8);
    CHECK(c.adam_options.weight_decay == 3e-7);
    CHECK(c.adam_options.decoupled_weight_decay);
    // "adam_w_mode: Apply L2 regularization (also known as AdamW), default true"; false gives Adam
    // with L2 decay. "AdamW" is decoupled always; torch_adam picks an implementation of the same formula.
    const deepspeed_config l2 = parse(params("Adam", R"({"adam_w_mode": false, "torch_adam": true, "bias_correction": false})"));
    CHECK_FALSE(l2.adam_options.decoupled_weight_decay);
    CHECK_FALSE(l2.adam_options.bias_correction);
    CHECK(ignored(l2, "optimizer.params.torch_adam"));
    CHECK(l2.summary() == "fp32, no ZeRO, Adam (L2 weight decay)");
    const deepspeed_config w = parse(params("AdamW", R"({"adam_w_mode": true, "set_grad_none": true})"));
    CHECK(w.adam_options.decoupled_weight_decay);
    CHECK(w.optimizer_type == "AdamW");
    CHECK(ignored(w, "optimizer.params.set_grad_none"));
    // DeepSpeed compares the names of its own optimizers in lower case.
    CHECK(parse(R"({"optimizer": {"type": "adamw"}})").adam_options.decoupled_weight_decay);
    CHECK(parse(R"({"optimizer": {"type": "LAMB"}})").rule == config_rule::lamb);
  }

  TEST_CASE("config-json: the 1-bit LAMB example; freeze_step F is F - 1 warm-up updates, as in DeepSpeed") {
    // docs/_pages/config-json.md, "Another example of optimizer with 1-bit LAMB".
    const deepspeed_config c = parse(R"({
      "optimizer": {
        "type": "OneBitLamb",
        "params": {
          "lr": 11e-3,
          "weight_decay": 0.01,
          "bias_correction": false,
          "max_coeff": 0.3,
          "min_coeff": 0.01,
          "freeze_step": 1000,
          "cuda_aware": false,
          "comm_backend_name": "nccl",
          "coeff_beta": 0.9,
          "factor_max": 4.0,
          "factor_min": 0.5,
          "factor_threshold": 0.1
        }
      }
    })");
    CHECK(c.rule == config_rule::onebit_lamb);
    const auto& o = c.onebit_lamb_options;
    CHECK(o.lr == 11e-3);
    CHECK(o.weight_decay == 0.01);
    CHECK(o.max_coeff == 0.3);
    CHECK(o.min_coeff == 0.01);
    CHECK(o.freeze_step == 999);  // DeepSpeed's first call only sets up state
    CHECK(o.coeff_beta == 0.9);
    CHECK(o.factor_max == 4.0);
    CHECK(o.factor_min == 0.5);
    CHECK(o.factor_threshold == 0.1);
    CHECK(o.beta1 == 0.9);
    CHECK(o.eps == 1e-8);
    CHECK(ignored(c, "optimizer.params.cuda_aware"));
    CHECK(ignored(c, "optimizer.params.comm_backend_name"));
    // The documented defaults (the table under the example).
    const auto d = parse(R"({"optimizer": {"type": "OneBitLamb"}})").onebit_lamb_options;
    CHECK(d.freeze_step == 99999);
    CHECK(d.max_coeff == 10.0);
    CHECK(d.min_coeff == 0.01);
    CHECK(d.coeff_beta == 0.9);
    CHECK(d.factor_max == 4.0);
    CHECK(d.factor_min == 0.5);
    CHECK(d.factor_threshold == 0.1);
  }

  TEST_CASE("ZeRO tutorial: the stage 1 and stage 2 blocks; overlap_comm is mpopt's, the other scheduling keys change nothing and are listed") {
    // docs/_tutorials/zero.md, "Training a 1.5B Parameter GPT-2 model" and "Training a 10B Parameter GPT-2 model".
    const deepspeed_config one = parse(with("zero_optimization", R"({"stage": 1, "reduce_bucket_size": 5e8})"));
    CHECK(one.zero_stage == 1);
    CHECK(one.options.bucket_elements == 500000000);
    const deepspeed_config two = parse(with("zero_optimization", R"({
        "stage": 2,
        "contiguous_gradients": true,
        "overlap_comm": true,
        "reduce_scatter": true,
        "reduce_bucket_size": 5e8,
        "allgather_bucket_size": 5e8
    })"));
    CHECK(two.zero_stage == 2);
    CHECK(two.options.bucket_elements == 500000000);
    for (const char* key : {"contiguous_gradients", "reduce_scatter", "allgather_bucket_size"})
      CHECK(ignored(two, std::string("zero_optimization.") + key));
    CHECK(two.options.overlap_comm);  // optimizer_options::overlap_comm
    CHECK_FALSE(ignored(two, "zero_optimization.overlap_comm"));
    CHECK_FALSE(one.options.overlap_comm);
    CHECK(two.summary() == "fp32, ZeRO stage 2, AdamW");
    // reduce_bucket_size is mpopt's bucket_elements.
    CHECK(parse(with("zero_optimization", R"({"stage": 2, "reduce_bucket_size": 1000})")).options.bucket_elements == 1000);
  }

  TEST_CASE("Getting Started: the sample configuration; \"zero_optimization\": true is stage 1, as DeepSpeed reads it") {
    // docs/_tutorials/getting-started.md, "DeepSpeed Configuration".
    const deepspeed_config c = parse(R"({
      "train_batch_size": 8,
      "gradient_accumulation_steps": 1,
      "optimizer": {
        "type": "Adam",
        "params": {
          "lr": 0.00015
        }
      },
      "fp16": {
        "enabled": true
      },
      "zero_optimization": true
    })");
    CHECK(c.zero_stage == 1);
    CHECK(c.precision == config_precision::fp16);
    CHECK(c.scaler == config_scaler::dynamic_scale);
    CHECK(c.dynamic_options.init_scale == 65536.0);
    CHECK(c.adam_options.lr == 0.00015);
    CHECK(c.options.accumulation_steps == 1);
    CHECK(parse(with("zero_optimization", "false")).zero_stage == 0);
  }

  TEST_CASE("BERT pre-training tutorial: max_grad_norm is refused naming it; without it the batch sizes give "
            "gradient_accumulation_steps per world size") {
    // docs/_tutorials/bert-pretraining.md, "DeepSpeed JSON Config File".
    const std::string tutorial = R"({
      "train_batch_size": 4096,
      "train_micro_batch_size_per_gpu": 64,
      "steps_per_print": 1000,
      "optimizer": {
        "type": "Adam",
        "params": {
          "lr": 2e-4,
          "max_grad_norm": 1.0,
          "weight_decay": 0.01,
          "bias_correction": false
        }
      },
      "fp16": {
        "enabled": true,
        "loss_scale": 0,
        "initial_scale_power": 16
      }
    })";
    CHECK_REFUSED(tutorial, "optimizer.params.max_grad_norm", "use the top-level gradient_clipping");
    std::string fixed = tutorial;
    fixed.erase(fixed.find(R"("max_grad_norm": 1.0,)"), std::string(R"("max_grad_norm": 1.0,)").size());
    // DeepSpeed: gradient_accumulation_steps = train_batch_size / micro batch / world size.
    const deepspeed_config one = parse(fixed);
    CHECK(one.options.accumulation_steps == 64);
    CHECK(one.accumulation_from_batch_sizes);
    CHECK(one.adam_options.weight_decay == 0.01);
    CHECK_FALSE(one.adam_options.bias_correction);
    CHECK(parse(fixed, 16).options.accumulation_steps == 4);  // the tutorial's 16 GPUs, its --gradient_accumulation_steps 4
    CHECK(parse(fixed, 16).world_size == 16);
    CHECK(parse(fixed, 16).micro_batch_size == 64);
    const std::string msg = error_of([&] { parse(fixed, 3); });
    CHECK(msg.find("train_batch_size: 4096 is not train_micro_batch_size_per_gpu (64) x gradient_accumulation_steps "
                   "x 3 ranks") != std::string::npos);
  }

  TEST_CASE("batch sizes: an explicit gradient_accumulation_steps must agree with them, as DeepSpeed asserts") {
    CHECK(parse(R"({"optimizer": {"type": "Adam"}, "gradient_accumulation_steps": 4})").options.accumulation_steps == 4);
    CHECK_FALSE(parse(R"({"optimizer": {"type": "Adam"}, "gradient_accumulation_steps": 4})").accumulation_from_batch_sizes);
    const std::string three = R"({"optimizer": {"type": "Adam"}, "train_batch_size": 32,
                                  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})";
    CHECK(parse(three, 4).options.accumulation_steps == 2);
    CHECK_FALSE(parse(three, 4).accumulation_from_batch_sizes);
    CHECK_REFUSED(three, "train_batch_size", "32 is not train_micro_batch_size_per_gpu (4) x gradient_accumulation_steps (2) x 1 rank");
    // train_batch_size with gradient_accumulation_steps: the micro-batch must come out whole.
    CHECK(parse(R"({"optimizer": {"type": "Adam"}, "train_batch_size": 12, "gradient_accumulation_steps": 3})")
              .options.accumulation_steps == 3);
    CHECK(parse(R"({"optimizer": {"type": "Adam"}, "train_batch_size": 12, "gradient_accumulation_steps": 3})", 2)
              .micro_batch_size == 2);
    CHECK(parse(R"({"optimizer": {"type": "Adam"}, "train_batch_size": 12})", 4).micro_batch_size == 3);
    CHECK(parse(R"({"optimizer": {"type": "Adam"}})").micro_batch_size == 0);
    CHECK_REFUSED(R"({"optimizer": {"type": "Adam"}, "train_batch_size": 10, "gradient_accumulation_steps": 3})",
                  "train_batch_size", "does not split into gradient_accumulation_steps (3) x 1 rank");
    CHECK_REFUSED(R"({"optimizer": {"type": "Adam"}, "train_batch_size": 4, "train_micro_batch_size_per_gpu": 8})",
                  "train_batch_size", "is not train_micro_batch_size_per_gpu (8)");
    CHECK_REFUSED(with("gradient_accumulation_steps", "0"), "gradient_accumulation_steps", "must be an integer in [1, ");
    CHECK_REFUSED(with("gradient_accumulation_steps", "2.5"), "gradient_accumulation_steps", "must be an integer");
    CHECK_REFUSED(with("train_micro_batch_size_per_gpu", "\"auto\""), "train_micro_batch_size_per_gpu",
                  "\"auto\" is a placeholder that the Hugging Face Trainer fills in");
    CHECK(error_of([] { deepspeed_config::parse_text(R"({"optimizer": {"type": "Adam"}})", 0); })
              .find("world_size must be >= 1") != std::string::npos);
  }

  TEST_CASE("bf16: check_grad_overflow is skip_nonfinite (default true); master weights and state in bf16 are "
            "refused") {
    const deepspeed_config c = parse(with("bf16", R"({"enabled": true})"));
    CHECK(c.precision == config_precision::bf16);
    CHECK(c.scaler == config_scaler::none);
    CHECK(c.options.skip_nonfinite);
    CHECK(c.summary() == "bf16, no ZeRO, AdamW");
    const deepspeed_config unchecked =
        parse(with("bf16", R"({"enabled": true, "check_grad_overflow": false, "immediate_grad_update": true})"));
    CHECK_FALSE(unchecked.options.skip_nonfinite);
    CHECK(ignored(unchecked, "bf16.immediate_grad_update"));
    CHECK(parse(with("bfloat16", R"({"enabled": true})")).precision == config_precision::bf16);  // the old name
    // docs/_pages/config-json.md, "BFLOAT16 training options": the documented block keeps master
    // weights and optimizer states in bf16, which mpopt does not.
    CHECK_REFUSED(with("bf16", R"({"enabled": true, "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true})"),
                  "bf16.bf16_master_weights_and_grads", ": true is not supported (mpopt keeps fp32 master weights)");
    CHECK_REFUSED(with("bf16", R"({"enabled": true, "bf16_optimizer_states": true})"), "bf16.bf16_optimizer_states",
                  "true is not supported");
    CHECK_REFUSED(R"({"optimizer": {"type": "Adam"}, "bf16": {"enabled": true}, "bfloat16": {"enabled": true}})",
                  "bfloat16", "give one of the two");
  }

  TEST_CASE("fp16 and bf16 both enabled are refused") {
    CHECK_REFUSED(R"({"optimizer": {"type": "Adam"}, "fp16": {"enabled": true}, "bf16": {"enabled": true}})",
                  "bf16.enabled", "fp16.enabled is true too");
  }

  TEST_CASE("gradient_clipping, gradient_predivide_factor and the communication keys") {
    CHECK(parse(with("gradient_clipping", "0")).options.clip_grad == 0.0);  // 0 disables clipping
    CHECK(parse(with("gradient_clipping", "0.5")).options.clip_grad == 0.5);
    CHECK(parse(with("gradient_predivide_factor", "8")).options.gradient_predivide == 8.0);
    CHECK(parse(with("prescale_gradients", "false")).options.gradient_predivide == 1.0);
    CHECK(parse(with("communication_data_type", "null")).ignored_keys.empty());
    CHECK(parse(with("communication_data_type", "\"fp32\"")).ignored_keys.empty());
    CHECK(parse(with("gradient_allreduce_op", "\"mean\"")).options.combine == mpopt::accumulation::mean);
    CHECK_REFUSED(with("gradient_clipping", "-1"), "gradient_clipping", "must be >= 0");
    CHECK_REFUSED(with("gradient_clipping", "true"), "gradient_clipping", "must be a number");
    CHECK_REFUSED(with("gradient_predivide_factor", "0"), "gradient_predivide_factor", "must be > 0");
    CHECK_REFUSED(with("prescale_gradients", "true"), "prescale_gradients", "true is not supported");
    CHECK_REFUSED(with("communication_data_type", "\"fp16\""), "communication_data_type", "\"fp16\" is not supported");
    CHECK_REFUSED(with("gradient_allreduce_op", "\"sum\""), "gradient_allreduce_op", "\"sum\" is not supported");
  }

  TEST_CASE("the engine's keys are accepted and listed as ignored") {
    const deepspeed_config c = parse(R"({"optimizer": {"type": "Adam"}, "steps_per_print": 2000, "wall_clock_breakdown": false,
      "zero_allow_untested_optimizer": true, "tensorboard": {"enabled": true, "output_path": "log/"},
      "activation_checkpointing": {"partition_activations": false}})");
    for (const char* key : {"steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer", "tensorboard",
                            "activation_checkpointing"})
      CHECK(ignored(c, key));
    CHECK(c.ignored_keys.size() == 5);
  }

  TEST_CASE("an unknown key is refused naming its path, at every level") {
    CHECK_REFUSED(with("train_batch_sizee", "8"), "train_batch_sizee",
                  ": unknown key (not one of DeepSpeed's: mpopt reads fp16, bf16");
    CHECK_REFUSED(params("Adam", R"({"betaz": [0.9, 0.99]})"), "optimizer.params.betaz",
                  ": unknown key (Adam reads lr, betas, eps");
    CHECK_REFUSED(params("Lamb", R"({"adam_w_mode": true})"), "optimizer.params.adam_w_mode", "unknown key (Lamb reads");
    CHECK_REFUSED(params("AdamW", R"({"freeze_step": 10})"), "optimizer.params.freeze_step", "unknown key (AdamW reads");
    CHECK_REFUSED(with("fp16", R"({"enabled": true, "initial_scale": 16})"), "fp16.initial_scale", ": unknown key");
    CHECK_REFUSED(with("bf16", R"({"enable": true})"), "bf16.enable", ": unknown key");
    CHECK_REFUSED(with("zero_optimization", R"({"stage": 1, "reduce_bucket": 10})"), "zero_optimization.reduce_bucket",
                  ": unknown key");
    CHECK_REFUSED(R"({"optimizer": {"type": "Adam", "param": {}}})", "optimizer.param", ": unknown key");
    CHECK_REFUSED(with("zero_optimization", R"({"offload_optimizer": {"device": "none", "buffer_cnt": 4}})"),
                  "zero_optimization.offload_optimizer.buffer_cnt", ": unknown key");
  }

  TEST_CASE("ZeRO: stage 3, offloading beyond the optimizer's and the other unsupported values are refused naming "
            "the key") {
    CHECK_REFUSED(with("zero_optimization", R"({"stage": 3})"), "zero_optimization.stage",
                  ": 3 is not supported (mpopt has stages 0, 1 and 2");
    CHECK_REFUSED(with("zero_optimization", R"({"stage": 4})"), "zero_optimization.stage", " must be an integer in [0, 3]");
    CHECK_REFUSED(with("zero_optimization", R"({"stage": "2"})"), "zero_optimization.stage", " must be an integer");
    // docs/_tutorials/zero.md, "Offloading to CPU and NVMe with ZeRO-Infinity".
    CHECK_REFUSED(with("zero_optimization", R"({
        "stage": 3,
        "contiguous_gradients": true,
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_prefetch_bucket_size": 1e7,
        "stage3_param_persistence_threshold": 1e5,
        "reduce_bucket_size": 1e7,
        "sub_group_size": 1e9,
        "offload_optimizer": {
            "device": "cpu"
         },
        "offload_param": {
            "device": "cpu"
       }
    })"), "zero_optimization.stage", "3 is not supported");
    // The same file reports its parameter offload as well (stage 3's).
    CHECK_REFUSED(with("zero_optimization", R"({"stage": 3, "offload_param": {"device": "cpu"}})"),
                  "zero_optimization.offload_param.device", "\"cpu\" is not supported (parameter offload is ZeRO stage 3's");
    CHECK_REFUSED(with("zero_optimization", R"({"stage": 2, "offload_param": {"device": "nvme"}})"),
                  "zero_optimization.offload_param.device", "\"nvme\" is not supported");
    CHECK_REFUSED(with("zero_optimization", R"({"stage": 2, "cpu_offload_param": true})"),
                  "zero_optimization.cpu_offload_param", "true is not supported (parameter offload is ZeRO stage 3's)");
    CHECK_REFUSED(with("zero_optimization", R"({"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}})"),
                  "zero_optimization.offload_optimizer.device", "\"nvme\" is not supported (mpopt offloads the optimizer "
                  "to host memory: \"cpu\")");
    CHECK_REFUSED(with("zero_optimization", R"({"stage": 2, "offload_optimizer": {"device": "gpu"}})"),
                  "zero_optimization.offload_optimizer.device", "\"gpu\" is not one of DeepSpeed's (none, cpu, nvme)");
    CHECK_REFUSED(with("zero_optimization", R"({"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.3}})"),
                  "zero_optimization.offload_optimizer.ratio", " must be 1 (offloading part of the state is ZeRO stage "
                  "3's), got 0.3");
    CHECK_REFUSED(with("zero_optimization", R"({"stage": 2, "zenflow": {"topk_ratio": 0.1}})"), "zero_optimization.zenflow",
                  ": not supported (ZenFlow");
    CHECK_REFUSED(with("zero_optimization", R"({"stage": 2, "legacy_stage1": true})"), "zero_optimization.legacy_stage1",
                  "true is not supported");
    const deepspeed_config none = parse(with("zero_optimization", R"({"stage": 2, "offload_optimizer": {"device": "none"}})"));
    CHECK(ignored(none, "zero_optimization.offload_optimizer"));
    CHECK_FALSE(none.offload_optimizer);
    CHECK_REFUSED(with("zero_optimization", R"({"stage": 2, "round_robin_gradients": true})"),
                  "zero_optimization.round_robin_gradients", "true is not supported");
    CHECK_REFUSED(with("zero_optimization", R"({"stage": 2, "load_from_fp32_weights": false})"),
                  "zero_optimization.load_from_fp32_weights", "false is not supported");
    for (const char* size : {"0", "2e9", "1.5", "-4"})
      CHECK_REFUSED(with("zero_optimization", std::string(R"({"stage": 2, "reduce_bucket_size": )") + size + "}"),
                    "zero_optimization.reduce_bucket_size", " must be an integer in [1, 1073741824]");
    // DeepSpeed's unit test: "Allgather bucket 1001 raises" (tests/unit/v1/zero/test_zero.py).
    CHECK_REFUSED(with("zero_optimization", R"({"stage": 2, "allgather_bucket_size": 1001})"),
                  "zero_optimization.allgather_bucket_size", " must be a multiple of 2");
    // Stage-3 keys at stages 0-2: unused by DeepSpeed too.
    const deepspeed_config s3 = parse(with("zero_optimization", R"({"stage": 2, "sub_group_size": 1e9,
                                                                    "stage3_gather_16bit_weights_on_model_save": true})"));
    CHECK(ignored(s3, "zero_optimization.sub_group_size"));
    CHECK(ignored(s3, "zero_optimization.stage3_gather_16bit_weights_on_model_save"));
    for (std::string_view key : mpopt::detail::deepspeed_stage3_keys) {  // each, whatever it holds
      CAPTURE(key);
      const deepspeed_config c =
          parse(with("zero_optimization", R"({"stage": 1, ")" + std::string(key) + R"(": {"any": [1, "thing"]}})"));
      CHECK(ignored(c, "zero_optimization." + std::string(key)));
    }
    CHECK_REFUSED(with("zero_optimization", R"({"stage": 2, "overlap_comm": 1})"), "zero_optimization.overlap_comm",
                  " must be true or false");
  }

  TEST_CASE("fp16 values DeepSpeed refuses, and those mpopt cannot take, are refused naming the key") {
    CHECK_REFUSED(with("fp16", R"({"enabled": true, "loss_scale": true})"), "fp16.loss_scale", " must be a number");
    CHECK_REFUSED(with("fp16", R"({"enabled": true, "loss_scale": -1})"), "fp16.loss_scale",
                  " must be >= 0 (0 enables dynamic loss scaling)");
    CHECK_REFUSED(with("fp16", R"({"enabled": true, "loss_scale": 1e30})"), "fp16.loss_scale", " must be <= 2^64");
    CHECK_REFUSED(with("fp16", R"({"enabled": true, "initial_scale_power": 1.5})"), "fp16.initial_scale_power",
                  " must be an integer in [-126, 64]");
    CHECK_REFUSED(with("fp16", R"({"enabled": true, "initial_scale_power": 65})"), "fp16.initial_scale_power",
                  " must be an integer in [-126, 64]");
    CHECK_REFUSED(with("fp16", R"({"enabled": true, "loss_scale_window": 0})"), "fp16.loss_scale_window",
                  " must be > 0 when dynamic loss scaling is enabled");
    CHECK_REFUSED(with("fp16", R"({"enabled": true, "hysteresis": 0})"), "fp16.hysteresis", " must be > 0");
    CHECK_REFUSED(with("fp16", R"({"enabled": true, "min_loss_scale": 0})"), "fp16.min_loss_scale", " must be > 0");
    CHECK_REFUSED(with("fp16", R"({"enabled": true, "initial_scale_power": 4, "min_loss_scale": 32})"),
                  "fp16.min_loss_scale", " (32) must be <= 2^initial_scale_power (16)");
    CHECK_REFUSED(with("fp16", R"({"enabled": "yes"})"), "fp16.enabled", " must be true or false");
    CHECK_REFUSED(with("fp16", R"({"enabled": true, "fp16_master_weights_and_grads": true})"),
                  "fp16.fp16_master_weights_and_grads", "true is not supported");
    CHECK_REFUSED(with("fp16", "true"), "fp16", " must be a JSON object");
    // A static scale does not use the dynamic keys (DeepSpeed checks them only for the dynamic scale).
    CHECK(parse(with("fp16", R"({"enabled": true, "loss_scale": 512, "loss_scale_window": 0})")).static_options.scale == 512);
  }

  TEST_CASE("optimizer values are refused naming the key path") {
    CHECK_REFUSED(R"({"fp16": {"enabled": true}})", "optimizer", ": missing");
    CHECK_REFUSED(R"({"optimizer": {"params": {"lr": 0.1}}})", "optimizer.type", ": missing");
    CHECK_REFUSED(R"({"optimizer": {"type": "Adagrad"}})", "optimizer.type",
                  ": \"Adagrad\" is not supported (mpopt has Adam, AdamW, Lamb, OneBitLamb, OneBitAdam and ZeroOneAdam)");
    CHECK_REFUSED(R"({"optimizer": {"type": 3}})", "optimizer.type", " must be a string");
    CHECK_REFUSED(R"({"optimizer": {"type": "Adam", "params": [0.1]}})", "optimizer.params", " must be a JSON object");
    CHECK_REFUSED(params("Adam", R"({"lr": -0.1})"), "optimizer.params.lr", " must be >= 0");
    CHECK_REFUSED(params("Adam", R"({"lr": 1e300})"), "optimizer.params.lr", " must be finite as a float");
    CHECK_REFUSED(params("Adam", R"({"lr": "auto"})"), "optimizer.params.lr", ": \"auto\" is a placeholder");
    CHECK_REFUSED(params("Adam", R"({"betas": [0.9]})"), "optimizer.params.betas", " must be a list of two numbers");
    CHECK_REFUSED(params("Adam", R"({"betas": 0.9})"), "optimizer.params.betas", " must be a list of two numbers");
    CHECK_REFUSED(params("Adam", R"({"betas": [0.9, 1.0]})"), "optimizer.params.betas[1]", " must be in [0, 1)");
    CHECK_REFUSED(params("Adam", R"({"betas": ["0.9", 0.99]})"), "optimizer.params.betas[0]", " must be a number");
    CHECK_REFUSED(params("Adam", R"({"eps": 0})"), "optimizer.params.eps", " must be >= ");
    CHECK_REFUSED(params("Adam", R"({"weight_decay": -0.01})"), "optimizer.params.weight_decay", " must be >= 0");
    CHECK_REFUSED(params("Adam", R"({"amsgrad": true})"), "optimizer.params.amsgrad", ": true is not supported");
    CHECK_REFUSED(params("Lamb", R"({"max_grad_norm": 0})"), "optimizer.params.max_grad_norm",
                  "use the top-level gradient_clipping");
    CHECK_REFUSED(params("AdamW", R"({"adam_w_mode": false})"), "optimizer.params.adam_w_mode",
                  ": false contradicts type AdamW");
    CHECK_REFUSED(params("Lamb", R"({"min_coeff": 2, "max_coeff": 1})"), "optimizer.params.min_coeff",
                  " must be <= max_coeff");
    CHECK_REFUSED(params("Lamb", R"({"max_coeff": 0})"), "optimizer.params.max_coeff", " must be > 0");
    CHECK_REFUSED(params("OneBitLamb", R"({"freeze_step": 1})"), "optimizer.params.freeze_step",
                  " must be an integer in [2, ");
    CHECK_REFUSED(params("OneBitLamb", R"({"bias_correction": true})"), "optimizer.params.bias_correction",
                  "1-bit LAMB has no bias correction");
    CHECK_REFUSED(params("OneBitLamb", R"({"eps_inside_sqrt": true})"), "optimizer.params.eps_inside_sqrt",
                  "true is not supported");
    CHECK_REFUSED(params("OneBitLamb", R"({"comm_backend_name": "gloo"})"), "optimizer.params.comm_backend_name",
                  "\"gloo\" is not one of DeepSpeed's");
    CHECK_REFUSED(params("OneBitLamb", R"({"factor_min": 5})"), "optimizer.params.factor_min", " must be <= factor_max");
    CHECK_REFUSED(params("OneBitLamb", R"({"coeff_beta": 1})"), "optimizer.params.coeff_beta", " must be in [0, 1)");
    CHECK_REFUSED(R"({"optimizer": {"type": "OneBitLamb"}, "zero_optimization": {"stage": 1}})", "zero_optimization.stage",
                  ": 1 does not go with optimizer.type OneBitLamb");
    CHECK_REFUSED(params("OneBitAdam", R"({"freeze_step": 0})"), "optimizer.params.freeze_step",
                  " must be an integer in [2, ");
    CHECK_REFUSED(params("OneBitAdam", R"({"bias_correction": true})"), "optimizer.params.bias_correction",
                  "1-bit Adam has no bias correction");
    CHECK_REFUSED(params("OneBitAdam", R"({"factor_max": 4})"), "optimizer.params.factor_max", ": unknown key");
    CHECK_REFUSED(params("OneBitAdam", R"({"amsgrad": true})"), "optimizer.params.amsgrad", ": true is not supported");
    CHECK_REFUSED(R"({"optimizer": {"type": "OneBitAdam"}, "zero_optimization": {"stage": 2}})", "zero_optimization.stage",
                  ": 2 does not go with optimizer.type OneBitAdam");
    CHECK_REFUSED(params("ZeroOneAdam", R"({"var_update_scaler": 0})"), "optimizer.params.var_update_scaler",
                  " must be an integer in [1, ");
    CHECK_REFUSED(params("ZeroOneAdam", R"({"local_step_clipper": 2.5})"), "optimizer.params.local_step_clipper",
                  " must be an integer");
    CHECK_REFUSED(params("ZeroOneAdam", R"({"freeze_step": 10})"), "optimizer.params.freeze_step", ": unknown key");
    CHECK_REFUSED(params("ZeroOneAdam", R"({"comm_backend_name": "gloo"})"), "optimizer.params.comm_backend_name",
                  "\"gloo\" is not one of DeepSpeed's");
    CHECK_REFUSED(R"({"optimizer": {"type": "ZeroOneAdam"}, "zero_optimization": {"stage": 1}})", "zero_optimization.stage",
                  ": 1 does not go with optimizer.type ZeroOneAdam");
  }

  TEST_CASE("optimizer.params are read through the options' table: a field needs no reader code, its check "
            "names the key's path, and a field DeepSpeed does not name is refused as a key") {
    const momentum_options o = read_momentum(R"({"lr": 0.5, "momentum": 0.75, "nesterov": true, "warmup": 7,
        "dampening": 0.1, "exclude_zero_variance": false, "zero_variance_ratio": 0.25})");
    CHECK(o.lr == 0.5);
    CHECK(o.momentum == 0.75);
    CHECK(o.nesterov);
    CHECK(o.warmup == 7);
    CHECK(o.beta1 == 0.5);
    CHECK_FALSE(o.compression.exclude_zero_variance);  // a nested group's fields, by their own names
    CHECK(o.compression.zero_variance_ratio == 0.25);
    CHECK(read_momentum(R"({"warmup": 7})", {"warmup"}).warmup == 10);  // mapped by the rule's own code
    const auto refused = [](const std::string& json) { return error_of([&] { read_momentum(json); }); };
    CHECK(refused(R"({"momentum": 1})") == "mpopt: optimizer.params.momentum must be in [0, 1), got 1");
    CHECK(refused(R"({"warmup": 0})") == "mpopt: optimizer.params.warmup must be an integer in [1, 4294967295], got 0");
    CHECK(refused(R"({"warmup": 4294967296})").find("must be an integer in [1, 4294967295]") != std::string::npos);
    CHECK(refused(R"({"nesterov": 1})") == "mpopt: optimizer.params.nesterov must be true or false, got 1");
    CHECK(refused(R"({"zero_variance_ratio": 1})").find("optimizer.params.zero_variance_ratio must be in [0, 1)") !=
          std::string::npos);
    CHECK(refused(R"({"beta1": 0.1})").rfind("mpopt: optimizer.params.beta1: unknown key (Momentum reads lr, ", 0) == 0);
  }

  TEST_CASE("every field of each rule's table that DeepSpeed names the same is read from optimizer.params; the "
            "others are mapped by hand or refused as keys") {
    const std::string common = R"("lr": 0.02, "betas": [0.5, 0.6], "eps": 1e-6, "weight_decay": 0.1)";
    const std::string compression =
        R"("compression_scale": "global", "exclude_zero_variance": false, "zero_variance_ratio": 0.01)";
    const auto betas_read = [](const auto& o) { return o.beta1 == 0.5 && o.beta2 == 0.6; };

    const auto adam = every_field_read("Adam", "{" + common + R"(, "bias_correction": false, "adam_w_mode": false})",
                                       &deepspeed_config::adam_options, {"beta1", "beta2", "decoupled_weight_decay"});
    CHECK(betas_read(adam));
    CHECK_FALSE(adam.decoupled_weight_decay);

    const auto lamb = every_field_read(
        "Lamb", "{" + common + R"(, "bias_correction": false, "eps_inside_sqrt": true, "max_coeff": 5, "min_coeff": 0.05})",
        &deepspeed_config::lamb_options, {"beta1", "beta2"});
    CHECK(betas_read(lamb));

    const auto onebit_lamb = every_field_read(
        "OneBitLamb", "{" + common + R"(, "max_coeff": 5, "min_coeff": 0.05, "freeze_step": 50, "coeff_beta": 0.8,
                      "factor_max": 3, "factor_min": 0.25, "factor_threshold": 0.2, )" + compression + "}",
        &deepspeed_config::onebit_lamb_options, {"beta1", "beta2", "freeze_step", "scale"});
    CHECK(betas_read(onebit_lamb));
    CHECK(onebit_lamb.freeze_step == 49);
    CHECK(onebit_lamb.compression.scale == mpopt::compression_scale::global);

    const auto onebit_adam = every_field_read("OneBitAdam", "{" + common + R"(, "freeze_step": 50, )" + compression + "}",
                                              &deepspeed_config::onebit_adam_options,
                                              {"beta1", "beta2", "freeze_step", "scale"});
    CHECK(betas_read(onebit_adam));
    CHECK(onebit_adam.freeze_step == 49);
    CHECK(onebit_adam.compression.scale == mpopt::compression_scale::global);

    const auto zero_one_adam = every_field_read(
        "ZeroOneAdam", "{" + common + R"(, "var_freeze_step": 1000, "var_update_scaler": 8, "local_step_scaler": 1000,
                       "local_step_clipper": 4, )" + compression + "}",
        &deepspeed_config::zero_one_adam_options, {"beta1", "beta2", "scale"});
    CHECK(betas_read(zero_one_adam));
    CHECK(zero_one_adam.compression.scale == mpopt::compression_scale::global);

    CHECK_REFUSED(params("OneBitAdam", R"({"compression_scale": "per_rank"})"), "optimizer.params.compression_scale",
                  R"( must be one of "per_tensor", "global", got "per_rank")");
    CHECK_REFUSED(params("ZeroOneAdam", R"({"zero_variance_ratio": 1})"), "optimizer.params.zero_variance_ratio",
                  " must be in [0, 1), got 1");
    CHECK_REFUSED(params("ZeroOneAdam", R"({"var_freeze_step": 9007199254740993})"), "optimizer.params.var_freeze_step",
                  " must be an integer in [0, 9007199254740992]");
  }

  TEST_CASE("config-json: 1-bit Adam and 0/1 Adam with DeepSpeed's defaults; freeze_step F is F - 1 warm-up updates, "
            "var_freeze_step V is V updates, as in DeepSpeed") {
    const deepspeed_config a = parse(R"({"optimizer": {"type": "OneBitAdam", "params": {"lr": 2e-4, "freeze_step": 23000,
                                                                                          "cuda_aware": false}}})");
    CHECK(a.rule == config_rule::onebit_adam);
    CHECK(a.onebit_adam_options.lr == 2e-4);
    CHECK(a.onebit_adam_options.freeze_step == 22999);
    CHECK(ignored(a, "optimizer.params.cuda_aware"));
    const auto da = parse(R"({"optimizer": {"type": "onebitadam"}})").onebit_adam_options;
    CHECK(da.freeze_step == 99999);
    CHECK(da.lr == 1e-3);
    CHECK(da.beta2 == 0.999);
    CHECK(da.weight_decay == 0.0);

    const deepspeed_config z = parse(R"({"optimizer": {"type": "ZeroOneAdam", "params": {"var_freeze_step": 1000,
      "var_update_scaler": 16, "local_step_scaler": 1000, "local_step_clipper": 16, "betas": [0.8, 0.99]}}})");
    CHECK(z.rule == config_rule::zero_one_adam);
    CHECK(z.zero_one_adam_options.var_freeze_step == 1000);
    CHECK(z.zero_one_adam_options.local_step_scaler == 1000);
    CHECK(z.zero_one_adam_options.beta1 == 0.8);
    CHECK(z.summary() == "fp32, no ZeRO, ZeroOneAdam");
    const auto dz = parse(R"({"optimizer": {"type": "ZeroOneAdam"}})").zero_one_adam_options;
    CHECK(dz.var_freeze_step == 100000);
    CHECK(dz.var_update_scaler == 16);
    CHECK(dz.local_step_scaler == 32678);
    CHECK(dz.local_step_clipper == 16);
  }

  TEST_CASE("config-json: the scheduler example is read, with DeepSpeed's defaults for absent keys") {
    // docs/_pages/config-json.md, "Example of scheduler".
    const deepspeed_config c = parse(with("scheduler", R"({
        "type": "WarmupLR",
        "params": {
            "warmup_min_lr": 0,
            "warmup_max_lr": 0.001,
            "warmup_num_steps": 1000
        }
    })"));
    REQUIRE(c.schedule);
    const auto& w = std::get<mpopt::warmup_lr>(*c.schedule);
    CHECK(w.warmup_min_lr == 0.0);
    CHECK(w.warmup_max_lr == 0.001);
    CHECK(w.warmup_num_steps == 1000);
    CHECK(w.warmup_type == mpopt::warmup_shape::log);
    CHECK(c.summary() == "fp32, no ZeRO, AdamW, WarmupLR");
    CHECK_FALSE(parse(with("gradient_clipping", "1.0")).schedule);
    CHECK_FALSE(parse(with("scheduler", "null")).schedule);

    // Absent keys: the constructors' defaults in deepspeed/runtime/lr_schedules.py (warmup_max_lr
    // None: each group's rate).
    const auto d = std::get<mpopt::warmup_lr>(*parse(with("scheduler", R"({"type": "WarmupLR"})")).schedule);
    CHECK(d.warmup_min_lr == 0.0);
    CHECK_FALSE(d.warmup_max_lr);
    CHECK(d.warmup_num_steps == 1000);
    const auto n = std::get<mpopt::warmup_lr>(
        *parse(with("scheduler", R"({"type": "WarmupLR", "params": {"warmup_max_lr": null}})")).schedule);
    CHECK_FALSE(n.warmup_max_lr);
    const auto dd = std::get<mpopt::warmup_decay_lr>(
        *parse(with("scheduler", R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 10}})")).schedule);
    CHECK(dd.warmup_max_lr == 0.001);
    CHECK(dd.warmup_num_steps == 1000);
    const auto dc = std::get<mpopt::warmup_cosine_lr>(
        *parse(with("scheduler", R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 10}})")).schedule);
    CHECK(dc.warmup_min_ratio == 0.0);
    CHECK(dc.cos_min_ratio == 0.0001);
    CHECK(dc.warmup_num_steps == 1000);
    const auto dy = std::get<mpopt::one_cycle>(*parse(with("scheduler", R"({"type": "OneCycle", "params":
        {"cycle_min_lr": 0.0001, "cycle_max_lr": 0.01}})")).schedule);
    CHECK(dy.cycle_first_step_size == 2000);
    CHECK_FALSE(dy.cycle_second_step_size);
    CHECK(dy.cycle_momentum);
    CHECK(dy.cycle_min_mom == 0.8);
    CHECK(dy.cycle_max_mom == 0.9);
  }

  TEST_CASE("scheduler: every key of each DeepSpeed schedule is read") {
    const auto decay = std::get<mpopt::warmup_decay_lr>(*parse(with("scheduler", R"({"type": "WarmupDecayLR", "params":
        {"total_num_steps": 5000, "warmup_min_lr": 1e-6, "warmup_max_lr": 3e-4, "warmup_num_steps": 250,
         "warmup_type": "linear", "last_batch_iteration": -1}})")).schedule);
    CHECK(decay.total_num_steps == 5000);
    CHECK(decay.warmup_min_lr == 1e-6);
    CHECK(decay.warmup_max_lr == 3e-4);
    CHECK(decay.warmup_num_steps == 250);
    CHECK(decay.warmup_type == mpopt::warmup_shape::linear);
    const auto cosine = std::get<mpopt::warmup_cosine_lr>(*parse(with("scheduler", R"({"type": "WarmupCosineLR",
        "params": {"total_num_steps": 3000, "warmup_min_ratio": 0.1, "warmup_num_steps": 100, "cos_min_ratio": 0.05,
                   "warmup_type": "log"}})")).schedule);
    CHECK(cosine.total_num_steps == 3000);
    CHECK(cosine.warmup_min_ratio == 0.1);
    CHECK(cosine.warmup_num_steps == 100);
    CHECK(cosine.cos_min_ratio == 0.05);
    CHECK(cosine.warmup_type == mpopt::warmup_shape::log);
    const auto cycle = std::get<mpopt::one_cycle>(*parse(with("scheduler", R"({"type": "OneCycle", "params": {
        "cycle_min_lr": 2e-5, "cycle_max_lr": 3e-3, "decay_lr_rate": 0.5, "cycle_first_step_size": 700,
        "cycle_second_step_size": 1300, "cycle_first_stair_count": 7, "cycle_second_stair_count": 5,
        "decay_step_size": 100, "cycle_momentum": false, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95,
        "decay_mom_rate": 0.0}})")).schedule);
    CHECK(cycle.cycle_min_lr == 2e-5);
    CHECK(cycle.cycle_max_lr == 3e-3);
    CHECK(cycle.decay_lr_rate == 0.5);
    CHECK(cycle.cycle_first_step_size == 700);
    CHECK(cycle.cycle_second_step_size == 1300);
    CHECK(cycle.cycle_first_stair_count == 7);
    CHECK(cycle.cycle_second_stair_count == 5);
    CHECK(cycle.decay_step_size == 100);
    CHECK_FALSE(cycle.cycle_momentum);
    CHECK(cycle.cycle_min_mom == 0.85);
    CHECK(cycle.cycle_max_mom == 0.95);
  }

  TEST_CASE("scheduler: what mpopt does not take is refused, naming the key") {
    auto scheduler = [](const std::string& body) { return with("scheduler", body); };
    CHECK_REFUSED(scheduler(R"({"params": {}})"), "scheduler.type", ": required");
    CHECK_REFUSED(scheduler(R"({"type": "WarmupLR", "param": {}})"), "scheduler.param", ": unknown key (mpopt reads type, params)");
    CHECK_REFUSED(scheduler(R"({"type": "StepLR", "params": {"step_size": 10}})"), "scheduler.type",
                  "\"StepLR\" is not a schedule mpopt reads here (DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR and "
                  "OneCycle; torch.optim's schedulers are not read");
    CHECK_REFUSED(scheduler(R"({"type": "step_decay", "params": {"step_size": 10}})"), "scheduler.type",
                  "mpopt::cosine_with_warmup, linear_with_warmup and step_decay are set in code");
    CHECK_REFUSED(scheduler(R"({"type": "LRRangeTest"})"), "scheduler.type", "a range test");
    CHECK_REFUSED(scheduler(R"({"type": "WarmupLR", "params": {"warmup_num_step": 10}})"),
                  "scheduler.params.warmup_num_step",
                  ": unknown key (WarmupLR reads warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type, "
                  "last_batch_iteration)");
    CHECK_REFUSED(scheduler(R"({"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}})"),
                  "scheduler.params.warmup_num_steps", "\"auto\" is a placeholder");
    CHECK_REFUSED(scheduler(R"({"type": "WarmupLR", "params": {"warmup_max_lr": [0.001, 0.002]}})"),
                  "scheduler.params.warmup_max_lr", "a list (a value per group) is not supported");
    CHECK_REFUSED(scheduler(R"({"type": "WarmupLR", "params": {"last_batch_iteration": 99}})"),
                  "scheduler.params.last_batch_iteration", "only -1 (the start) is supported");
    CHECK_REFUSED(scheduler(R"({"type": "WarmupLR", "params": {"warmup_type": "exp"}})"), "scheduler.params.warmup_type",
                  " must be \"log\" or \"linear\", got \"exp\"");
    CHECK_REFUSED(scheduler(R"({"type": "WarmupLR", "params": {"warmup_num_steps": 1.5}})"),
                  "scheduler.params.warmup_num_steps", " must be an integer");
    CHECK_REFUSED(scheduler(R"({"type": "WarmupLR", "params": {"warmup_min_lr": "0"}})"), "scheduler.params.warmup_min_lr",
                  " must be a number");
    CHECK_REFUSED(scheduler(R"({"type": "OneCycle", "params": {"cycle_momentum": 1, "cycle_min_lr": 0, "cycle_max_lr": 1}})"),
                  "scheduler.params.cycle_momentum", " must be true or false");
    // Values out of range: the schedule's own checks (lr_schedule.hpp validate), under the block's path.
    CHECK_REFUSED(scheduler(R"({"type": "WarmupLR", "params": {"warmup_num_steps": 0}})"), "scheduler",
                  ": WarmupLR.warmup_num_steps must be in [1, ");
    CHECK_REFUSED(scheduler(R"({"type": "WarmupDecayLR"})"), "scheduler", ": WarmupDecayLR.total_num_steps");
    CHECK_REFUSED(scheduler(R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "cos_min_ratio": 2}})"),
                  "scheduler", ": WarmupCosineLR.cos_min_ratio");
    CHECK_REFUSED(scheduler(R"({"type": "OneCycle", "params": {"cycle_max_lr": 0.01}})"), "scheduler",
                  ": OneCycle: cycle_min_lr and cycle_max_lr are required");
    CHECK_REFUSED(scheduler(R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
                  "decay_mom_rate": 0.1}})"), "scheduler", ": OneCycle.decay_mom_rate");
    CHECK_REFUSED(scheduler("[]"), "scheduler", " must be a JSON object");
  }

  TEST_CASE("a schedule as checkpoints write it reads back the same, for every type, optional fields set or not") {
    const std::vector<mpopt::lr_schedule> schedules = {
        mpopt::warmup_lr{},
        mpopt::warmup_lr{.warmup_min_lr = 1e-7, .warmup_max_lr = 0.1 + 0.2, .warmup_num_steps = 3,
                         .warmup_type = mpopt::warmup_shape::linear},
        mpopt::warmup_decay_lr{.total_num_steps = 123456789, .warmup_max_lr = 1.0 / 3},
        mpopt::warmup_cosine_lr{.total_num_steps = 7, .warmup_min_ratio = 0.3, .cos_min_ratio = 1.0 / 7},
        mpopt::one_cycle{.cycle_min_lr = 1e-5, .cycle_max_lr = 2e-3},
        mpopt::one_cycle{.cycle_min_lr = 0.0, .cycle_max_lr = 1e-3, .decay_lr_rate = 0.25, .cycle_first_step_size = 33.5,
                         .cycle_second_step_size = 17, .cycle_first_stair_count = 3, .cycle_second_stair_count = 0,
                         .decay_step_size = 9, .cycle_momentum = false},
        mpopt::cosine_with_warmup{.warmup_steps = 5, .total_steps = 50, .min_ratio = 0.1},
        mpopt::linear_with_warmup{.warmup_steps = 0, .total_steps = 9},
        mpopt::step_decay{.step_size = 30, .gamma = 0.5}};
    for (const auto& s : schedules) {
      CAPTURE(mpopt::schedule_name(s));
      const nlohmann::json j = nlohmann::json::parse(mpopt::detail::schedule_json(s).dump());
      const mpopt::lr_schedule back =
          mpopt::detail::read_schedule(mpopt::detail::config_object(j, "lr_schedule"), mpopt::detail::schedule_source::checkpoint);
      CHECK(back.index() == s.index());
      CHECK(mpopt::detail::schedule_settings(back) == mpopt::detail::schedule_settings(s));
    }
    // The settings name every field, so schedules that differ in one differ in it.
    CHECK(mpopt::detail::schedule_settings(mpopt::warmup_lr{.warmup_num_steps = 10}) !=
          mpopt::detail::schedule_settings(mpopt::warmup_lr{.warmup_num_steps = 11}));
    CHECK(mpopt::detail::schedule_settings(std::nullopt).front().second == "none");
  }

  /// The Hugging Face Trainer's stock ZeRO-2 file (transformers' docs, "ZeRO-2 example"), with
  /// nine "auto" values and two misspelt keys (overlap_com, steps_per_prnt).
  const char* const hf_zero2 = R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                  "warmup_num_steps": "auto", "total_num_steps": 1000}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                          "allgather_partitions": true, "allgather_bucket_size": 2e8, "overlap_com": true,
                          "reduce_scatter": true, "reduce_bucket_size": 2e8, "contiguous_gradients": true},
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "steps_per_prnt": 2000,
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": false
  })";

  /// What the Trainer would fill in for those nine.
  nlohmann::json hf_auto_values() {
    return {{"fp16.enabled", true},
            {"optimizer.params.lr", 3e-4},
            {"optimizer.params.betas", {0.9, 0.95}},
            {"optimizer.params.eps", 1e-8},
            {"optimizer.params.weight_decay", 0.01},
            {"scheduler.params.warmup_min_lr", 0},
            {"scheduler.params.warmup_max_lr", 3e-4},
            {"scheduler.params.warmup_num_steps", 100},
            {"train_micro_batch_size_per_gpu", 8},
            {"bf16.enabled", false}};  // a key the file lacks: passed over, as the Trainer does
  }

  TEST_CASE("one run reports every problem of a file: nine \"auto\" values and two typos, eleven lines") {
    const std::string msg = error_of([&] { (void)parse(hf_zero2); });
    INFO(msg);
    CHECK(msg.rfind("mpopt: 11 problems:\n", 0) == 0);
    CHECK(std::count(msg.begin(), msg.end(), '\n') == 11);
    for (const char* path : {"fp16.enabled", "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps",
                             "optimizer.params.weight_decay", "scheduler.params.warmup_min_lr",
                             "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
                             "train_micro_batch_size_per_gpu"}) {
      CAPTURE(path);
      CHECK(problem_at(msg, path).find(": \"auto\" is a placeholder") != std::string::npos);
    }
    CHECK(problem_at(msg, "zero_optimization.overlap_com").find(": unknown key (mpopt reads stage") != std::string::npos);
    CHECK(problem_at(msg, "steps_per_prnt").find(": unknown key (not one of DeepSpeed's") != std::string::npos);

    // The values from code: the typos are left, reported together.
    const std::string left = error_of([&] { (void)deepspeed_config::parse_text(hf_zero2, 1, hf_auto_values()); });
    INFO(left);
    CHECK(left.rfind("mpopt: 2 problems:\n", 0) == 0);
    CHECK(!problem_at(left, "zero_optimization.overlap_com").empty());
    CHECK(!problem_at(left, "steps_per_prnt").empty());

    // Typos mended, the file runs as the Trainer would make it.
    std::string mended = hf_zero2;
    mended.replace(mended.find("overlap_com"), 11, "overlap_comm");
    mended.replace(mended.find("steps_per_prnt"), 14, "steps_per_print");
    const deepspeed_config c = deepspeed_config::parse_text(mended, 1, hf_auto_values());
    CHECK(c.precision == config_precision::fp16);
    CHECK(c.adam_options.lr == 3e-4);
    CHECK(c.adam_options.beta2 == 0.95);
    CHECK(c.adam_options.weight_decay == 0.01);
    CHECK(c.micro_batch_size == 8);
    CHECK(c.offload_optimizer);
    CHECK(c.options.overlap_comm);
    const auto& w = std::get<mpopt::warmup_decay_lr>(*c.schedule);
    CHECK(w.warmup_max_lr == 3e-4);
    CHECK(w.warmup_num_steps == 100);
    CHECK(c.summary() == "fp16 with a dynamic loss scale, ZeRO stage 2, AdamW, optimizer state in host memory "
                         "(offload_optimizer), WarmupDecayLR");
  }

  TEST_CASE("auto_values: only \"auto\" is filled; another value must match; a malformed set is refused") {
    const std::string msg = error_of([&] {
      (void)deepspeed_config::parse_text(with("gradient_clipping", "1.0"), 1, {{"gradient_clipping", 0.5}});
    });
    CHECK(msg == "mpopt: gradient_clipping: the configuration says 1.0, auto_values 0.5 (auto_values fills in only "
                 "\"auto\")");
    // The same value is no conflict, and a path through a non-object is passed over.
    CHECK(deepspeed_config::parse_text(with("gradient_clipping", "0.5"), 1,
                                       {{"gradient_clipping", 0.5}, {"gradient_clipping.x", 1}})
              .options.clip_grad == 0.5);
    CHECK(error_of([&] { (void)deepspeed_config::parse_text(with("gradient_clipping", "1.0"), 1, nlohmann::json::array()); })
              .find("auto_values must be a JSON object") != std::string::npos);
    // A value filled in is read like one written: its checks still apply.
    CHECK_REFUSED(std::string(R"({"optimizer": {"type": "Adam", "params": {"lr": "auto"}}})"), "optimizer.params.lr",
                  "\"auto\" is a placeholder");
    const std::string bad = error_of([&] {
      (void)deepspeed_config::parse_text(R"({"optimizer": {"type": "Adam", "params": {"lr": "auto"}}})", 1,
                                         {{"optimizer.params.lr", -1}});
    });
    CHECK(bad.find("optimizer.params.lr must be >= 0") != std::string::npos);
  }

  TEST_CASE("every engine key is accepted and listed, or refused where it asks what mpopt does not do") {
    using mpopt::detail::engine_key_use;
    for (const auto& k : mpopt::detail::deepspeed_engine_keys) {
      CAPTURE(k.key);
      const std::string key(k.key);
      if (k.use == engine_key_use::ignored) {
        CHECK(ignored(parse(with(key, R"({"enabled": true, "anything": [1]})")), key));
        CHECK(ignored(parse(with(key, "7")), key));
      } else {
        const bool off_refused = k.use == engine_key_use::refused_when_off;
        CHECK(ignored(parse(with(key, off_refused ? "true" : "false")), key));
        CHECK_REFUSED(with(key, off_refused ? "false" : "true"), key, std::string(" is not supported (") + std::string(k.why));
        if (!off_refused) {
          CHECK(ignored(parse(with(key, R"({"enabled": false, "opt_level": "O1"})")), key));
          CHECK_REFUSED(with(key, R"({"enabled": true, "opt_level": "O1"})"), key + ".enabled", ": true is not supported");
        }
      }
    }
    // Those an outside user found refused as unknown.
    CHECK_REFUSED(with("amp", R"({"enabled": true, "opt_level": "O2"})"), "amp.enabled",
                  ": true is not supported (Apex AMP casts the model");
    CHECK_REFUSED(with("elasticity", R"({"enabled": true, "max_train_batch_size": 2000, "micro_batch_sizes": [2, 4]})"),
                  "elasticity.enabled", "elastic training derives the batch sizes");
    CHECK(ignored(parse(with("compile", R"({"deepcompile": false})")), "compile"));
    CHECK(ignored(parse(with("zero_optimization", R"({"stage": 2, "ignore_unused_parameters": true})")),
                  "zero_optimization.ignore_unused_parameters"));
    const deepspeed_config dt = parse(with("data_types", R"({"grad_accum_dtype": "fp32", "buffer_dtype": "bf16"})"));
    CHECK(ignored(dt, "data_types.buffer_dtype"));
    CHECK(parse(with("data_types", R"({"grad_accum_dtype": "torch.float32"})")).precision == config_precision::fp32);
    CHECK_REFUSED(with("data_types", R"({"grad_accum_dtype": "bf16"})"), "data_types.grad_accum_dtype",
                  "\"bf16\" is not supported (mpopt sums micro-steps' gradients in fp32)");
    CHECK_REFUSED(with("data_types", R"({"grad_accum_dtype": "fp64"})"), "data_types.grad_accum_dtype",
                  "\"fp64\" is not one of DeepSpeed's types");
    CHECK(parse(R"({"optimizer": {"type": "Adam"}, "bf16": {"enabled": true}, "data_types": {"param_dtype": "bfloat16"}})")
              .precision == config_precision::bf16);
    CHECK_REFUSED(with("data_types", R"({"param_dtype": "fp16"})"), "data_types.param_dtype",
                  "\"fp16\" is not the parameters' type, fp32");
    CHECK_REFUSED(with("data_types", R"({"grad_accum": "fp32"})"), "data_types.grad_accum", ": unknown key");
  }

  TEST_CASE("docs/deepspeed-config.md names every key the reader takes as the engine's or stage 3's") {
    std::ifstream in(std::string(MPOPT_DOCS_DIR) + "/deepspeed-config.md");
    REQUIRE(in);
    const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (const auto& k : mpopt::detail::deepspeed_engine_keys) {
      CAPTURE(k.key);
      CHECK(page.find("| `" + std::string(k.key) + "` |") != std::string::npos);
      CHECK(page.find(std::string(k.why)) != std::string::npos);
    }
    for (std::string_view key : mpopt::detail::deepspeed_stage3_keys) {
      CAPTURE(key);
      CHECK(page.find("`" + std::string(key) + "`") != std::string::npos);
    }
  }

  TEST_CASE("offload_optimizer.device cpu is read: the optimizer state in host memory") {
    const deepspeed_config c = parse(with("zero_optimization", R"({"stage": 2, "offload_optimizer": {"device": "cpu",
        "pin_memory": true, "pipeline_read": false, "buffer_count": 4}})"));
    CHECK(c.offload_optimizer);
    CHECK(c.zero_stage == 2);
    CHECK(ignored(c, "zero_optimization.offload_optimizer.pin_memory"));
    CHECK(ignored(c, "zero_optimization.offload_optimizer.buffer_count"));
    CHECK(c.summary().find("optimizer state in host memory (offload_optimizer)") != std::string::npos);
    CHECK(parse(with("zero_optimization", R"({"stage": 1, "cpu_offload": true})")).offload_optimizer);  // the old name
    CHECK_FALSE(parse(with("zero_optimization", R"({"stage": 1})")).offload_optimizer);
  }

  TEST_CASE("JSON text: not an object, not JSON, or a key given twice is refused") {
    CHECK_REFUSED("[]", "the configuration", " must be a JSON object");
    CHECK(error_of([] { parse(R"({"optimizer": {"type": "Adam"})"); }).find("not valid JSON") != std::string::npos);
    CHECK_REFUSED(R"({"optimizer": {"type": "Adam"}, "fp16": {"enabled": true, "enabled": false}})", "fp16.enabled",
                  ": given twice");
    CHECK_REFUSED(R"({"optimizer": {"type": "Adam", "params": {"lr": 0.1}}, "optimizer": {"type": "Lamb"}})", "optimizer",
                  ": given twice");
  }

  TEST_CASE("read(): a file's messages start with its name; a missing file is named") {
    temp_dir dir;
    const auto good = dir / "good.json", bad = dir / "bad.json";
    std::ofstream(good) << R"({"optimizer": {"type": "Lamb"}, "zero_optimization": {"stage": 2}})";
    std::ofstream(bad) << R"({"optimizer": {"type": "Lamb"}, "zero_optimization": {"stage": 3}})";
    const deepspeed_config c = deepspeed_config::read(good);
    CHECK(c.rule == config_rule::lamb);
    CHECK(c.zero_stage == 2);
    const std::string msg = error_of([&] { deepspeed_config::read(bad); });
    CHECK(msg.rfind("mpopt: " + bad.string() + ": zero_optimization.stage: 3 is not supported", 0) == 0);
    const std::string missing = error_of([&] { deepspeed_config::read(dir / "none.json"); });
    CHECK(missing.find("cannot open the DeepSpeed configuration") != std::string::npos);
    CHECK(missing.find("none.json") != std::string::npos);
  }
}
