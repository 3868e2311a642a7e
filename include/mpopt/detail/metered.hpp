// mpopt — a communicator that counts what this rank hands to the collectives, for the step status.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

#include "../communicator.hpp"

namespace mpopt::detail {

/// Forwards every collective to C and adds up the bytes this rank contributes: the whole input of
/// an all-reduce, reduce-scatter or all-to-all, its own piece of an all-gather, a broadcast's data
/// at the root. An fp32 all-reduce of P parameters counts 4P.
template <communicator C>
class metered {
 public:
  static constexpr std::string_view name = C::name;

  explicit metered(C inner) : inner_(std::move(inner)) {}

  C& inner() { return inner_; }
  const C& inner() const { return inner_; }
  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }
  /// Bytes counted since the last call.
  std::uint64_t take_bytes() { return std::exchange(bytes_, 0); }

  template <class T>
  void all_reduce(std::span<T> data, reduce_op op) {
    inner_.all_reduce(data, op);
    bytes_ += data.size_bytes();
  }
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    inner_.reduce_scatter(in, out, op);
    bytes_ += in.size_bytes();
  }
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts, reduce_op op) {
    inner_.reduce_scatter(in, out, counts, op);
    bytes_ += in.size_bytes();
  }
  template <class T>
  void all_gather(std::span<T> data, std::span<const std::size_t> counts) {
    inner_.all_gather(data, counts);
    bytes_ += counts[std::size_t(rank())] * sizeof(T);
  }
  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    inner_.all_gather(in, out);
    bytes_ += in.size_bytes();
  }
  template <class T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    inner_.all_to_all(in, out);
    bytes_ += in.size_bytes();
  }
  template <class T>
  void broadcast(std::span<T> data, int root) {
    inner_.broadcast(data, root);
    if (rank() == root) bytes_ += data.size_bytes();
  }
  void barrier() { inner_.barrier(); }

 private:
  C inner_;
  std::uint64_t bytes_ = 0;
};

}  // namespace mpopt::detail
