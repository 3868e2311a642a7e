// mpopt — what the cold code (the cross-rank checks, agreement on an outcome, expert placement) needs
// of a communicator, behind virtual calls: rank, size and three collectives. That code is then
// compiled once per program, not once per communicator type; any communicator (metered.hpp's
// included) is adapted by collectives_of, at the call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "../../communicator.hpp"

namespace mpopt::detail {

class cold_collectives {
 public:
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// In place, the largest of every rank's values (communicator.hpp's all_reduce, reduce_op::max).
  virtual void all_reduce_max(std::span<std::uint8_t> data) = 0;
  virtual void all_reduce_max(std::span<std::uint64_t> data) = 0;
  /// In place, rank r's piece the counts[r] bytes after those of ranks < r.
  virtual void all_gather(std::span<std::uint8_t> data, std::span<const std::size_t> counts) = 0;

 protected:
  ~cold_collectives() = default;
};

template <class Comm>
class collectives_of final : public cold_collectives {
 public:
  explicit collectives_of(Comm& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void all_reduce_max(std::span<std::uint8_t> data) override { comm_.all_reduce(data, reduce_op::max); }
  void all_reduce_max(std::span<std::uint64_t> data) override { comm_.all_reduce(data, reduce_op::max); }
  void all_gather(std::span<std::uint8_t> data, std::span<const std::size_t> counts) override {
    comm_.all_gather(data, counts);
  }

 private:
  Comm& comm_;
};

/// Where a function takes cold_collectives&, any communicator: adapted, or itself.
template <class Comm>
concept adapted_communicator = !std::derived_from<Comm, cold_collectives>;

}  // namespace mpopt::detail
