// A communicator that leaves nothing in flight: single_process's blocking collectives, without its
// request and start_ members (a communicator, not a nonblocking_communicator).
#pragma once

#include <string_view>

#include <mpopt/communicator.hpp>

struct blocking_communicator {
  static constexpr std::string_view name = "blocking";
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class... A>
  void all_reduce(A... a) { mpopt::single_process{}.all_reduce(a...); }
  template <class... A>
  void reduce_scatter(A... a) { mpopt::single_process{}.reduce_scatter(a...); }
  template <class... A>
  void all_gather(A... a) { mpopt::single_process{}.all_gather(a...); }
  template <class... A>
  void all_to_all(A... a) { mpopt::single_process{}.all_to_all(a...); }
  template <class... A>
  void broadcast(A... a) { mpopt::single_process{}.broadcast(a...); }
  void barrier() {}
};
static_assert(mpopt::communicator<blocking_communicator> && !mpopt::nonblocking_communicator<blocking_communicator>);
