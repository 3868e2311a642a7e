// mpopt — the separately compiled mode's one unit: with MPOPT_SEPARATE_COMPILATION defined in every
// unit of a program, exactly one of them includes this header, which defines the cold code that the
// headers then only declare (detail/config.hpp, MPOPT_DECL). Header-only builds never include it.
#pragma once

#if !defined(MPOPT_SEPARATE_COMPILATION)
#error "<mpopt/src.hpp> is for builds with MPOPT_SEPARATE_COMPILATION defined in every unit; header-only builds need no src.hpp"
#endif

#include "version.hpp"  // first: C++20, or a clear error

#include "deepspeed_config.ipp"
#include "detail/agree.ipp"
#include "detail/checkpoint_flow.ipp"
#include "detail/checkpoint_io.ipp"
#include "detail/checkpoint_pieces.ipp"
#include "detail/checksum.ipp"
#include "detail/config_object.ipp"
#include "detail/expert_placement.ipp"
#include "detail/field_refs.ipp"
#include "detail/fields_json.ipp"
#include "detail/flat_layout.ipp"
#include "detail/in_flight.ipp"
#include "detail/json_fields.ipp"
#include "detail/memory_listing.ipp"
#include "detail/partition_layout.ipp"
#include "detail/replacing_file.ipp"
#include "detail/same_settings.ipp"
#include "detail/saved_state.ipp"
#include "detail/spike_guard.ipp"
#include "detail/state_access.ipp"
#include "detail/state_file.ipp"
#include "detail/step_counts.ipp"
#include "detail/tensor_registry.ipp"
#include "detail/validate.ipp"
#include "detail/work_list.ipp"
#include "loss_scale.ipp"
#include "memory_report.ipp"
#include "options.ipp"
