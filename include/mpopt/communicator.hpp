// mpopt — communicator policies: the collectives the optimizer runs across data-parallel ranks.
// Counts are elements, never bytes; every rank calls every collective in the same order.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "detail/options/validate.hpp"
#include "numeric.hpp"

namespace mpopt {

enum class reduce_op { sum, max };

/// The collective vocabulary, for each element type the optimizer communicates.
template <class C>
concept communicator = requires(C& c, const C& cc, std::span<float> f, std::span<const float> cf,
                                std::span<double> d, std::span<std::uint8_t> u, std::span<const std::uint8_t> cu,
                                std::span<std::uint64_t> w, std::span<const std::size_t> counts) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  { C::name } -> std::convertible_to<std::string_view>;
  c.all_reduce(f, reduce_op::sum);
  c.all_reduce(d, reduce_op::sum);
  c.all_reduce(u, reduce_op::max);
  c.all_reduce(w, reduce_op::max);
  c.reduce_scatter(cf, f, reduce_op::sum);
  c.reduce_scatter(cf, f, counts, reduce_op::sum);
  c.all_gather(cf, f);
  c.all_gather(f, counts);
  c.all_to_all(cf, f);
  c.all_to_all(cu, u);  // 1-bit compression: sign bits
  c.all_gather(u, counts);
  c.broadcast(f, 0);
  c.barrier();
};

/// A collective left in flight: test() says whether it has completed (moving it along, as MPI
/// progresses nonblocking collectives only inside its calls), wait() returns once it has. Both
/// throw mpopt::error if it failed. Until then its buffers are the collective's. A
/// default-constructed request is complete; a request destroyed in flight is abandoned (its
/// collective may still complete, but nothing waits for it).
template <class R>
concept collective_request = std::default_initializable<R> && std::movable<R> && requires(R& r) {
  { r.test() } -> std::same_as<bool>;
  r.wait();
};

/// A communicator that can leave collectives in flight (optimizer_options::overlap_comm): start_X
/// begins what X does and returns its request. Every rank starts its collectives, blocking or not,
/// in the same order; requests may be waited for in any order.
template <class C>
concept nonblocking_communicator =
    communicator<C> && requires(C& c, std::span<float> f, std::span<const float> cf, std::span<const std::size_t> counts) {
      typename C::request;
      requires collective_request<typename C::request>;
      { c.start_all_reduce(f, reduce_op::sum) } -> std::same_as<typename C::request>;
      { c.start_reduce_scatter(cf, f, counts, reduce_op::sum) } -> std::same_as<typename C::request>;
      { c.start_all_gather(f, counts) } -> std::same_as<typename C::request>;
    };

namespace detail {
/// The block-size rule shared by every communicator, checked before any data moves: the input holds
/// in_blocks equal blocks and the output out_blocks blocks of the same size.
inline void check_blocks(std::string_view what, std::size_t in, std::size_t out, std::size_t in_blocks,
                         std::size_t out_blocks) {
  if (in * out_blocks != out * in_blocks)
    fail(what, ": ", in, " input elements do not fit ", out, " output elements for this world size");
}

/// The rule of the variable-count collectives: one count per rank, adding up to the whole buffer.
/// `mine`, when given, is the size of this rank's own piece, which must match its count.
inline void check_counts(std::string_view what, std::size_t whole, std::span<const std::size_t> counts, int rank,
                         int size, std::optional<std::size_t> mine = std::nullopt) {
  if (counts.size() != std::size_t(size)) fail(what, ": ", counts.size(), " counts for ", size, " ranks");
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  if (total != whole) fail(what, ": the counts add up to ", total, " elements, the buffer has ", whole);
  if (mine && counts[std::size_t(rank)] != *mine)
    fail(what, ": rank ", rank, "'s count is ", counts[std::size_t(rank)], " but its piece has ", *mine, " elements");
}
}  // namespace detail

/// One rank: every collective is the identity.
struct single_process {
  static constexpr std::string_view name = "single_process";
  int rank() const { return 0; }
  int size() const { return 1; }

  template <class T>
  void all_reduce(std::span<T>, reduce_op) {}
  /// out = my block of the reduction of in over ranks (block r has out.size() elements).
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op) {
    detail::check_blocks("reduce_scatter", in.size(), out.size(), 1, 1);
    std::copy(in.begin(), in.end(), out.begin());
  }
  /// Variable pieces: rank r gets the next counts[r] elements of the reduction, in rank order.
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts, reduce_op) {
    detail::check_counts("reduce_scatter", in.size(), counts, 0, 1, out.size());
    std::copy(in.begin(), in.end(), out.begin());
  }
  /// In place: rank r's piece is the counts[r] elements after those of ranks < r; on return every
  /// rank holds every piece.
  template <class T>
  void all_gather(std::span<T> data, std::span<const std::size_t> counts) {
    detail::check_counts("all_gather", data.size(), counts, 0, 1);
  }
  /// out = the in of every rank, in rank order.
  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    detail::check_blocks("all_gather", in.size(), out.size(), 1, 1);
    std::copy(in.begin(), in.end(), out.begin());
  }
  /// Block j of in goes to rank j; block i of out comes from rank i.
  template <class T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    detail::check_blocks("all_to_all", in.size(), out.size(), 1, 1);
    std::copy(in.begin(), in.end(), out.begin());
  }
  template <class T>
  void broadcast(std::span<T>, int root) {
    if (root != 0) detail::fail("broadcast: root ", root, " is not a rank of a single process");
  }
  void barrier() {}

  /// Over one rank a collective is complete once started.
  struct request {
    bool test() { return true; }
    void wait() {}
  };
  template <class T>
  request start_all_reduce(std::span<T>, reduce_op) {
    return {};
  }
  template <class T>
  request start_reduce_scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts,
                               reduce_op op) {
    reduce_scatter(in, out, counts, op);
    return {};
  }
  template <class T>
  request start_all_gather(std::span<T> data, std::span<const std::size_t> counts) {
    all_gather(data, counts);
    return {};
  }
};

static_assert(nonblocking_communicator<single_process>);

}  // namespace mpopt
