// mpopt — the optimizer part of a DeepSpeed configuration (its JSON schema, deepspeed.ai/docs/config-json),
// read into a plain struct: precision, loss scaler, ZeRO stage, update rule, schedule and every option,
// with DeepSpeed's defaults where a key is absent. Every key is either read, or accepted as one that
// changes nothing here (listed in ignored_keys), or refused naming its path and why; a value mpopt
// does not support is refused the same way. One mpopt::error reports every problem of a file.
// make_optimizer.hpp builds the optimizer.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "adam.hpp"
#include "detail/config.hpp"
#include "detail/options/field_refs.hpp"
#include "detail/options/config_object.hpp"
#include "detail/options/validate.hpp"
#include "error.hpp"
#include "lamb.hpp"
#include "loss_scale.hpp"
#include "lr_schedule.hpp"
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
  /// scheduler: DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR or OneCycle; make_optimizer
  /// sets it (optimizer::set_schedule).
  std::optional<lr_schedule> schedule = std::nullopt;
  /// zero_optimization.offload_optimizer.device "cpu" (or cpu_offload): the fp32 masters, moments and
  /// step in host memory. make_optimizer's optimizers (host backend) keep them there whatever it
  /// says; an engine whose tensors are in device memory picks the mpopt::offload backend for it.
  bool offload_optimizer = false;
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
  /// train_batch_size by. `auto_values`: what to read where the file says "auto", by path, as the
  /// Hugging Face Trainer fills them in ({"optimizer.params.lr": 3e-4, ...}); a path the file gives
  /// another value must hold the same, and one it lacks is passed over. Throws one mpopt::error
  /// naming every key it cannot take, with the reason.
  MPOPT_DECL static deepspeed_config parse(const nlohmann::json& j, int world_size = 1,
                                           const nlohmann::json& auto_values = nlohmann::json::object());
  /// The same from JSON text; a key given twice in one object is refused, as DeepSpeed does.
  MPOPT_DECL static deepspeed_config parse_text(std::string_view text, int world_size = 1,
                                                const nlohmann::json& auto_values = nlohmann::json::object());
  /// The same from a file; messages start with the file's name.
  MPOPT_DECL static deepspeed_config read(const std::filesystem::path& file, int world_size = 1,
                                          const nlohmann::json& auto_values = nlohmann::json::object());

  /// One line: "fp16 with a dynamic loss scale, ZeRO stage 2, AdamW".
  MPOPT_DECL std::string summary() const;
};

namespace detail {

/// How the reader takes a top-level key of DeepSpeed's that is not an optimizer setting.
enum class engine_key_use : std::uint8_t {
  ignored,           ///< the engine's: accepted whatever it holds, and listed in ignored_keys
  refused_when_on,   ///< ignored while off (false, or "enabled": false); refused on, with `why`
  refused_when_off,  ///< ignored while on (true, the default); refused off, with `why`
};
struct engine_key {
  std::string_view key;
  engine_key_use use;
  std::string_view why;  ///< what the key does that mpopt does not, or why it changes nothing here
};

/// DeepSpeed 0.19.6's top-level keys besides those the reader reads (deepspeed/runtime/config.py).
inline constexpr engine_key deepspeed_engine_keys[] = {
    {"steps_per_print", engine_key_use::ignored, "logging"},
    {"wall_clock_breakdown", engine_key_use::ignored, "timing"},
    {"dump_state", engine_key_use::ignored, "logging"},
    {"memory_breakdown", engine_key_use::ignored, "logging"},
    {"log_level", engine_key_use::ignored, "logging"},
    {"tensorboard", engine_key_use::ignored, "monitoring"},
    {"wandb", engine_key_use::ignored, "monitoring"},
    {"csv_monitor", engine_key_use::ignored, "monitoring"},
    {"comet", engine_key_use::ignored, "monitoring"},
    {"comms_logger", engine_key_use::ignored, "monitoring"},
    {"flops_profiler", engine_key_use::ignored, "profiling"},
    {"timers", engine_key_use::ignored, "profiling"},
    {"autotuning", engine_key_use::ignored, "the autotuner's search"},
    {"activation_checkpointing", engine_key_use::ignored, "the model's activations"},
    {"checkpoint", engine_key_use::ignored, "the engine's checkpoint files (mpopt writes its own)"},
    {"nebula", engine_key_use::ignored, "the engine's checkpoint files"},
    {"datastates_ckpt", engine_key_use::ignored, "the engine's checkpoint files"},
    {"aio", engine_key_use::ignored, "NVMe I/O"},
    {"dataloader_drop_last", engine_key_use::ignored, "the data loader"},
    {"curriculum_learning", engine_key_use::ignored, "the data the engine feeds"},
    {"data_efficiency", engine_key_use::ignored, "the data the engine feeds"},
    {"progressive_layer_drop", engine_key_use::ignored, "the model's forward"},
    {"sparse_attention", engine_key_use::ignored, "the model's attention"},
    {"compression_training", engine_key_use::ignored, "the model's weights and activations"},
    {"quantize_training", engine_key_use::ignored, "the model's weights"},
    {"weight_quantization", engine_key_use::ignored, "inference"},
    {"hybrid_engine", engine_key_use::ignored, "inference"},
    {"torch_autocast", engine_key_use::ignored, "the model's forward"},
    {"compile", engine_key_use::ignored, "compiling the model"},
    {"graph_harvesting", engine_key_use::ignored, "kernel launches"},
    {"vocabulary_size", engine_key_use::ignored, "a warning about the model"},
    {"disable_allgather", engine_key_use::ignored, "stored only, by DeepSpeed too"},
    {"pipeline", engine_key_use::ignored, "pipeline stages: each stage's engine steps its own optimizer"},
    {"tensor_parallel", engine_key_use::ignored, "the model's partition: each rank's optimizer steps its part"},
    {"sequence_parallel_size", engine_key_use::ignored, "the engine's groups: the communicator given decides"},
    {"seq_parallel_communication_data_type", engine_key_use::ignored, "sequence-parallel traffic"},
    {"use_data_before_expert_parallelism", engine_key_use::ignored, "the engine's groups: the communicators given decide"},
    {"expert_parallel", engine_key_use::ignored, "the engine's experts: it registers them (add_expert_group)"},
    {"zero_allow_untested_optimizer", engine_key_use::ignored, "every mpopt rule is tested under ZeRO"},
    {"zero_force_ds_cpu_optimizer", engine_key_use::ignored, "mpopt is the optimizer"},
    {"amp", engine_key_use::refused_when_on, "Apex AMP casts the model; mpopt's mixed precision is fp16 or bf16 with fp32 masters"},
    {"elasticity", engine_key_use::refused_when_on, "elastic training derives the batch sizes; mpopt reads them as written"},
    {"sparse_gradients", engine_key_use::refused_when_on, "mpopt's gradients are dense"},
    {"managed_gradient_accumulation", engine_key_use::refused_when_off,
     "mpopt counts gradient_accumulation_steps micro-steps itself"},
};

/// Keys of zero_optimization that configure stage 3 only (DeepSpeed reads them at 0-2, unused), with
/// their aliases and deprecated names.
inline constexpr std::string_view deepspeed_stage3_keys[] = {
    "sub_group_size", "prefetch_bucket_size", "stage3_prefetch_bucket_size", "param_persistence_threshold",
    "stage3_param_persistence_threshold", "model_persistence_threshold", "stage3_model_persistence_threshold",
    "max_live_parameters", "stage3_max_live_parameters", "max_reuse_distance", "stage3_max_reuse_distance",
    "gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "module_granularity_threshold", "stage3_module_granularity_threshold",
    "use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params", "allgather_sequential",
    "stage3_allgather_sequential", "zero_hpz_partition_size", "zero_quantized_weights",
    "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "zeropp_loco_param", "mics_shard_size",
    "mics_hierarchical_params_gather", "memory_efficient_linear", "pipeline_loading_checkpoint", "override_module_apply",
    "log_trace_cache_warnings", "enable_sanity_checks", "save_muon_momentum_buffer_in_memory", "leaf_module"};

/// Reads `key` of `o` into field `f`, by the field's kind (number, flag, integer, choice), checked
/// by the field's check; messages name the key's path. An integer's bounds are the check's within
/// what the field's type holds.
MPOPT_DECL void read_config_field(const config_object& o, std::string_view key, const field_ref& f);

/// A rule's optimizer.params read through its options' table: refuses each key `keys` (DeepSpeed's
/// names, for rule `who`) does not list, then reads each listed key that names a field of `table`
/// (read_config_field), except those `by_hand` names, which the rule maps itself. A nested group's
/// fields are read at the same level: DeepSpeed's keys are flat. A table field DeepSpeed does not
/// name stays unread, and its name is refused as a key.
MPOPT_DECL void read_params_through_table(const config_object& params, std::initializer_list<std::string_view> keys,
                                          std::string_view who, std::span<const field_ref> table,
                                          std::initializer_list<std::string_view> by_hand = {});

/// The field of `table` named `name`; one the reader relies on, so its absence is a bug.
MPOPT_DECL const field_ref& field_named(std::span<const field_ref> table, std::string_view name);

/// `j` with each of `values` (an object of paths, "optimizer.params.lr") put where `j` says "auto";
/// a path `j` gives another value to must hold the same (else a problem), one it lacks is passed over.
MPOPT_DECL nlohmann::json with_auto_values(const nlohmann::json& j, const nlohmann::json& values,
                                           config_problems& problems);

/// Reader of one DeepSpeed configuration (deepspeed_config::parse).
class deepspeed_reader {
 public:
  MPOPT_DECL deepspeed_reader(const nlohmann::json& j, int world_size, const nlohmann::json& auto_values);

  /// Reads every part, gathering the problems; throws them together, if any.
  MPOPT_DECL deepspeed_config read();

 private:
  void ignore(std::string path) { c_.ignored_keys.push_back(std::move(path)); }
  /// `key` may hold any bool and changes nothing here.
  MPOPT_DECL void ignore_flag(const config_object& o, std::string_view key);
  /// `key` may hold only `supported` (DeepSpeed's default, what mpopt does); `why` says why not the other.
  MPOPT_DECL static void require_flag(const config_object& o, std::string_view key, bool supported,
                                      std::string_view why);
  /// A top-level key of deepspeed_engine_keys.
  MPOPT_DECL void engine_key_of(const engine_key& k);
  MPOPT_DECL void data_types();
  /// zero_optimization.offload_optimizer, offload_param and the deprecated cpu_offload*.
  MPOPT_DECL void offload(const config_object& zero);

  MPOPT_DECL void top_keys();

  MPOPT_DECL void precision();

  MPOPT_DECL void zero();

  MPOPT_DECL void optimizer();

  /// What every rule's params share besides the keys its table reads: betas, a list that fills
  /// the table's beta1 and beta2; max_grad_norm and amsgrad, which DeepSpeed refuses.
  MPOPT_DECL static void common_params(const config_object& p, std::span<const field_ref> table);

  MPOPT_DECL void adam_params(const config_object& p, bool adamw);

  MPOPT_DECL void lamb_params(const config_object& p);

  MPOPT_DECL void onebit_lamb_params(const config_object& p);

  MPOPT_DECL void onebit_adam_params(const config_object& p);

  MPOPT_DECL void zero_one_adam_params(const config_object& p);

  /// What the compressing rules share: the common parameters, two keys DeepSpeed takes and ignores
  /// (no bias correction, eps outside the root), the communication backend (the communicator
  /// make_optimizer is given does the communicating), compression_scale, and no ZeRO.
  MPOPT_DECL void compressing_params(const config_object& p, std::span<const field_ref> table, std::string_view title);

  /// DeepSpeed's first call only sets up state and counts as a step: freeze_step F gives F - 1
  /// warm-up updates, which is mpopt's freeze_step.
  MPOPT_DECL static std::uint64_t freeze_step(const config_object& p);

  /// gradient_accumulation_steps, or what DeepSpeed derives from the batch sizes.
  MPOPT_DECL void batch();

  MPOPT_DECL void step_options();

  MPOPT_DECL void scheduler();

  config_problems problems_;
  nlohmann::json filled_;  ///< the configuration with its "auto" values filled in
  config_object top_;
  int world_;
  deepspeed_config c_;
};

/// Parses JSON text, refusing a key given twice in one object (Python's json keeps the last one;
/// DeepSpeed loads its file with a hook that raises instead).
MPOPT_DECL nlohmann::json parse_json_strictly(std::string_view text);

}  // namespace detail

}  // namespace mpopt

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "deepspeed_config.ipp"
#endif
