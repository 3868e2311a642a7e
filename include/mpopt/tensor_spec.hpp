// mpopt — how a tensor is described where the optimizer allocates it or stores it: its shape
// (tensor_shape, for checkpoints) and, for a flat group, its name, size and shape (tensor_spec).
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/options/validate.hpp"

namespace mpopt {

/// A tensor's dimensions, as the model sees them ([out, in] for a linear layer's weight). The
/// optimizer works on the flat elements; the shape is stored in checkpoints, so that other tools
/// (PyTorch, tools/mpopt_checkpoint.py) get [64, 32] rather than [2048], and a matrix rule (Muon,
/// rule.hpp) reads it. Empty: none given, and the file says [n].
class tensor_shape {
  // Integers that can count elements: not bool, not characters (a string is no shape).
  template <class V>
  static constexpr bool dimension_type = std::integral<V> && !std::same_as<V, bool> && !std::same_as<V, char> &&
                                         !std::same_as<V, signed char> && !std::same_as<V, unsigned char> &&
                                         !std::same_as<V, wchar_t> && !std::same_as<V, char8_t> &&
                                         !std::same_as<V, char16_t> && !std::same_as<V, char32_t>;

 public:
  tensor_shape() = default;
  tensor_shape(std::initializer_list<std::int64_t> dims) : dims_(dims) {}
  /// Any range of integers: a std::vector<std::int64_t>, a std::array<std::size_t, 2>, ... (a
  /// range for-loop's begin and end, not `<ranges>`: this header is in every optimizer's unit).
  template <class R, class V = std::remove_cvref_t<decltype(*std::begin(std::declval<const R&>()))>>
    requires requires(const R& r) { std::end(r); } && dimension_type<V>
  tensor_shape(const R& dims) {
    for (const V d : dims) {
      if constexpr (std::is_unsigned_v<V> && sizeof(V) >= sizeof(std::int64_t))
        if (d > V(std::numeric_limits<std::int64_t>::max()))
          detail::fail("tensor shape: dimension ", d, " is beyond a 64-bit signed integer");
      dims_.push_back(static_cast<std::int64_t>(d));
    }
  }

  std::span<const std::int64_t> dims() const { return dims_; }
  bool empty() const { return dims_.empty(); }
  friend bool operator==(const tensor_shape&, const tensor_shape&) = default;

 private:
  std::vector<std::int64_t> dims_;
};

/// The elements [first, first + count) of a tensor whose optimizer state this rank holds
/// (optimizer::owned): all of them unless zero1/zero2 split the tensor across the ranks.
struct owned_elements {
  std::size_t first, count;
};

/// A tensor the optimizer allocates in a flat group: its name, element count and, optionally, its
/// shape (whose product must be `size`).
struct tensor_spec {
  std::string name;
  std::size_t size;
  tensor_shape shape = {};
};

}  // namespace mpopt
