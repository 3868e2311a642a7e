// mpopt — load() from a file that stores the state or the master otherwise than the optimizer
// (state_precision.hpp): what this rank holds of each tensor is read in the file's storage, as fp32,
// and stored in the optimizer's. State is decoded here, whatever the file's storage, and encoded by
// the optimizer (checkpoint_subject::encode_state), as its steps encode it; a master is converted
// here: an fp32 master split into the parameter and its remainder, or joined from them. Untyped:
// compiled once, not once per optimizer type.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "checkpoint_subject.hpp"
#include "../config.hpp"
#include "state_file.hpp"
#include "state_format.hpp"

namespace mpopt::detail {

/// The values of f's codes, by code (the unsigned map's where `nonnegative`), for decode_stored.
MPOPT_DECL std::vector<float> code_values(const state_format& f, bool nonnegative);

/// The fp32 values of out.size() elements of a buffer stored as `f`, the first at the start of a
/// block: from its values, or from its codes (`data`), their `values` and the blocks' scales.
MPOPT_DECL void decode_stored(const state_format& f, const float* values, const std::byte* data, const float* scales,
                              std::span<float> out);

/// Every state buffer of every tensor this rank holds, read from a file that stores state as `from`
/// (rank `replica`'s copy), in this optimizer's storage: the file's blocks around the rank's
/// elements decoded, and the elements encoded by the subject.
MPOPT_DECL void read_converted_state(const state_reader& file, checkpoint_subject& s, const checkpoint_view& v,
                                     const state_format& from, int replica);

/// Every master this rank holds, read from a file that keeps masters as `from`, in this optimizer's
/// storage. Into remainder16 each parameter, whole, becomes its master rounded to nearest (a tie
/// away from zero), as the remainder requires; into none the parameter, read as it is, is the master.
MPOPT_DECL void read_converted_master(const state_reader& file, checkpoint_io& io, const checkpoint_view& v,
                                      const master_format& from, int replica);

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "state_conversion.ipp"
#endif
