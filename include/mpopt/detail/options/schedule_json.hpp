// mpopt — a learning-rate schedule (lr_schedule.hpp) as JSON: {"type": name, "params": {...}}, the
// shape of DeepSpeed's "scheduler" block under DeepSpeed's keys. The configuration reader reads it,
// and checkpoints write and read it.
#pragma once

#include <nlohmann/json.hpp>

#include "../../lr_schedule.hpp"
#include "../config.hpp"
#include "config_object.hpp"

namespace mpopt::detail {

/// Every field, an unset optional one as null.
MPOPT_DECL nlohmann::json schedule_json(const lr_schedule& s);

/// Where a schedule is read from: a DeepSpeed configuration names DeepSpeed's four schedulers and
/// may hold last_batch_iteration (-1 only); a checkpoint names any of mpopt's.
enum class schedule_source { deepspeed_config, checkpoint };

/// Reads {"type", "params"}: the type's fields that params holds (null unsets an optional one),
/// DeepSpeed's defaults for the rest, then validate(). Throws mpopt::error naming the key's path.
MPOPT_DECL lr_schedule read_schedule(const config_object& block, schedule_source from);

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "schedule_json.ipp"
#endif
