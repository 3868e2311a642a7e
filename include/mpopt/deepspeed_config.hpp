// mpopt — the optimizer part of a DeepSpeed configuration (its JSON schema, deepspeed.ai/docs/config-json),
// read into a plain struct: precision, loss scaler, ZeRO stage, update rule and every option, with
// DeepSpeed's defaults where a key is absent. Every key is either read, or accepted as one that
// changes nothing here (listed in ignored_keys), or refused with an mpopt::error naming its path;
// a value mpopt does not support is refused the same way. make_optimizer.hpp builds the optimizer.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "adam.hpp"
#include "detail/field_refs.hpp"
#include "detail/config_object.hpp"
#include "detail/json_fields.hpp"
#include "detail/validate.hpp"
#include "error.hpp"
#include "lamb.hpp"
#include "loss_scale.hpp"
#include "onebit_adam_options.hpp"
#include "onebit_lamb_options.hpp"
#include "options.hpp"
#include "zero_one_adam_options.hpp"

namespace mpopt {

enum class config_precision { fp32, fp16, bf16 };
enum class config_scaler { none, static_scale, dynamic_scale };
enum class config_rule { adam, lamb, onebit_lamb, onebit_adam, zero_one_adam };

/// What a DeepSpeed configuration asks of the optimizer. Default-constructed, it is what DeepSpeed
/// makes of {"optimizer": {"type": "Adam"}}: fp32, no ZeRO, AdamW with FusedAdam's defaults,
/// gradient clipping at 1 and buckets of 5e8 elements.
struct deepspeed_config {
  config_precision precision = config_precision::fp32;
  config_scaler scaler = config_scaler::none;
  static_scale_options static_options;    ///< fp16.loss_scale > 0
  dynamic_scale_options dynamic_options;  ///< fp16.loss_scale = 0: 2^initial_scale_power, window, ...
  int zero_stage = 0;                     ///< 0 replicated, 1 zero1, 2 zero2
  config_rule rule = config_rule::adam;
  std::string optimizer_type = "Adam";    ///< optimizer.type as written
  adam::options adam_options;             ///< Adam and AdamW (the one `rule` names is used)
  lamb::options lamb_options;
  mpopt::onebit_lamb_options onebit_lamb_options;
  mpopt::onebit_adam_options onebit_adam_options;
  mpopt::zero_one_adam_options zero_one_adam_options;
  /// The step pipeline's options: gradient_clipping, gradient_accumulation_steps,
  /// gradient_predivide_factor, zero_optimization.reduce_bucket_size, bf16.check_grad_overflow.
  optimizer_options options{.clip_grad = 1.0, .bucket_elements = 500000000};
  /// The ranks it was read for, and whether gradient_accumulation_steps came from the batch sizes
  /// (train_batch_size / (train_micro_batch_size_per_gpu x ranks)), which then holds for those only.
  int world_size = 1;
  bool accumulation_from_batch_sizes = false;
  /// For the engine that reads this configuration (the optimizer does not use it): samples per
  /// rank and micro-step, train_micro_batch_size_per_gpu or what DeepSpeed derives from
  /// train_batch_size; 0 when neither is given.
  int micro_batch_size = 0;
  /// Keys the file has that change nothing in mpopt (the engine's, and choices mpopt makes one way
  /// whatever they say), by path, in the order read: a caller can show them.
  std::vector<std::string> ignored_keys;

  /// Reads a parsed configuration. `world_size`: the data-parallel ranks, which DeepSpeed divides
  /// train_batch_size by. Throws mpopt::error naming the first key it cannot take.
  static deepspeed_config parse(const nlohmann::json& j, int world_size = 1);
  /// The same from JSON text; a key given twice in one object is refused, as DeepSpeed does.
  static deepspeed_config parse_text(std::string_view text, int world_size = 1);
  /// The same from a file; messages start with the file's name.
  static deepspeed_config read(const std::filesystem::path& file, int world_size = 1);

  /// One line: "fp16 with a dynamic loss scale, ZeRO stage 2, AdamW".
  std::string summary() const;
};

namespace detail {

/// Keys of DeepSpeed's engine (batch bookkeeping aside): logging, profiling, activation
/// checkpointing, I/O. They configure nothing the optimizer does.
inline constexpr std::string_view deepspeed_engine_keys[] = {
    "steps_per_print", "wall_clock_breakdown", "dump_state",  "memory_breakdown",
    "tensorboard",     "wandb",                "csv_monitor", "comet",
    "flops_profiler",  "comms_logger",         "activation_checkpointing", "checkpoint",
    "aio",             "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"};

/// Keys of zero_optimization that configure stage 3 only (DeepSpeed reads none of them at 0-2).
inline constexpr std::string_view deepspeed_stage3_keys[] = {
    "stage3_max_live_parameters",         "stage3_max_reuse_distance", "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold", "stage3_gather_16bit_weights_on_model_save", "sub_group_size"};

/// Reader of one DeepSpeed configuration (deepspeed_config::parse).
class deepspeed_reader {
 public:
  deepspeed_reader(const nlohmann::json& j, int world_size) : top_(j, ""), world_(world_size) {
    if (world_size < 1) fail("world_size must be >= 1, got ", world_size);
    c_.world_size = world_size;
  }

  deepspeed_config read() {
    top_keys();
    precision();
    zero();
    optimizer();
    batch();
    step_options();
    return std::move(c_);
  }

 private:
  void ignore(std::string path) { c_.ignored_keys.push_back(std::move(path)); }
  /// `key` may hold any bool and changes nothing here.
  void ignore_flag(const config_object& o, std::string_view key) {
    if (!o.has(key)) return;
    o.flag(key, false);
    ignore(o.at(key));
  }
  /// `key` may hold only `supported` (DeepSpeed's default, what mpopt does); `why` says why not the other.
  static void require_flag(const config_object& o, std::string_view key, bool supported, std::string_view why) {
    if (o.flag(key, supported) != supported)
      fail(o.at(key), ": ", supported ? "false" : "true", " is not supported (", why, ")");
  }

  void top_keys() {
    for (const auto& item : top_.json().items()) {
      const std::string& key = item.key();
      if (std::ranges::find(deepspeed_engine_keys, key) != std::end(deepspeed_engine_keys)) {
        ignore(key);
        continue;
      }
      static constexpr std::string_view read_here[] = {
          "fp16", "bf16", "bfloat16", "zero_optimization", "optimizer", "gradient_clipping",
          "gradient_accumulation_steps", "gradient_predivide_factor", "train_batch_size",
          "train_micro_batch_size_per_gpu", "prescale_gradients", "communication_data_type",
          "gradient_allreduce_op", "scheduler"};
      if (std::ranges::find(read_here, key) != std::end(read_here)) continue;
      fail(key, ": unknown key (mpopt reads fp16, bf16, zero_optimization, optimizer, gradient_clipping, "
                "gradient_accumulation_steps, gradient_predivide_factor, train_batch_size, "
                "train_micro_batch_size_per_gpu, prescale_gradients, communication_data_type, "
                "gradient_allreduce_op, and ignores the engine's keys; see the README)");
    }
    if (top_.has("scheduler"))
      fail("scheduler: mpopt has no learning-rate schedulers: remove the key and set the rate with "
           "group.set_lr(...) before each step (train_mlp --schedule linear does)");
    if (top_.flag("prescale_gradients", false))
      fail("prescale_gradients: true is not supported (mpopt divides after the sum; "
           "gradient_predivide_factor divides before it)");
    if (const nlohmann::json* t = top_.find("communication_data_type"); t && !t->is_null()) {
      const std::string type = top_.text("communication_data_type", "");
      if (type != "fp32")
        fail("communication_data_type: \"", type, "\" is not supported (make_optimizer sums gradients across ranks "
             "in fp32; mpopt::mixed_precision<T, float, T> sends them as T)");
    }
    if (const std::string op = top_.text("gradient_allreduce_op", "mean"); op != "mean")
      fail("gradient_allreduce_op: \"", op, "\" is not supported (mpopt averages gradients over ranks: \"mean\")");
  }

  void precision() {
    bool fp16 = false, bf16 = false;
    double loss_scale = 0;
    std::int64_t power = 16, window = 1000, hysteresis = 2;
    bool consecutive = false;
    double min_scale = 1;
    if (const nlohmann::json* j = top_.find("fp16")) {
      const config_object f(*j, "fp16");
      f.allow_only({"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                    "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"},
                   "mpopt");
      fp16 = f.flag("enabled", false);
      ignore_flag(f, "auto_cast");  // casting the model's inputs: the engine's business
      loss_scale = f.number("loss_scale", 0);
      if (!(loss_scale >= 0))
        fail(f.at("loss_scale"), " must be >= 0 (0 enables dynamic loss scaling), got ", loss_scale);
      if (!(loss_scale <= max_loss_scale))
        fail(f.at("loss_scale"), " must be <= 2^64 (mpopt::max_loss_scale), got ", loss_scale);
      power = f.integer("initial_scale_power", 16, -126, 64);  // the scale is a normal float, at most 2^64
      constexpr std::int64_t big = std::numeric_limits<std::int64_t>::max();
      window = f.integer("loss_scale_window", 1000, -big, big);
      hysteresis = f.integer("hysteresis", 2, -big, big);
      consecutive = f.flag("consecutive_hysteresis", false);
      min_scale = f.number("min_loss_scale", 1);
      require_flag(f, "fp16_master_weights_and_grads", false, "mpopt keeps fp32 master weights");
      if (fp16 && loss_scale == 0) {  // DeepSpeed checks these only for the dynamic scale, which uses them
        constexpr std::string_view when = " must be > 0 when dynamic loss scaling is enabled, got ";
        if (window < 1) fail(f.at("loss_scale_window"), when, window);
        if (hysteresis < 1) fail(f.at("hysteresis"), when, hysteresis);
        if (!(min_scale > 0)) fail(f.at("min_loss_scale"), when, min_scale);
        const double initial = std::ldexp(1.0, int(power));
        if (!(min_scale <= initial))
          fail(f.at("min_loss_scale"), " (", min_scale, ") must be <= 2^initial_scale_power (", initial, ")");
      }
    }
    const nlohmann::json* b = top_.find("bf16");
    const nlohmann::json* old = top_.find("bfloat16");
    if (b && old) fail("bfloat16: the old name of bf16; give one of the two");
    if (b || old) {
      const config_object f(b ? *b : *old, b ? "bf16" : "bfloat16");
      f.allow_only({"enabled", "immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
                    "bf16_optimizer_states"},
                   "mpopt");
      bf16 = f.flag("enabled", false);
      // When the bf16 gradient joins the fp32 sum: the same sum either way here.
      ignore_flag(f, "immediate_grad_update");
      const bool check = f.flag("check_grad_overflow", true);
      if (bf16) c_.options.skip_nonfinite = check;
      require_flag(f, "bf16_master_weights_and_grads", false, "mpopt keeps fp32 master weights");
      require_flag(f, "bf16_optimizer_states", false, "mpopt keeps fp32 optimizer state");
    }
    if (fp16 && bf16) fail(b ? "bf16" : "bfloat16", ".enabled: fp16.enabled is true too; a run trains in one of them");
    if (fp16) {
      c_.precision = config_precision::fp16;
      if (loss_scale > 0) {
        c_.scaler = config_scaler::static_scale;
        c_.static_options.scale = loss_scale;
      } else {
        c_.scaler = config_scaler::dynamic_scale;
        c_.dynamic_options = {.init_scale = std::ldexp(1.0, int(power)),
                              .window = window,
                              .min_scale = min_scale,
                              .hysteresis = hysteresis,
                              .consecutive_hysteresis = consecutive};
      }
    } else if (bf16) {
      c_.precision = config_precision::bf16;
    }
  }

  void zero() {
    const nlohmann::json* z = top_.find("zero_optimization");
    if (!z) return;
    if (z->is_boolean()) {  // DeepSpeed's deprecated form: true is stage 1
      c_.zero_stage = z->get<bool>() ? 1 : 0;
      return;
    }
    const config_object o(*z, "zero_optimization");
    for (const auto& item : z->items()) {
      const std::string& key = item.key();
      if (std::ranges::find(deepspeed_stage3_keys, key) == std::end(deepspeed_stage3_keys)) continue;
      if (key == "stage3_gather_16bit_weights_on_model_save") o.flag(key, false);
      else o.integer(key, 0, 0, std::numeric_limits<std::int64_t>::max());
      ignore(o.at(key));
    }
    o.allow_only({"stage", "reduce_bucket_size", "allgather_bucket_size", "contiguous_gradients", "overlap_comm",
                  "reduce_scatter", "allgather_partitions", "elastic_checkpoint", "load_from_fp32_weights",
                  "round_robin_gradients", "cpu_offload", "offload_optimizer", "offload_param",
                  "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_prefetch_bucket_size",
                  "stage3_param_persistence_threshold", "stage3_gather_16bit_weights_on_model_save", "sub_group_size"},
                 "mpopt");
    const std::int64_t stage = o.integer("stage", 0, 0, 3);
    if (stage == 3)
      fail(o.at("stage"), ": 3 is not supported (mpopt has stages 0, 1 and 2; stage 3 partitions the parameters too)");
    c_.zero_stage = int(stage);
    c_.options.bucket_elements = std::size_t(o.integer("reduce_bucket_size", 500000000, 1, std::int64_t{1} << 30));
    if (o.has("allgather_bucket_size")) {
      // Unused by DeepSpeed too where torch has all_gather_into_tensor; mpopt gathers in the reduce buckets.
      const std::int64_t n = o.integer("allgather_bucket_size", 500000000, 1, std::numeric_limits<std::int64_t>::max());
      if (n % 2 != 0) fail(o.at("allgather_bucket_size"), " must be a multiple of 2 (DeepSpeed asserts it), got ", n);
      ignore(o.at("allgather_bucket_size"));
    }
    c_.options.overlap_comm = o.flag("overlap_comm", false);
    // How the exchange is scheduled, not what it computes: mpopt packs gradients into buckets,
    // reduce-scatters them and all-gathers the parameters, and its checkpoints load at any world size.
    for (std::string_view key : {"contiguous_gradients", "reduce_scatter", "allgather_partitions", "elastic_checkpoint"})
      ignore_flag(o, key);
    require_flag(o, "load_from_fp32_weights", true, "load() restores the fp32 masters from the checkpoint");
    require_flag(o, "round_robin_gradients", false, "mpopt shards each group's flat space in order");
    require_flag(o, "cpu_offload", false, "mpopt does not offload");
    for (std::string_view key : {"offload_optimizer", "offload_param"}) {
      const nlohmann::json* v = o.find(key);
      if (!v) continue;
      const config_object off(*v, o.at(key));
      off.allow_only({"device", "pin_memory"}, "mpopt");
      const std::string device = off.text("device", "none");
      if (device != "none")
        fail(off.at("device"), ": \"", device, "\" is not supported (mpopt does not offload: \"none\")");
      ignore_flag(off, "pin_memory");
      ignore(o.at(key));
    }
  }

  void optimizer() {
    const nlohmann::json* j = top_.find("optimizer");
    if (!j)
      fail("optimizer: missing: make_optimizer builds the optimizer the configuration names (type Adam, AdamW, "
           "Lamb, OneBitLamb, OneBitAdam or ZeroOneAdam)");
    const config_object o(*j, "optimizer");
    o.allow_only({"type", "params"}, "mpopt");
    if (!o.has("type")) fail("optimizer.type: missing (Adam, AdamW, Lamb, OneBitLamb, OneBitAdam or ZeroOneAdam)");
    c_.optimizer_type = o.text("type", "");
    std::string type = c_.optimizer_type;  // DeepSpeed compares its own optimizers' names in lower case
    for (char& ch : type) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    const nlohmann::json empty = nlohmann::json::object();
    const nlohmann::json* p = o.find("params");
    const config_object params(p ? *p : empty, "optimizer.params");
    if (type == "adam" || type == "adamw") {
      adam_params(params, type == "adamw");
    } else if (type == "lamb") {
      lamb_params(params);
    } else if (type == "onebitlamb") {
      onebit_lamb_params(params);
    } else if (type == "onebitadam") {
      onebit_adam_params(params);
    } else if (type == "zerooneadam") {
      zero_one_adam_params(params);
    } else {
      fail("optimizer.type: \"", c_.optimizer_type,
           "\" is not supported (mpopt has Adam, AdamW, Lamb, OneBitLamb, OneBitAdam and ZeroOneAdam)");
    }
  }

  /// lr, betas, eps and weight_decay, which every rule has; max_grad_norm and amsgrad, which DeepSpeed refuses.
  template <class Options>
  static void common_params(const config_object& p, Options& o) {
    if (p.has("max_grad_norm"))
      fail(p.at("max_grad_norm"), ": not an optimizer parameter: use the top-level gradient_clipping (DeepSpeed "
                                  "refuses it too)");
    require_flag(p, "amsgrad", false, "neither DeepSpeed's fused optimizers nor mpopt have AMSGrad");
    o.lr = p.number("lr", o.lr);
    require_check(p.at("lr"), o.lr, checks::rate);
    if (const nlohmann::json* b = p.find("betas")) {
      if (!b->is_array() || b->size() != 2)
        fail(p.at("betas"), " must be a list of two numbers [beta1, beta2], got ", json_brief(*b));
      double* betas[] = {&o.beta1, &o.beta2};
      for (std::size_t i = 0; i < 2; ++i) {
        const std::string at = p.at("betas") + "[" + std::to_string(i) + "]";
        if (!(*b)[i].is_number()) fail(at, " must be a number, got ", json_brief((*b)[i]));
        *betas[i] = (*b)[i].get<double>();
        require_check(at, *betas[i], checks::beta);
      }
    }
    o.eps = p.number("eps", o.eps);
    require_check(p.at("eps"), o.eps, checks::divisor);
    o.weight_decay = p.number("weight_decay", o.weight_decay);
    require_check(p.at("weight_decay"), o.weight_decay, checks::rate);
  }

  void adam_params(const config_object& p, bool adamw) {
    p.allow_only({"lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode", "torch_adam", "amsgrad",
                  "set_grad_none", "max_grad_norm"},
                 adamw ? "AdamW" : "Adam");
    c_.rule = config_rule::adam;
    adam::options& o = c_.adam_options;
    common_params(p, o);
    o.bias_correction = p.flag("bias_correction", true);
    // DeepSpeed builds AdamW for "Adam" unless adam_w_mode is false, and for "AdamW" always.
    const bool w_mode = p.flag("adam_w_mode", true);
    if (adamw && !w_mode)
      fail(p.at("adam_w_mode"), ": false contradicts type AdamW (DeepSpeed would build AdamW anyway): use type Adam");
    o.decoupled_weight_decay = adamw || w_mode;
    ignore_flag(p, "torch_adam");     // torch's implementation of the same formula
    ignore_flag(p, "set_grad_none");  // how the engine clears gradients
    check_options(o, p.path());
  }

  void lamb_params(const config_object& p) {
    p.allow_only({"lr", "betas", "eps", "weight_decay", "bias_correction", "eps_inside_sqrt", "max_coeff", "min_coeff",
                  "amsgrad", "max_grad_norm"},
                 "Lamb");
    c_.rule = config_rule::lamb;
    lamb::options& o = c_.lamb_options;
    common_params(p, o);
    o.bias_correction = p.flag("bias_correction", true);
    o.eps_inside_sqrt = p.flag("eps_inside_sqrt", false);
    o.max_coeff = p.number("max_coeff", o.max_coeff);
    o.min_coeff = p.number("min_coeff", o.min_coeff);
    check_options(o, p.path());
  }

  void onebit_lamb_params(const config_object& p) {
    p.allow_only({"lr", "betas", "eps", "weight_decay", "bias_correction", "eps_inside_sqrt", "max_coeff", "min_coeff",
                  "amsgrad", "max_grad_norm", "freeze_step", "cuda_aware", "comm_backend_name", "coeff_beta",
                  "factor_max", "factor_min", "factor_threshold", "compression_scale", "exclude_zero_variance", "zero_variance_ratio"},
                 "OneBitLamb");
    c_.rule = config_rule::onebit_lamb;
    onebit_lamb_options& o = c_.onebit_lamb_options;
    compressing_params(p, o, "1-bit LAMB");
    o.max_coeff = p.number("max_coeff", o.max_coeff);
    o.min_coeff = p.number("min_coeff", o.min_coeff);
    o.freeze_step = freeze_step(p);
    o.coeff_beta = p.number("coeff_beta", o.coeff_beta);
    o.factor_max = p.number("factor_max", o.factor_max);
    o.factor_min = p.number("factor_min", o.factor_min);
    o.factor_threshold = p.number("factor_threshold", o.factor_threshold);
    check_options(o, p.path());
  }

  void onebit_adam_params(const config_object& p) {
    p.allow_only({"lr", "betas", "eps", "weight_decay", "bias_correction", "eps_inside_sqrt", "amsgrad",
                  "max_grad_norm", "freeze_step", "cuda_aware", "comm_backend_name", "compression_scale",
                  "exclude_zero_variance", "zero_variance_ratio"},
                 "OneBitAdam");
    c_.rule = config_rule::onebit_adam;
    onebit_adam_options& o = c_.onebit_adam_options;
    compressing_params(p, o, "1-bit Adam");
    o.freeze_step = freeze_step(p);
    check_options(o, p.path());
  }

  void zero_one_adam_params(const config_object& p) {
    p.allow_only({"lr", "betas", "eps", "weight_decay", "bias_correction", "eps_inside_sqrt", "amsgrad",
                  "max_grad_norm", "var_freeze_step", "var_update_scaler", "local_step_scaler", "local_step_clipper",
                  "cuda_aware", "comm_backend_name", "compression_scale", "exclude_zero_variance", "zero_variance_ratio"},
                 "ZeroOneAdam");
    c_.rule = config_rule::zero_one_adam;
    zero_one_adam_options& o = c_.zero_one_adam_options;
    compressing_params(p, o, "0/1 Adam");
    // DeepSpeed's step s counts its set-up call; its phase 1 ends after s = var_freeze_step + 1, that
    // is after var_freeze_step updates, as mpopt's.
    constexpr auto most = std::int64_t(max_steps);
    o.var_freeze_step = std::uint64_t(p.integer("var_freeze_step", std::int64_t(o.var_freeze_step), 0, most));
    o.var_update_scaler = std::uint64_t(p.integer("var_update_scaler", std::int64_t(o.var_update_scaler), 1, most));
    o.local_step_scaler = std::uint64_t(p.integer("local_step_scaler", std::int64_t(o.local_step_scaler), 1, most));
    o.local_step_clipper = std::uint64_t(p.integer("local_step_clipper", std::int64_t(o.local_step_clipper), 1, most));
    check_options(o, p.path());
  }

  /// What the compressing rules share: the common parameters, two keys DeepSpeed takes and ignores
  /// (no bias correction, eps outside the root), the communication backend (the communicator
  /// make_optimizer is given does the communicating), and no ZeRO.
  template <class Options>
  void compressing_params(const config_object& p, Options& o, std::string_view title) {
    common_params(p, o);
    const std::string t(title);
    require_flag(p, "bias_correction", false, t + " has no bias correction; DeepSpeed ignores the key");
    require_flag(p, "eps_inside_sqrt", false, t + " adds eps outside the root; DeepSpeed ignores the key");
    ignore_flag(p, "cuda_aware");
    if (p.has("comm_backend_name")) {
      const std::string name = p.text("comm_backend_name", "");
      if (name != "nccl" && name != "mpi" && name != "hccl" && name != "compressed")
        fail(p.at("comm_backend_name"), ": \"", name, "\" is not one of DeepSpeed's (nccl, mpi, hccl, compressed)");
      ignore(p.at("comm_backend_name"));
    }
    // mpopt's own keys (compression_options.hpp); DeepSpeed has neither.
    if (p.has("compression_scale"))
      o.compression.scale = choice_of<compression_scale>(p.text("compression_scale", ""), p.at("compression_scale"));
    o.compression.exclude_zero_variance = p.flag("exclude_zero_variance", o.compression.exclude_zero_variance);
    o.compression.zero_variance_ratio = p.number("zero_variance_ratio", o.compression.zero_variance_ratio);
    if (c_.zero_stage > 0)
      fail("zero_optimization.stage: ", c_.zero_stage, " does not go with optimizer.type ", c_.optimizer_type,
           " (its compression needs the whole momentum on every rank; DeepSpeed refuses it too)");
  }

  /// DeepSpeed's first call only sets up state and counts as a step: freeze_step F gives F - 1
  /// warm-up updates, which is mpopt's freeze_step.
  static std::uint64_t freeze_step(const config_object& p) {
    return std::uint64_t(p.integer("freeze_step", 100000, 2, std::int64_t(max_steps)) - 1);
  }

  /// gradient_accumulation_steps, or what DeepSpeed derives from the batch sizes.
  void batch() {
    constexpr std::int64_t big = std::numeric_limits<std::int32_t>::max();
    const bool has_gas = top_.has("gradient_accumulation_steps"), has_tbs = top_.has("train_batch_size"),
               has_mbs = top_.has("train_micro_batch_size_per_gpu");
    const std::int64_t gas = top_.integer("gradient_accumulation_steps", 1, 1, big);
    const std::int64_t tbs = top_.integer("train_batch_size", 1, 1, std::numeric_limits<std::int64_t>::max() / 4);
    const std::int64_t mbs = top_.integer("train_micro_batch_size_per_gpu", 1, 1, big);
    const std::int64_t w = world_;
    std::int64_t steps = gas;
    if (has_tbs && has_mbs) {  // mbs * w and gas * w fit: each factor is below 2^31
      if (!has_gas) {
        steps = tbs / (mbs * w);
        c_.accumulation_from_batch_sizes = true;
      }
      if (steps < 1 || steps > big || tbs % (mbs * w) != 0 || tbs / (mbs * w) != steps)
        fail("train_batch_size: ", tbs, " is not train_micro_batch_size_per_gpu (", mbs,
             ") x gradient_accumulation_steps", has_gas ? " (" + std::to_string(gas) + ")" : std::string(), " x ", w,
             w == 1 ? " rank" : " ranks");
    } else if (has_tbs && tbs % (gas * w) != 0) {
      fail("train_batch_size: ", tbs, " does not split into gradient_accumulation_steps (", gas, ") x ", w,
           w == 1 ? " rank" : " ranks", " micro-batches");
    }
    c_.options.accumulation_steps = int(steps);
    if (has_mbs) c_.micro_batch_size = int(mbs);
    else if (has_tbs) c_.micro_batch_size = int(tbs / (steps * w));
  }

  void step_options() {
    c_.options.clip_grad = top_.number("gradient_clipping", 1.0);
    require_check("gradient_clipping", c_.options.clip_grad, checks::at_least(0));
    c_.options.gradient_predivide = top_.number("gradient_predivide_factor", 1.0);
    require_check("gradient_predivide_factor", c_.options.gradient_predivide, checks::above(0));
    require_check("gradient_predivide_factor", c_.options.gradient_predivide, checks::float_scale);
    // The library's own checks, for what the reader may have missed.
    c_.options = validated(c_.options, c_.scaler == config_scaler::none);
    if (c_.scaler == config_scaler::dynamic_scale) dynamic_scale{c_.dynamic_options};
    if (c_.scaler == config_scaler::static_scale) static_scale{c_.static_options};
  }

  config_object top_;
  int world_;
  deepspeed_config c_;
};

/// Parses JSON text, refusing a key given twice in one object (Python's json keeps the last one;
/// DeepSpeed loads its file with a hook that raises instead).
inline nlohmann::json parse_json_strictly(std::string_view text) {
  struct frame {
    std::vector<std::string> keys;
    std::string key;
  };
  std::vector<frame> stack;
  auto path = [&] {
    std::string p;
    for (const auto& f : stack)
      if (!f.key.empty()) p += (p.empty() ? "" : ".") + f.key;
    return p;
  };
  const nlohmann::json::parser_callback_t check = [&](int, nlohmann::json::parse_event_t e, nlohmann::json& v) {
    using event = nlohmann::json::parse_event_t;
    if (e == event::object_start || e == event::array_start) stack.push_back({});
    if (e == event::object_end || e == event::array_end) stack.pop_back();
    if (e == event::key) {
      frame& f = stack.back();
      const std::string& key = v.get_ref<const std::string&>();
      if (std::find(f.keys.begin(), f.keys.end(), key) != f.keys.end()) {
        f.key = key;
        fail(path(), ": given twice");
      }
      f.keys.push_back(key);
      f.key = key;
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), check);
  } catch (const nlohmann::json::parse_error& e) {
    fail("not valid JSON: ", e.what());
  }
}

}  // namespace detail

inline deepspeed_config deepspeed_config::parse(const nlohmann::json& j, int world_size) {
  return detail::deepspeed_reader(j, world_size).read();
}

inline deepspeed_config deepspeed_config::parse_text(std::string_view text, int world_size) {
  return parse(detail::parse_json_strictly(text), world_size);
}

inline deepspeed_config deepspeed_config::read(const std::filesystem::path& file, int world_size) {
  std::ifstream in(file, std::ios::binary);
  if (!in) detail::fail("cannot open the DeepSpeed configuration '", file.string(), "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) detail::fail("cannot read the DeepSpeed configuration '", file.string(), "'");
  try {
    return parse_text(text, world_size);
  } catch (const error& e) {
    detail::fail(file.string(), ": ", e.message());
  }
}

inline std::string deepspeed_config::summary() const {
  std::string s = precision == config_precision::fp16 ? "fp16" : precision == config_precision::bf16 ? "bf16" : "fp32";
  if (scaler == config_scaler::dynamic_scale) s += " with a dynamic loss scale";
  if (scaler == config_scaler::static_scale) s += " with a static loss scale";
  s += zero_stage == 0 ? ", no ZeRO" : ", ZeRO stage " + std::to_string(zero_stage);
  s += ", ";
  switch (rule) {
    case config_rule::adam: s += adam_options.decoupled_weight_decay ? "AdamW" : "Adam (L2 weight decay)"; break;
    case config_rule::lamb: s += "Lamb"; break;
    case config_rule::onebit_lamb: s += "OneBitLamb"; break;
    case config_rule::onebit_adam: s += "OneBitAdam"; break;
    case config_rule::zero_one_adam: s += "ZeroOneAdam"; break;
  }
  return s;
}

}  // namespace mpopt
