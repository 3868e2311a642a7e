// mpopt — how an exchange (partition.hpp) schedules its bucket collectives: which buckets backward
// has completed, and the staging slots lent to collectives until their results are taken.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "flat_layout.hpp"

namespace mpopt::detail {

/// Which buckets backward has completed (grad_ready), handed out last bucket first: the order of a
/// backward pass, and the same on every rank whatever order its tensors were reported in, as the
/// collectives must be.
class ready_buckets {
 public:
  MPOPT_DECL void assign(const std::vector<bucket>& buckets, std::size_t tensors);

  /// Tensor i is done; false if it was reported already since restart().
  bool report(std::size_t i) {
    if (reported_[i]) return false;
    reported_[i] = 1;
    for (std::uint32_t b = tensor_buckets_[i].first; b < tensor_buckets_[i].last; ++b) --pending_[b];
    return true;
  }
  /// Whether a bucket is left to take, and whether it and every bucket after it are complete.
  bool any_left() const { return taken_ < buckets_; }
  bool next_complete() const { return any_left() && pending_[next()] == 0; }
  /// The next bucket, counted as taken.
  std::size_t take() {
    const std::size_t b = next();
    ++taken_;
    return b;
  }
  /// Whether every bucket holding tensor i was taken.
  bool taken(std::size_t i) const { return tensor_buckets_[i].first + taken_ >= buckets_; }

  /// A new micro-step: nothing reported, nothing taken.
  void restart() {
    taken_ = 0;
    std::fill(reported_.begin(), reported_.end(), std::uint8_t(0));
    std::copy(size_.begin(), size_.end(), pending_.begin());
  }

  std::size_t bytes() const {
    return tensor_buckets_.capacity() * sizeof(range) + (size_.capacity() + pending_.capacity()) * sizeof(std::uint32_t) +
           reported_.capacity();
  }

 private:
  std::size_t next() const { return buckets_ - 1 - taken_; }

  struct range {
    std::uint32_t first, last;
  };
  std::size_t buckets_ = 0, taken_ = 0;
  std::vector<range> tensor_buckets_;  // the buckets holding each tensor
  std::vector<std::uint32_t> size_;    // per bucket: its tensors
  std::vector<std::uint32_t> pending_;  // per bucket: its tensors not reported yet
  std::vector<std::uint8_t> reported_;  // per tensor
};

/// Staging slots lent in turn to collectives in flight (optimizer_options::overlap_comm): a slot
/// holds one collective's request and what to do with its result (a Job) until the exchange takes
/// it (finish(job, slot)). Results are taken oldest first, so they land in the order the
/// collectives started. A request that completed when it started (no overlap) is finished at once.
/// If a collective fails, the others' results are dropped with it (the call throws, nothing held).
template <class Request, class Job>
class in_flight {
 public:
  in_flight() = default;
  in_flight(const in_flight&) = delete;
  in_flight& operator=(const in_flight&) = delete;
  /// The slots' memory goes with their owner: whatever is still in flight lands first.
  ~in_flight() { abandon(); }

  void resize(std::size_t slots) { slots_.resize(slots); }
  std::size_t slots() const { return slots_.size(); }
  std::size_t bytes() const { return slots_.capacity() * sizeof(slot); }
  bool empty() const { return held_ == 0; }

  /// The next slot in turn, free: the collective it held, if any, waited for and finished.
  template <class Finish>
  std::size_t free_slot(Finish&& finish) {
    if (held_ == slots_.size()) or_abandon([&] { finish_oldest(finish); });
    return (oldest_ + held_) % slots_.size();
  }
  /// Slot s (from free_slot) holds r for job j; what has completed is finished.
  template <class Finish>
  void hold(std::size_t s, Request r, Job j, Finish&& finish) {
    slots_[s] = {std::move(r), j};
    ++held_;
    progress(finish);
  }
  /// Finishes, oldest first, what has completed (testing moves collectives along); stops at the
  /// first still running.
  template <class Finish>
  void progress(Finish&& finish) {
    or_abandon([&] {
      while (held_ != 0 && slots_[oldest_].request.test()) take(finish);
    });
  }
  /// Waits for and finishes the collectives, oldest first, while keep_waiting(oldest job) (all of them by default).
  template <class Finish, class While>
  void drain(Finish&& finish, While&& keep_waiting) {
    or_abandon([&] {
      while (held_ != 0 && keep_waiting(slots_[oldest_].job)) finish_oldest(finish);
    });
  }
  template <class Finish>
  void drain(Finish&& finish) {
    drain(finish, [](const Job&) { return true; });
  }
  /// Whether any held job satisfies pred.
  template <class Pred>
  bool any(Pred&& pred) const {
    for (std::size_t k = 0; k < held_; ++k)
      if (pred(slots_[(oldest_ + k) % slots_.size()].job)) return true;
    return false;
  }
  /// Drops every collective's result (after one failed), once it has landed: nothing may write
  /// into a slot that is lent again. Their own failures add nothing to the first.
  void abandon() noexcept {
    for (std::size_t k = 0; k < held_; ++k) try {
        slots_[(oldest_ + k) % slots_.size()].request.wait();
      } catch (...) {
      }
    for (auto& s : slots_) s.request = Request{};
    oldest_ = held_ = 0;
  }

 private:
  template <class F>
  void or_abandon(F&& f) {
    try {
      f();
    } catch (...) {
      abandon();
      throw;
    }
  }
  template <class Finish>
  void finish_oldest(Finish& finish) {
    slots_[oldest_].request.wait();
    take(finish);
  }
  /// The oldest slot is complete: freed, then finished (a throw leaves the ring consistent).
  template <class Finish>
  void take(Finish& finish) {
    const std::size_t s = oldest_;
    oldest_ = (oldest_ + 1) % slots_.size();
    --held_;
    finish(slots_[s].job, s);
  }

  struct slot {
    Request request;
    Job job{};
  };
  std::vector<slot> slots_;
  std::size_t oldest_ = 0, held_ = 0;
};

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "in_flight.ipp"
#endif
