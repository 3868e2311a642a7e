// mpopt — what a partition's exchange (partition.hpp) works with during one call of the optimizer:
// the backend, the communicators (the optimizer's, and each group's data-parallel one), the
// options, the user's tensors and where the window stands.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>

#include "../../communicator.hpp"
#include "../../options.hpp"
#include "../../tensor.hpp"
#include "../comm/metered.hpp"
#include "../passes/step_data.hpp"
#include "../backend/tensor_side.hpp"

namespace mpopt::detail {

/// A communicator that works on device memory (mpopt::nccl) enqueues its collectives on a stream.
template <class C>
concept stream_communicator = requires(const C& c) {
  requires C::space == memory_space::device;
  c.stream();
};

/// C has a wait of its own for its collectives.
template <class C>
concept synchronizes = requires(C& c) { c.synchronize(); };

/// A device communicator's collectives share the backend's stream: its own wait polls, so one a
/// rank never joins fails on the communicator's timeout (nccl_options) instead of blocking forever.
template <class C>
void wait_for_collectives(metered<C>& comm) {
  if constexpr (stream_communicator<C> && synchronizes<C>) comm.inner().synchronize();
}

/// The backend can run on the communicator's stream, or the communicator has none, or its
/// collectives run on the backend's tensors' side (offload), made with the communicator, whose
/// passes over the buckets collective_side() gives (backend_policy checks them).
template <class Backend, class C>
concept runs_on_stream_of = !stream_communicator<C> || requires(const C& c) { Backend(c.stream()); } ||
                            (collectives_on_tensor_side<Backend, C> && requires(const C& c, Backend& b) {
                              Backend(tensor_side_collectives{}, c);
                              b.collective_side();
                            });

/// The backend of an optimizer over `comm`: on the communicator's stream when it has one, so that
/// passes and collectives run in the order the step issues them, with no wait between them.
template <class Backend, class C>
Backend backend_for(const C& comm) {
  if constexpr (collectives_on_tensor_side<Backend, C>) return Backend(tensor_side_collectives{}, comm);
  else if constexpr (stream_communicator<C>) return Backend(comm.stream());
  else return Backend();
}

/// Waits for the passes and collectives issued so far.
template <class Backend, class C>
void wait_for_all(Backend& backend, metered<C>& comm) {
  wait_for_collectives(comm);
  backend.synchronize();
}

template <class Precision, class Backend, class Communicator>
struct exchange_context {
  using precision = Precision;

  Backend& backend;
  /// The optimizer's communicator: every rank's. Overflow and the global norm are agreed over it.
  metered<Communicator>& comm;
  /// Each group's data-parallel communicator: the ranks holding the same elements of it (comm, or
  /// an expert group's own, which the optimizer meters under comm). Empty: comm for every group.
  std::span<metered<Communicator>* const> group_comms;
  const optimizer_options& options;
  /// The user's tensors and this rank's update work, reading the gradients as they are (no
  /// accumulator): an exchange adds its own buffers to a copy.
  step_data<Precision> tensors;
  /// Micro-steps of this window already folded in: 0 while the window's first backward is handled.
  int micro_step = 0;
  /// What gradients are multiplied by before they are summed across ranks (gradient_predivide).
  float send_scale = 1.0f;
  /// This window's gradients stay on their rank (the rule's driver says so: 1-bit LAMB's compression).
  bool local = false;

  /// Group g's data-parallel communicator.
  metered<Communicator>& comm_of(std::size_t g) const { return group_comms.empty() ? comm : *group_comms[g]; }
  /// Whether some group is data-parallel over other ranks than the optimizer's communicator.
  bool has_expert_groups() const {
    for (auto* c : group_comms)
      if (c != &comm) return true;
    return false;
  }

  void wait() const {
    for (auto* c : group_comms)
      if (c != &comm) wait_for_collectives(*c);
    wait_for_all(backend, comm);
  }
  /// Before a collective reads what the backend's passes wrote: a communicator on the backend's
  /// stream gets it in order; any other waits for the passes.
  void before_send() const {
    if constexpr (!stream_communicator<Communicator>) backend.synchronize();
  }
  /// The backend's passes over what the collectives read and write (the buckets): the backend
  /// itself, unless they are on its tensors' side (tensor_side.hpp), whose passes it then gives.
  decltype(auto) collective_side() const {
    if constexpr (collectives_on_tensor_side<Backend, Communicator>) return backend.collective_side();
    else return (backend);
  }
  /// Whether this backward is the window's last.
  bool at_boundary() const { return micro_step + 1 == options.accumulation_steps; }
};

}  // namespace mpopt::detail
