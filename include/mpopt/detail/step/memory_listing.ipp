// mpopt — the memory report's lines (memory_listing.hpp): inline header-only, else compiled once by
// <mpopt/src.hpp>.
#pragma once

#include "memory_listing.hpp"

namespace mpopt::detail {

MPOPT_DECL void list_flat_group(mpopt::memory_report& r, const std::string& label, std::size_t param_bytes,
                                std::size_t grad_bytes) {
  r.buffers.push_back({label + " parameters", "flat parameter buffer (views handed to the model)", param_bytes, true});
  r.buffers.push_back({label + " gradients", "flat gradient buffer", grad_bytes, true});
}

MPOPT_DECL void list_held_gradients(mpopt::memory_report& r, const std::string& label, std::size_t bytes) {
  r.buffers.push_back({label + " gradients", "gradients of the model's parameters, held by the optimizer", bytes, true});
}

MPOPT_DECL void list_user_tensors(mpopt::memory_report& r, std::size_t param_bytes, std::size_t grad_bytes) {
  if (param_bytes) r.buffers.push_back({"parameters", "the model's parameter tensors", param_bytes, false});
  if (grad_bytes) r.buffers.push_back({"gradients", "the model's gradient tensors", grad_bytes, false});
}

MPOPT_DECL void list_state(mpopt::memory_report& r, std::size_t elements, bool has_master, bool remainders,
                           std::span<const std::string_view> names, std::span<const std::size_t> buffer_elements,
                           std::string_view rule, std::string_view state, std::size_t state_bits, std::size_t block) {
  if (remainders)
    r.buffers.push_back({"master remainder", "the low 16 bits of the fp32 master weights (remainder16)", elements * 2, true});
  else if (has_master)
    r.buffers.push_back({"master", "fp32 master weights", elements * 4, true});
  const std::string of = std::string(rule) + " state (" + std::string(state) + ")";
  for (std::size_t k = 0; k < names.size(); ++k) {
    const std::string name(names[k]);
    const std::size_t n = buffer_elements[k];
    r.buffers.push_back(
        {name, block ? of + ": " + std::to_string(state_bits) + "-bit codes" : of, (n * state_bits + 7) / 8, true});
    if (block)
      r.buffers.push_back(
          {name + " scales", of + ": an fp32 scale per block of " + std::to_string(block), n / block * 4, true});
  }
}

MPOPT_DECL void list_workspaces(mpopt::memory_report& r, std::string_view purpose, std::size_t bytes,
                                std::span<const std::size_t> expert_bytes) {
  if (bytes) r.buffers.push_back({"communicator workspace", std::string(purpose), bytes, true});
  for (std::size_t k = 0; k < expert_bytes.size(); ++k)
    if (expert_bytes[k])
      r.buffers.push_back(
          {"expert communicator " + std::to_string(k) + " workspace", std::string(purpose), expert_bytes[k], true});
}

}  // namespace mpopt::detail
