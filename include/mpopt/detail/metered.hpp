// mpopt — a communicator that counts what this rank hands to the collectives, for the step status.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

#include "../communicator.hpp"
#include "../error.hpp"
#include "validate.hpp"

namespace mpopt::detail {

/// Forwards every collective to C and adds up the bytes this rank contributes: the whole input of
/// an all-reduce, reduce-scatter or all-to-all, its own piece of an all-gather, a broadcast's data
/// at the root. An fp32 all-reduce of P parameters counts 4P. A collective that fails says which
/// call of the optimizer it was part of (at()), so a timeout names the step a rank missed.
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
  /// Names what the collectives that follow belong to: `call` (a string literal) and a step.
  void at(std::string_view call, std::uint64_t step) {
    call_ = call;
    step_ = step;
  }

  template <class T>
  void all_reduce(std::span<T> data, reduce_op op) {
    named([&] { inner_.all_reduce(data, op); });
    bytes_ += data.size_bytes();
  }
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    named([&] { inner_.reduce_scatter(in, out, op); });
    bytes_ += in.size_bytes();
  }
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts, reduce_op op) {
    named([&] { inner_.reduce_scatter(in, out, counts, op); });
    bytes_ += in.size_bytes();
  }
  template <class T>
  void all_gather(std::span<T> data, std::span<const std::size_t> counts) {
    named([&] { inner_.all_gather(data, counts); });
    bytes_ += counts[std::size_t(rank())] * sizeof(T);
  }
  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    named([&] { inner_.all_gather(in, out); });
    bytes_ += in.size_bytes();
  }
  template <class T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    named([&] { inner_.all_to_all(in, out); });
    bytes_ += in.size_bytes();
  }
  template <class T>
  void broadcast(std::span<T> data, int root) {
    named([&] { inner_.broadcast(data, root); });
    if (rank() == root) bytes_ += data.size_bytes();
  }
  void barrier() {
    named([&] { inner_.barrier(); });
  }

 private:
  template <class F>
  void named(F&& f) {
    try {
      f();
    } catch (const error& e) {
      fail(e.message(), " (rank ", rank(), " of ", size(), ", in ", call_, " at step ", step_, ")");
    }
  }

  C inner_;
  std::uint64_t bytes_ = 0;
  std::string_view call_ = "finalize()";
  std::uint64_t step_ = 0;
};

}  // namespace mpopt::detail
