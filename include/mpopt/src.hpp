// mpopt — the separately compiled mode's one unit: with MPOPT_SEPARATE_COMPILATION defined in every
// unit of a program, exactly one of them includes this header, which defines the cold code that the
// headers then only declare (detail/config.hpp, MPOPT_DECL), and the host passes of mpopt's own
// precisions and rules (detail/backend/host_instances.hpp). Header-only builds never include it.
#pragma once

#if !defined(MPOPT_SEPARATE_COMPILATION)
#error "<mpopt/src.hpp> is for builds with MPOPT_SEPARATE_COMPILATION defined in every unit; header-only builds need no src.hpp"
#endif

#include "version.hpp"  // first: C++20, or a clear error

#include "adam.hpp"
#include "host.hpp"
#include "host_passes.hpp"
#include "lamb.hpp"
#include "onebit_adam.hpp"
#include "onebit_lamb.hpp"
#include "zero_one_adam.hpp"

#include "deepspeed_config.ipp"
#include "detail/checkpoint/checkpoint_flow.ipp"
#include "detail/checkpoint/checkpoint_io.ipp"
#include "detail/checkpoint/checkpoint_pieces.ipp"
#include "detail/checkpoint/checksum.ipp"
#include "detail/checkpoint/json_fields.ipp"
#include "detail/checkpoint/replacing_file.ipp"
#include "detail/checkpoint/saved_state.ipp"
#include "detail/checkpoint/state_conversion.ipp"
#include "detail/checkpoint/state_file.ipp"
#include "detail/comm/agree.ipp"
#include "detail/comm/same_settings.ipp"
#include "detail/exchange/expert_placement.ipp"
#include "detail/exchange/flat_layout.ipp"
#include "detail/exchange/in_flight.ipp"
#include "detail/exchange/partition_layout.ipp"
#include "detail/options/config_object.ipp"
#include "detail/options/field_refs.ipp"
#include "detail/options/fields_json.ipp"
#include "detail/options/schedule_json.ipp"
#include "detail/options/validate.ipp"
#include "detail/passes/work_list.ipp"
#include "detail/step/memory_listing.ipp"
#include "detail/step/spike_guard.ipp"
#include "detail/step/state_access.ipp"
#include "detail/step/step_counts.ipp"
#include "detail/step/tensor_registry.ipp"
#include "loss_scale.ipp"
#include "lr_schedule.ipp"
#include "memory_report.ipp"
#include "options.ipp"

MPOPT_FOR_OWN_PRECISIONS(MPOPT_HOST_STEP_PASSES, )
MPOPT_HOST_FLAT_PASSES()
MPOPT_FOR_OWN_PRECISIONS(MPOPT_HOST_COMPRESSED_PASSES, )
MPOPT_FOR_OWN_PRECISIONS(MPOPT_HOST_ADAM_PASSES, )
MPOPT_FOR_OWN_PRECISIONS(MPOPT_HOST_LAMB_PASSES, )
MPOPT_FOR_OWN_PRECISIONS(MPOPT_HOST_ONEBIT_LAMB_PASSES, )
MPOPT_FOR_OWN_PRECISIONS(MPOPT_HOST_ONEBIT_ADAM_PASSES, )
MPOPT_FOR_OWN_PRECISIONS(MPOPT_HOST_ZERO_ONE_ADAM_PASSES, )
