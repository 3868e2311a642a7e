// mpopt — communicator policies: the collectives the optimizer runs across data-parallel ranks.
// Counts are elements, never bytes; every rank calls every collective in the same order.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>

#include "detail/validate.hpp"
#include "numeric.hpp"

namespace mpopt {

enum class reduce_op { sum, max };

/// The collective vocabulary, for each element type the optimizer communicates.
template <class C>
concept communicator = requires(C& c, const C& cc, std::span<float> f, std::span<const float> cf,
                                std::span<double> d, std::span<std::uint8_t> u) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  { C::name } -> std::convertible_to<std::string_view>;
  c.all_reduce(f, reduce_op::sum);
  c.all_reduce(d, reduce_op::sum);
  c.all_reduce(u, reduce_op::max);
  c.reduce_scatter(cf, f, reduce_op::sum);
  c.all_gather(cf, f);
  c.all_to_all(cf, f);
  c.broadcast(f, 0);
  c.barrier();
};

namespace detail {
/// The block-size rule shared by every communicator, checked before any data moves: the input holds
/// in_blocks equal blocks and the output out_blocks blocks of the same size.
inline void check_blocks(std::string_view what, std::size_t in, std::size_t out, std::size_t in_blocks,
                         std::size_t out_blocks) {
  if (in * out_blocks != out * in_blocks)
    fail(what, ": ", in, " input elements do not fit ", out, " output elements for this world size");
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
};

static_assert(communicator<single_process>);

}  // namespace mpopt
