// mpopt — the DeepSpeed configuration reader's definitions (deepspeed_config.hpp): inline
// header-only, else compiled once by <mpopt/src.hpp>.
#pragma once

#include "deepspeed_config.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>

#include "detail/options/schedule_json.hpp"

namespace mpopt {

namespace detail {

MPOPT_DECL nlohmann::json with_auto_values(const nlohmann::json& j, const nlohmann::json& values,
                                           config_problems& problems) {
  if (!values.is_object()) fail("auto_values must be a JSON object of paths and values, got ", json_brief(values));
  nlohmann::json filled = j;
  for (const auto& [path, value] : values.items()) {
    nlohmann::json* at = &filled;
    for (std::size_t from = 0; at && from <= path.size();) {
      const std::size_t dot = std::min(path.find('.', from), path.size());
      const std::string key = path.substr(from, dot - from);
      at = at->is_object() && at->contains(key) ? &(*at)[key] : nullptr;
      from = dot + 1;
    }
    if (!at) continue;  // as the Hugging Face Trainer: only what the file has
    if (at->is_string() && at->get_ref<const std::string&>() == "auto") *at = value;
    else if (*at != value)
      problems.add(text_of(path, ": the configuration says ", json_brief(*at), ", auto_values ", json_brief(value),
                           " (auto_values fills in only \"auto\")"));
  }
  return filled;
}

MPOPT_DECL deepspeed_reader::deepspeed_reader(const nlohmann::json& j, int world_size, const nlohmann::json& auto_values)
    : filled_(with_auto_values(j, auto_values, problems_)), top_(filled_, "", &problems_), world_(world_size) {
  if (world_size < 1) fail("world_size must be >= 1, got ", world_size);
  c_.world_size = world_size;
}

MPOPT_DECL deepspeed_config deepspeed_reader::read() {
  // Each part on its own: one that cannot go on adds its problem, and the next part reads.
  for (void (deepspeed_reader::*part)() : {&deepspeed_reader::top_keys, &deepspeed_reader::precision,
                                           &deepspeed_reader::data_types, &deepspeed_reader::zero,
                                           &deepspeed_reader::optimizer, &deepspeed_reader::batch,
                                           &deepspeed_reader::step_options, &deepspeed_reader::scheduler})
    problems_.attempt([&] { (this->*part)(); });
  problems_.raise();
  return std::move(c_);
}

MPOPT_DECL void deepspeed_reader::ignore_flag(const config_object& o, std::string_view key) {
  if (!o.has(key)) return;
  o.flag(key, false);
  ignore(o.at(key));
}

MPOPT_DECL void deepspeed_reader::require_flag(const config_object& o, std::string_view key, bool supported,
                                               std::string_view why) {
  if (o.flag(key, supported) != supported)
    o.refuse(o.at(key), ": ", supported ? "false" : "true", " is not supported (", why, ")");
}

MPOPT_DECL void deepspeed_reader::top_keys() {
  for (const auto& item : top_.json().items()) {
    const std::string& key = item.key();
    static constexpr std::string_view read_here[] = {
        "fp16", "bf16", "bfloat16", "zero_optimization", "optimizer", "scheduler", "gradient_clipping",
        "gradient_accumulation_steps", "gradient_predivide_factor", "train_batch_size",
        "train_micro_batch_size_per_gpu", "prescale_gradients", "communication_data_type",
        "gradient_allreduce_op", "data_types", "allgather_size"};
    if (std::ranges::find(read_here, key) != std::end(read_here)) continue;
    const auto* k = std::ranges::find(deepspeed_engine_keys, key, &engine_key::key);
    if (k != std::end(deepspeed_engine_keys)) engine_key_of(*k);
    else
      top_.refuse(key, ": unknown key (not one of DeepSpeed's: mpopt reads fp16, bf16, zero_optimization, optimizer, "
                       "scheduler, gradient_clipping, gradient_accumulation_steps, gradient_predivide_factor, "
                       "train_batch_size, train_micro_batch_size_per_gpu, prescale_gradients, "
                       "communication_data_type, gradient_allreduce_op, data_types, and takes the engine's: "
                       "docs/deepspeed-config.md)");
  }
  if (top_.flag("prescale_gradients", false))
    top_.refuse("prescale_gradients: true is not supported (mpopt divides after the sum; "
                "gradient_predivide_factor divides before it)");
  if (const nlohmann::json* t = top_.find("communication_data_type"); t && !t->is_null()) {
    const std::string type = top_.text("communication_data_type", "fp32");
    if (type != "fp32")
      top_.refuse("communication_data_type: \"", type, "\" is not supported (make_optimizer sums gradients across "
                  "ranks in fp32; mpopt::mixed_precision<T, float, T> sends them as T)");
  }
  if (const std::string op = top_.text("gradient_allreduce_op", "mean"); op != "mean")
    top_.refuse("gradient_allreduce_op: \"", op, "\" is not supported (mpopt averages gradients over ranks: \"mean\")");
}

MPOPT_DECL void deepspeed_reader::engine_key_of(const engine_key& k) {
  const nlohmann::json& v = top_.json()[std::string(k.key)];
  if (k.use != engine_key_use::ignored) {
    // A flag, or a section whose "enabled" says (absent: off).
    const bool section = v.is_object();
    const bool on = section ? config_object(v, std::string(k.key), top_).flag("enabled", false)
                            : top_.flag(k.key, k.use == engine_key_use::refused_when_off);
    if (on == (k.use == engine_key_use::refused_when_on)) {
      top_.refuse(k.key, section ? ".enabled" : "", ": ", on, " is not supported (", k.why, ")");
      return;
    }
  }
  ignore(std::string(k.key));
}

MPOPT_DECL void deepspeed_reader::data_types() {
  const nlohmann::json* j = top_.find("data_types");
  if (!j) return;
  const config_object d(*j, "data_types", top_);
  d.allow_only({"grad_accum_dtype", "param_dtype", "buffer_dtype"}, "mpopt");
  // DeepSpeed's spellings of the three types (its DtypeEnum).
  const auto type_of = [&](std::string_view key) -> std::string_view {
    const nlohmann::json* v = d.find(key);
    if (!v || v->is_null()) return "";
    const std::string name = d.text(key, "");
    for (const auto& [type, names] : {std::pair{"fp32", "fp32 float32 float torch.float32"},
                                      std::pair{"fp16", "fp16 float16 half torch.float16"},
                                      std::pair{"bf16", "bf16 bfloat16 torch.bfloat16"}}) {
      std::string_view list = names;
      for (std::size_t at = 0; at < list.size();) {
        const std::size_t end = std::min(list.find(' ', at), list.size());
        if (list.substr(at, end - at) == name) return type;
        at = end + 1;
      }
    }
    d.refuse(d.at(key), ": \"", name, "\" is not one of DeepSpeed's types (fp32, fp16, bf16 and their other names)");
    return "";
  };
  const std::string_view accumulate = type_of("grad_accum_dtype");
  if (!accumulate.empty() && accumulate != "fp32")
    d.refuse(d.at("grad_accum_dtype"), ": \"", accumulate, "\" is not supported (mpopt sums micro-steps' gradients "
             "in fp32)");
  const std::string_view param = type_of("param_dtype");
  const std::string_view model = c_.precision == config_precision::fp16   ? "fp16"
                                 : c_.precision == config_precision::bf16 ? "bf16"
                                                                          : "fp32";
  if (!param.empty() && param != model)
    d.refuse(d.at("param_dtype"), ": \"", param, "\" is not the parameters' type, ", model,
             " (fp16.enabled and bf16.enabled decide it; DeepSpeed asserts the same)");
  if (d.has("buffer_dtype")) {
    type_of("buffer_dtype");
    ignore(d.at("buffer_dtype"));  // the model's buffers
  }
}

MPOPT_DECL void deepspeed_reader::precision() {
  bool fp16 = false, bf16 = false;
  double loss_scale = 0;
  std::int64_t power = 16, window = 1000, hysteresis = 2;
  bool consecutive = false;
  double min_scale = 1;
  if (const nlohmann::json* j = top_.find("fp16")) {
    const config_object f(*j, "fp16", top_);
    f.allow_only({"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                  "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"},
                 "mpopt");
    fp16 = f.flag("enabled", false);
    ignore_flag(f, "auto_cast");  // casting the model's inputs: the engine's business
    loss_scale = f.number("loss_scale", 0);
    if (!(loss_scale >= 0))
      f.refuse(f.at("loss_scale"), " must be >= 0 (0 enables dynamic loss scaling), got ", loss_scale);
    if (!(loss_scale <= max_loss_scale))
      f.refuse(f.at("loss_scale"), " must be <= 2^64 (mpopt::max_loss_scale), got ", loss_scale);
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
      // These end the part (fail, not refuse): the scaler they describe cannot be made.
    }
  }
  const nlohmann::json* b = top_.find("bf16");
  const nlohmann::json* old = top_.find("bfloat16");
  if (b && old) top_.refuse("bfloat16: the old name of bf16; give one of the two");
  if (b || old) {
    const config_object f(b ? *b : *old, b ? "bf16" : "bfloat16", top_);
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
  if (fp16 && bf16) {
    top_.refuse(b ? "bf16" : "bfloat16", ".enabled: fp16.enabled is true too; a run trains in one of them");
    return;
  }
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

MPOPT_DECL void deepspeed_reader::zero() {
  const nlohmann::json* z = top_.find("zero_optimization");
  if (!z) return;
  if (z->is_boolean()) {  // DeepSpeed's deprecated form: true is stage 1
    c_.zero_stage = z->get<bool>() ? 1 : 0;
    if (top_.has("allgather_size")) ignore("allgather_size");  // that form's allgather_bucket_size
    return;
  }
  if (top_.has("allgather_size")) top_.refuse("allgather_size: read by DeepSpeed only where zero_optimization is true or false");
  const config_object o(*z, "zero_optimization", top_);
  std::vector<std::string_view> known = {
      "stage", "reduce_bucket_size", "allgather_bucket_size", "contiguous_gradients", "overlap_comm", "reduce_scatter",
      "allgather_partitions", "elastic_checkpoint", "load_from_fp32_weights", "round_robin_gradients",
      "use_multi_rank_bucket_allreduce", "ignore_unused_parameters", "legacy_stage1", "cpu_offload",
      "cpu_offload_param", "cpu_offload_use_pin_memory", "offload_optimizer", "offload_param", "zenflow"};
  known.insert(known.end(), std::begin(deepspeed_stage3_keys), std::end(deepspeed_stage3_keys));
  o.allow_only(known, "mpopt");
  for (std::string_view key : deepspeed_stage3_keys)
    if (o.has(key)) ignore(o.at(key));
  const std::int64_t stage = o.integer("stage", 0, 0, 3);
  if (stage == 3)
    o.refuse(o.at("stage"), ": 3 is not supported (mpopt has stages 0, 1 and 2; stage 3 partitions the parameters too)");
  else c_.zero_stage = int(stage);
  c_.options.bucket_elements = std::size_t(o.integer("reduce_bucket_size", 500000000, 1, std::int64_t{1} << 30));
  if (o.has("allgather_bucket_size")) {
    // Unused by DeepSpeed too where torch has all_gather_into_tensor; mpopt gathers in the reduce buckets.
    const std::int64_t n = o.integer("allgather_bucket_size", 500000000, 1, std::numeric_limits<std::int64_t>::max());
    if (n % 2 != 0) o.refuse(o.at("allgather_bucket_size"), " must be a multiple of 2 (DeepSpeed asserts it), got ", n);
    ignore(o.at("allgather_bucket_size"));
  }
  c_.options.overlap_comm = o.flag("overlap_comm", false);
  // How the exchange is scheduled, not what it computes: mpopt packs gradients into buckets,
  // reduce-scatters them and all-gathers the parameters, and its checkpoints load at any world size.
  // A parameter backward leaves unused has zeros for its gradient: nothing to ignore.
  for (std::string_view key : {"contiguous_gradients", "reduce_scatter", "allgather_partitions", "elastic_checkpoint",
                               "use_multi_rank_bucket_allreduce", "ignore_unused_parameters"})
    ignore_flag(o, key);
  require_flag(o, "load_from_fp32_weights", true, "load() restores the fp32 masters from the checkpoint");
  require_flag(o, "round_robin_gradients", false, "mpopt shards each group's flat space in order");
  require_flag(o, "legacy_stage1", false, "DeepSpeed has removed it too");
  if (o.has("zenflow"))
    o.refuse(o.at("zenflow"), ": not supported (ZenFlow's updates of the important columns alone are not mpopt's)");
  offload(o);
}

MPOPT_DECL void deepspeed_reader::offload(const config_object& zero) {
  // The deprecated spellings: cpu_offload is offload_optimizer {"device": "cpu"}, cpu_offload_param
  // offload_param's.
  if (zero.flag("cpu_offload", false)) c_.offload_optimizer = true;
  if (zero.flag("cpu_offload_param", false))
    zero.refuse(zero.at("cpu_offload_param"), ": true is not supported (parameter offload is ZeRO stage 3's)");
  ignore_flag(zero, "cpu_offload_use_pin_memory");
  if (const nlohmann::json* v = zero.find("offload_optimizer"); v && !v->is_null()) {
    const config_object off(*v, zero.at("offload_optimizer"), zero);
    off.allow_only({"device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read", "pipeline_write", "fast_init",
                    "ratio", "super_offload", "cpuadam_cores_perc"},
                   "mpopt");
    const std::string device = off.text("device", "none");
    if (device == "cpu") c_.offload_optimizer = true;
    else if (device == "none") ignore(zero.at("offload_optimizer"));
    else if (device == "nvme")
      off.refuse(off.at("device"), ": \"nvme\" is not supported (mpopt offloads the optimizer to host memory: \"cpu\")");
    else if (device != "none")
      off.refuse(off.at("device"), ": \"", device, "\" is not one of DeepSpeed's (none, cpu, nvme)");
    if (const nlohmann::json* ratio = off.find("ratio"); ratio && !(ratio->is_number() && ratio->get<double>() == 1))
      off.refuse(off.at("ratio"), " must be 1 (offloading part of the state is ZeRO stage 3's), got ", json_brief(*ratio));
    require_flag(off, "super_offload", false, "SuperOffload is ZeRO stage 3's");
    for (std::string_view key : {"pin_memory", "pipeline_read", "pipeline_write", "fast_init"}) ignore_flag(off, key);
    for (std::string_view key : {"nvme_path", "buffer_count", "cpuadam_cores_perc"})
      if (off.has(key)) ignore(off.at(key));
  }
  if (const nlohmann::json* v = zero.find("offload_param"); v && !v->is_null()) {
    const config_object off(*v, zero.at("offload_param"), zero);
    off.allow_only({"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"}, "mpopt");
    if (const std::string device = off.text("device", "none"); device != "none")
      off.refuse(off.at("device"), ": \"", device, "\" is not supported (parameter offload is ZeRO stage 3's: \"none\")");
    ignore(zero.at("offload_param"));
  }
}

MPOPT_DECL void deepspeed_reader::optimizer() {
  const nlohmann::json* j = top_.find("optimizer");
  if (!j)
    fail("optimizer: missing: make_optimizer builds the optimizer the configuration names (type Adam, AdamW, "
         "Lamb, OneBitLamb, OneBitAdam or ZeroOneAdam)");
  const config_object o(*j, "optimizer", top_);
  o.allow_only({"type", "params"}, "mpopt");
  if (!o.has("type")) fail("optimizer.type: missing (Adam, AdamW, Lamb, OneBitLamb, OneBitAdam or ZeroOneAdam)");
  c_.optimizer_type = o.text("type", "");
  std::string type = c_.optimizer_type;  // DeepSpeed compares its own optimizers' names in lower case
  for (char& ch : type) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json* p = o.find("params");
  const config_object params(p ? *p : empty, "optimizer.params", o);
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

MPOPT_DECL void deepspeed_reader::common_params(const config_object& p, std::span<const field_ref> table) {
  if (p.has("max_grad_norm"))
    p.refuse(p.at("max_grad_norm"), ": not an optimizer parameter: use the top-level gradient_clipping (DeepSpeed "
                                "refuses it too)");
  require_flag(p, "amsgrad", false, "neither DeepSpeed's fused optimizers nor mpopt have AMSGrad");
  if (const nlohmann::json* b = p.find("betas")) {
    if (!b->is_array() || b->size() != 2) {
      p.refuse(p.at("betas"), " must be a list of two numbers [beta1, beta2], got ", json_brief(*b));
      return;
    }
    for (std::size_t i = 0; i < 2; ++i) {
      const field_ref& beta = field_named(table, i == 0 ? "beta1" : "beta2");
      const std::string at = p.at("betas") + "[" + std::to_string(i) + "]";
      if (!(*b)[i].is_number()) {
        p.refuse(at, " must be a number, got ", json_brief((*b)[i]));
        continue;
      }
      const double x = (*b)[i].get<double>();
      p.attempt([&] {
        require_check(at, x, *beta.rule);
        set_number(beta, x);
      });
    }
  }
}

MPOPT_DECL void deepspeed_reader::adam_params(const config_object& p, bool adamw) {
  c_.rule = config_rule::adam;
  adam::options& o = c_.adam_options;
  const std::vector<field_ref> table = field_refs(o);
  read_params_through_table(p,
                            {"lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode", "torch_adam",
                             "amsgrad", "set_grad_none", "max_grad_norm"},
                            adamw ? "AdamW" : "Adam", table);
  common_params(p, table);
  // DeepSpeed builds AdamW for "Adam" unless adam_w_mode is false, and for "AdamW" always.
  const bool w_mode = p.flag("adam_w_mode", true);
  if (adamw && !w_mode)
    p.refuse(p.at("adam_w_mode"), ": false contradicts type AdamW (DeepSpeed would build AdamW anyway): use type Adam");
  o.decoupled_weight_decay = adamw || w_mode;
  ignore_flag(p, "torch_adam");     // torch's implementation of the same formula
  ignore_flag(p, "set_grad_none");  // how the engine clears gradients
  p.attempt([&] { check_options(o, p.path()); });
}

MPOPT_DECL void deepspeed_reader::lamb_params(const config_object& p) {
  c_.rule = config_rule::lamb;
  lamb::options& o = c_.lamb_options;
  const std::vector<field_ref> table = field_refs(o);
  read_params_through_table(p,
                            {"lr", "betas", "eps", "weight_decay", "bias_correction", "eps_inside_sqrt", "max_coeff",
                             "min_coeff", "amsgrad", "max_grad_norm"},
                            "Lamb", table);
  common_params(p, table);
  p.attempt([&] { check_options(o, p.path()); });
}

MPOPT_DECL void deepspeed_reader::onebit_lamb_params(const config_object& p) {
  c_.rule = config_rule::onebit_lamb;
  onebit_lamb_options& o = c_.onebit_lamb_options;
  const std::vector<field_ref> table = field_refs(o);
  read_params_through_table(p,
                            {"lr", "betas", "eps", "weight_decay", "bias_correction", "eps_inside_sqrt", "max_coeff",
                             "min_coeff", "amsgrad", "max_grad_norm", "freeze_step", "cuda_aware", "comm_backend_name",
                             "coeff_beta", "factor_max", "factor_min", "factor_threshold", "compression_scale",
                             "exclude_zero_variance", "zero_variance_ratio"},
                            "OneBitLamb", table, {"freeze_step"});
  compressing_params(p, table, "1-bit LAMB");
  o.freeze_step = freeze_step(p);
  p.attempt([&] { check_options(o, p.path()); });
}

MPOPT_DECL void deepspeed_reader::onebit_adam_params(const config_object& p) {
  c_.rule = config_rule::onebit_adam;
  onebit_adam_options& o = c_.onebit_adam_options;
  const std::vector<field_ref> table = field_refs(o);
  read_params_through_table(p,
                            {"lr", "betas", "eps", "weight_decay", "bias_correction", "eps_inside_sqrt", "amsgrad",
                             "max_grad_norm", "freeze_step", "cuda_aware", "comm_backend_name", "compression_scale",
                             "exclude_zero_variance", "zero_variance_ratio"},
                            "OneBitAdam", table, {"freeze_step"});
  compressing_params(p, table, "1-bit Adam");
  o.freeze_step = freeze_step(p);
  p.attempt([&] { check_options(o, p.path()); });
}

MPOPT_DECL void deepspeed_reader::zero_one_adam_params(const config_object& p) {
  c_.rule = config_rule::zero_one_adam;
  zero_one_adam_options& o = c_.zero_one_adam_options;
  const std::vector<field_ref> table = field_refs(o);
  // var_freeze_step is read as it is: DeepSpeed's step s counts its set-up call, and its phase 1
  // ends after s = var_freeze_step + 1, that is after var_freeze_step updates, as mpopt's.
  read_params_through_table(p,
                            {"lr", "betas", "eps", "weight_decay", "bias_correction", "eps_inside_sqrt", "amsgrad",
                             "max_grad_norm", "var_freeze_step", "var_update_scaler", "local_step_scaler",
                             "local_step_clipper", "cuda_aware", "comm_backend_name", "compression_scale",
                             "exclude_zero_variance", "zero_variance_ratio"},
                            "ZeroOneAdam", table);
  compressing_params(p, table, "0/1 Adam");
  p.attempt([&] { check_options(o, p.path()); });
}

MPOPT_DECL void deepspeed_reader::compressing_params(const config_object& p, std::span<const field_ref> table,
                                                     std::string_view title) {
  common_params(p, table);
  const std::string t(title);
  require_flag(p, "bias_correction", false, t + " has no bias correction; DeepSpeed ignores the key");
  require_flag(p, "eps_inside_sqrt", false, t + " adds eps outside the root; DeepSpeed ignores the key");
  ignore_flag(p, "cuda_aware");
  if (p.has("comm_backend_name")) {
    const std::string name = p.text("comm_backend_name", "");
    if (name != "nccl" && name != "mpi" && name != "hccl" && name != "compressed")
      p.refuse(p.at("comm_backend_name"), ": \"", name, "\" is not one of DeepSpeed's (nccl, mpi, hccl, compressed)");
    ignore(p.at("comm_backend_name"));
  }
  // mpopt's own keys (compression_options.hpp), flat as DeepSpeed's: the table reads
  // exclude_zero_variance and zero_variance_ratio; its `scale` is named with the group, as `scale`
  // alone would say too little among a rule's keys.
  const field_ref& compression = field_named(table, "compression");
  const std::vector<field_ref> members = compression.members(compression.at);
  read_config_field(p, "compression_scale", field_named(members, "scale"));
  if (c_.zero_stage > 0)
    top_.refuse("zero_optimization.stage: ", c_.zero_stage, " does not go with optimizer.type ", c_.optimizer_type,
                " (its compression needs the whole momentum on every rank; DeepSpeed refuses it too)");
}

MPOPT_DECL std::uint64_t deepspeed_reader::freeze_step(const config_object& p) {
  return std::uint64_t(p.integer("freeze_step", 100000, 2, std::int64_t(max_steps)) - 1);
}

MPOPT_DECL void deepspeed_reader::batch() {
  constexpr std::int64_t big = std::numeric_limits<std::int32_t>::max();
  // A key refused (or "auto") counts as absent: what follows checks the sizes given.
  const auto gas_given = top_.integer_if("gradient_accumulation_steps", 1, big);
  const auto tbs_given = top_.integer_if("train_batch_size", 1, std::numeric_limits<std::int64_t>::max() / 4);
  const auto mbs_given = top_.integer_if("train_micro_batch_size_per_gpu", 1, big);
  const bool has_gas = gas_given.has_value(), has_tbs = tbs_given.has_value(), has_mbs = mbs_given.has_value();
  const std::int64_t gas = gas_given.value_or(1), tbs = tbs_given.value_or(1), mbs = mbs_given.value_or(1);
  const std::int64_t w = world_;
  std::int64_t steps = gas;
  if (has_tbs && has_mbs) {  // mbs * w and gas * w fit: each factor is below 2^31
    if (!has_gas) {
      steps = tbs / (mbs * w);
      c_.accumulation_from_batch_sizes = true;
    }
    if (steps < 1 || steps > big || tbs % (mbs * w) != 0 || tbs / (mbs * w) != steps)
      top_.refuse("train_batch_size: ", tbs, " is not train_micro_batch_size_per_gpu (", mbs,
                  ") x gradient_accumulation_steps", has_gas ? " (" + std::to_string(gas) + ")" : std::string(), " x ",
                  w, w == 1 ? " rank" : " ranks");
  } else if (has_tbs && tbs % (gas * w) != 0) {
    top_.refuse("train_batch_size: ", tbs, " does not split into gradient_accumulation_steps (", gas, ") x ", w,
                w == 1 ? " rank" : " ranks", " micro-batches");
  }
  c_.options.accumulation_steps = int(steps);
  if (has_mbs) c_.micro_batch_size = int(mbs);
  else if (has_tbs) c_.micro_batch_size = int(tbs / (steps * w));
}

MPOPT_DECL void deepspeed_reader::step_options() {
  const double clip = top_.number("gradient_clipping", 1.0);
  top_.attempt([&] {
    require_check("gradient_clipping", clip, checks::at_least(0));
    c_.options.clip_grad = clip;
  });
  const double predivide = top_.number("gradient_predivide_factor", 1.0);
  top_.attempt([&] {
    require_check("gradient_predivide_factor", predivide, checks::above(0));
    require_check("gradient_predivide_factor", predivide, checks::float_scale);
    c_.options.gradient_predivide = predivide;
  });
  // The library's own checks, for what the reader may have missed.
  top_.attempt([&] { c_.options = validated(c_.options, c_.scaler == config_scaler::none); });
  top_.attempt([&] {
    if (c_.scaler == config_scaler::dynamic_scale) dynamic_scale{c_.dynamic_options};
    if (c_.scaler == config_scaler::static_scale) static_scale{c_.static_options};
  });
}

MPOPT_DECL void read_config_field(const config_object& o, std::string_view key, const field_ref& f) {
  if (!o.has(key)) return;
  switch (f.kind) {
    case field_kind::number: {
      const nlohmann::json* v = o.find(key);
      if (!v || !v->is_number()) {
        o.number(key, 0);  // refuses it
        break;
      }
      const double x = v->get<double>();
      o.attempt([&] {
        require_check(o.at(key), x, *f.rule);
        set_number(f, x);
      });
      break;
    }
    case field_kind::flag: *static_cast<bool*>(f.at) = o.flag(key, *static_cast<bool*>(f.at)); break;
    case field_kind::integer: {
      // The check's bounds, rounded inward, within what the type holds (and int64, which
      // config_object::integer reads).
      const check& c = *f.rule;
      const double lo_c = c.lo_open ? std::floor(c.lo) + 1 : std::ceil(c.lo);
      const double hi_c = c.hi_open ? std::ceil(c.hi) - 1 : std::floor(c.hi);
      const std::int64_t lo_t = f.is_signed ? -std::int64_t(integer_limit(f, true) - 1) - 1 : 0;
      const std::int64_t hi_t =
          std::int64_t(std::min(integer_limit(f, false), std::uint64_t(std::numeric_limits<std::int64_t>::max())));
      const auto clamp = [&](double b) {
        return b <= double(lo_t) ? lo_t : b >= double(hi_t) ? hi_t : std::int64_t(b);
      };
      if (const auto x = o.integer_if(key, clamp(lo_c), clamp(hi_c)))
        set_integer(f, {*x < 0, *x < 0 ? ~std::uint64_t(*x) + 1 : std::uint64_t(*x)});
      break;
    }
    case field_kind::choice:
      if (const nlohmann::json* v = o.find(key); v && v->is_string())
        o.attempt([&] { set_integer(f, {false, find_choice(f.choices, v->get<std::string>(), o.at(key))}); });
      else o.text(key, "");  // refuses it
      break;
    case field_kind::group:
      fail("mpopt bug: ", o.at(key), " names a nested group, whose fields have keys of their own");
  }
}

MPOPT_DECL void read_params_through_table(const config_object& params, std::initializer_list<std::string_view> keys,
                                          std::string_view who, std::span<const field_ref> table,
                                          std::initializer_list<std::string_view> by_hand) {
  params.allow_only(keys, who);
  const auto listed = [](std::initializer_list<std::string_view> names, std::string_view name) {
    return std::ranges::find(names, name) != names.end();
  };
  const auto read = [&](const auto& self, std::span<const field_ref> fields) -> void {
    for (const field_ref& f : fields) {
      if (f.kind == field_kind::group) self(self, f.members(f.at));
      else if (listed(keys, f.name) && !listed(by_hand, f.name)) read_config_field(params, f.name, f);
    }
  };
  read(read, table);
}

MPOPT_DECL const field_ref& field_named(std::span<const field_ref> table, std::string_view name) {
  const auto it = std::ranges::find(table, name, &field_ref::name);
  if (it == table.end()) fail("mpopt bug: the options table has no field ", name);
  return *it;
}

MPOPT_DECL nlohmann::json parse_json_strictly(std::string_view text) {
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

MPOPT_DECL void deepspeed_reader::scheduler() {
  const nlohmann::json* j = top_.find("scheduler");
  if (j && !j->is_null())
    c_.schedule = read_schedule(config_object(*j, "scheduler", top_), schedule_source::deepspeed_config);
}

}  // namespace detail

MPOPT_DECL deepspeed_config deepspeed_config::parse(const nlohmann::json& j, int world_size,
                                                    const nlohmann::json& auto_values) {
  return detail::deepspeed_reader(j, world_size, auto_values).read();
}

MPOPT_DECL deepspeed_config deepspeed_config::parse_text(std::string_view text, int world_size,
                                                         const nlohmann::json& auto_values) {
  return parse(detail::parse_json_strictly(text), world_size, auto_values);
}

MPOPT_DECL deepspeed_config deepspeed_config::read(const std::filesystem::path& file, int world_size,
                                                   const nlohmann::json& auto_values) {
  std::ifstream in(file, std::ios::binary);
  if (!in) detail::fail("cannot open the DeepSpeed configuration '", file.string(), "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) detail::fail("cannot read the DeepSpeed configuration '", file.string(), "'");
  try {
    return parse_text(text, world_size, auto_values);
  } catch (const error& e) {
    detail::fail(file.string(), ": ", e.message());
  }
}

MPOPT_DECL std::string deepspeed_config::summary() const {
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
  if (offload_optimizer) s += ", optimizer state in host memory (offload_optimizer)";
  if (schedule) (s += ", ") += schedule_name(*schedule);
  return s;
}

}  // namespace mpopt
