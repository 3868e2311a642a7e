// mpopt — a communicator that counts what this rank hands to the collectives, for the step status.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

#include "../../communicator.hpp"
#include "../../error.hpp"
#include "../options/validate.hpp"

namespace mpopt::detail {

/// Forwards every collective to C and adds up the bytes this rank contributes: the whole input of
/// an all-reduce, reduce-scatter or all-to-all, its own piece of an all-gather, a broadcast's data
/// at the root. An fp32 all-reduce of P parameters counts 4P. A collective that fails says which
/// call of the optimizer it was part of (at()), so a timeout names the step a rank missed. One
/// metered `under` another (an expert group's communicator, under the optimizer's) adds its bytes
/// to that one's and names its failures by that one's call and step.
template <communicator C>
class metered {
 public:
  static constexpr std::string_view name = C::name;

  explicit metered(C inner, metered* under = nullptr) : inner_(std::move(inner)), under_(under) {}

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
    meter().bytes_ += data.size_bytes();
  }
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    named([&] { inner_.reduce_scatter(in, out, op); });
    meter().bytes_ += in.size_bytes();
  }
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts, reduce_op op) {
    named([&] { inner_.reduce_scatter(in, out, counts, op); });
    meter().bytes_ += in.size_bytes();
  }
  template <class T>
  void all_gather(std::span<T> data, std::span<const std::size_t> counts) {
    named([&] { inner_.all_gather(data, counts); });
    meter().bytes_ += counts[std::size_t(rank())] * sizeof(T);
  }
  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    named([&] { inner_.all_gather(in, out); });
    meter().bytes_ += in.size_bytes();
  }
  template <class T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    named([&] { inner_.all_to_all(in, out); });
    meter().bytes_ += in.size_bytes();
  }
  template <class T>
  void broadcast(std::span<T> data, int root) {
    named([&] { inner_.broadcast(data, root); });
    if (rank() == root) meter().bytes_ += data.size_bytes();
  }
  void barrier() {
    named([&] { inner_.barrier(); });
  }

  /// A collective in flight, whose failure names the call and step that started it. start_X(...,
  /// false), or over a communicator without nonblocking collectives (the optimizer refuses
  /// overlap_comm there), runs the blocking X: its request is complete when it is returned.
  class request {
   public:
    request() = default;
    bool test() {
      return named_as([&] { return inner_.test(); });
    }
    void wait() {
      named_as([&] { inner_.wait(); });
    }

   private:
    friend metered;
    struct complete {
      bool test() { return true; }
      void wait() {}
    };
    using inner_request = decltype([] {
      if constexpr (nonblocking_communicator<C>) return typename C::request{};
      else return complete{};
    }());
    request(inner_request r, metered& m)
        : inner_(std::move(r)), call_(m.meter().call_), step_(m.meter().step_), rank_(m.rank()), size_(m.size()) {}
    template <class F>
    auto named_as(F&& f) {
      return name_failure(f, call_, step_, rank_, size_);
    }
    inner_request inner_;
    std::string_view call_;
    std::uint64_t step_ = 0;
    int rank_ = 0, size_ = 1;
  };

  template <class T>
  request start_all_reduce(std::span<T> data, reduce_op op, bool in_flight = true) {
    meter().bytes_ += data.size_bytes();
    return started(in_flight, [&](auto& c) { return c.start_all_reduce(data, op); }, [&](auto& c) { c.all_reduce(data, op); });
  }
  template <class T>
  request start_reduce_scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts,
                               reduce_op op, bool in_flight = true) {
    meter().bytes_ += in.size_bytes();
    return started(in_flight, [&](auto& c) { return c.start_reduce_scatter(in, out, counts, op); },
                   [&](auto& c) { c.reduce_scatter(in, out, counts, op); });
  }
  template <class T>
  request start_all_gather(std::span<T> data, std::span<const std::size_t> counts, bool in_flight = true) {
    meter().bytes_ += counts[std::size_t(rank())] * sizeof(T);
    return started(in_flight, [&](auto& c) { return c.start_all_gather(data, counts); },
                   [&](auto& c) { c.all_gather(data, counts); });
  }

 private:
  template <class F>
  static auto name_failure(F&& f, std::string_view call, std::uint64_t step, int rank, int size) {
    try {
      return f();
    } catch (const error& e) {
      fail(e.message(), " (rank ", rank, " of ", size, ", in ", call, " at step ", step, ")");
    }
  }
  template <class F>
  void named(F&& f) {
    name_failure(f, meter().call_, meter().step_, rank(), size());
  }
  /// Where bytes and names are kept: here, or in the communicator this one is metered under.
  metered& meter() { return under_ ? *under_ : *this; }
  /// Starts a collective: start(inner) in flight where C can, blocking(inner) otherwise.
  template <class Start, class Blocking>
  request started(bool in_flight, Start&& start, Blocking&& blocking) {
    if constexpr (nonblocking_communicator<C>)
      if (in_flight) return request(name_failure([&] { return start(inner_); }, meter().call_, meter().step_, rank(), size()), *this);
    named([&] { blocking(inner_); });
    return request({}, *this);
  }

  C inner_;
  metered* under_ = nullptr;
  std::uint64_t bytes_ = 0;
  std::string_view call_ = "finalize()";
  std::uint64_t step_ = 0;
};

}  // namespace mpopt::detail
