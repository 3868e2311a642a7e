// mpopt — the optimizer part of a DeepSpeed configuration (its JSON schema, deepspeed.ai/docs/config-json),
// read into a plain struct: precision, loss scaler, ZeRO stage, update rule and every option, with
// DeepSpeed's defaults where a key is absent. Every key is either read, or accepted as one that
// changes nothing here (listed in ignored_keys), or refused with an mpopt::error naming its path;
// a value mpopt does not support is refused the same way. make_optimizer.hpp builds the optimizer.
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
  MPOPT_DECL static deepspeed_config parse(const nlohmann::json& j, int world_size = 1);
  /// The same from JSON text; a key given twice in one object is refused, as DeepSpeed does.
  MPOPT_DECL static deepspeed_config parse_text(std::string_view text, int world_size = 1);
  /// The same from a file; messages start with the file's name.
  MPOPT_DECL static deepspeed_config read(const std::filesystem::path& file, int world_size = 1);

  /// One line: "fp16 with a dynamic loss scale, ZeRO stage 2, AdamW".
  MPOPT_DECL std::string summary() const;
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

/// Reader of one DeepSpeed configuration (deepspeed_config::parse).
class deepspeed_reader {
 public:
  MPOPT_DECL deepspeed_reader(const nlohmann::json& j, int world_size);

  MPOPT_DECL deepspeed_config read();

 private:
  void ignore(std::string path) { c_.ignored_keys.push_back(std::move(path)); }
  /// `key` may hold any bool and changes nothing here.
  MPOPT_DECL void ignore_flag(const config_object& o, std::string_view key);
  /// `key` may hold only `supported` (DeepSpeed's default, what mpopt does); `why` says why not the other.
  MPOPT_DECL static void require_flag(const config_object& o, std::string_view key, bool supported,
                                      std::string_view why);

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
