// mpopt — how the library sees a user's tensor: element type, data pointer, element count, memory space,
// and the storage type (float, mpopt::half, mpopt::bfloat16) whose bits its elements have.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "numeric.hpp"

namespace mpopt {

/// Where a tensor's memory lives. The host backend accepts only host memory.
enum class memory_space { host, device };

/// Customization point. Specialize for your tensor type with:
///   using element_type = ...;                         // float, mpopt::half or mpopt::bfloat16, or a
///                                                     // type numeric_traits maps to one
///   static element_type* data(T&);                   // contiguous storage
///   static std::size_t size(const T&);               // number of elements
///   static constexpr memory_space space = memory_space::host;   // or, when it varies per object:
///   static memory_space space(const T&);
template <class T>
struct tensor_traits;

template <class T>
using tensor_element_t = typename tensor_traits<std::remove_cvref_t<T>>::element_type;

namespace detail {
template <class T>
concept fixed_memory_space = requires {
  { tensor_traits<std::remove_cvref_t<T>>::space } -> std::convertible_to<memory_space>;
};
template <class T>
concept per_object_memory_space = requires(const std::remove_cvref_t<T>& t) {
  { tensor_traits<std::remove_cvref_t<T>>::space(t) } -> std::convertible_to<memory_space>;
};
}  // namespace detail

/// A type the optimizer can read and write through tensor_traits. (A const tensor is not one: the
/// optimizer writes parameters.)
template <class T>
concept tensor = requires(std::remove_reference_t<T>& t) {
  typename tensor_traits<std::remove_cvref_t<T>>::element_type;
  { tensor_traits<std::remove_cvref_t<T>>::data(t) } -> std::same_as<tensor_element_t<T>*>;
  { tensor_traits<std::remove_cvref_t<T>>::size(std::as_const(t)) } -> std::convertible_to<std::size_t>;
} && (detail::fixed_memory_space<T> || detail::per_object_memory_space<T>);

/// A tensor whose elements are exactly E.
template <class T, class E>
concept tensor_of = tensor<T> && std::same_as<tensor_element_t<T>, E>;

/// The mpopt type whose bits a tensor's elements have: storage_t of its element type.
template <class T>
using tensor_storage_t = storage_t<tensor_element_t<T>>;

/// A tensor whose elements have the bits of E: E itself, or a type numeric_traits maps to E (such
/// as Eigen::half or __half for mpopt::half). What the optimizer takes where its param_type or
/// grad_type is E.
template <class T, class E>
concept tensor_storing =
    tensor<T> && detail::has_numeric_traits<tensor_element_t<T>> && std::same_as<tensor_storage_t<T>, E>;

/// A non-owning view of contiguous elements: the adapter for raw pointers.
template <class E>
struct view {
  E* data = nullptr;
  std::size_t size = 0;
  memory_space space = memory_space::host;
};

template <class E>
struct tensor_traits<view<E>> {
  using element_type = E;
  static E* data(const view<E>& v) { return v.data; }
  static std::size_t size(const view<E>& v) { return v.size; }
  static memory_space space(const view<E>& v) { return v.space; }
};

template <class E, std::size_t Extent>
  requires(!std::is_const_v<E>)
struct tensor_traits<std::span<E, Extent>> {
  using element_type = E;
  static E* data(const std::span<E, Extent>& s) { return s.data(); }
  static std::size_t size(const std::span<E, Extent>& s) { return s.size(); }
  static constexpr memory_space space = memory_space::host;
};

template <class E, class Alloc>
struct tensor_traits<std::vector<E, Alloc>> {
  using element_type = E;
  static E* data(std::vector<E, Alloc>& v) { return v.data(); }
  static std::size_t size(const std::vector<E, Alloc>& v) { return v.size(); }
  static constexpr memory_space space = memory_space::host;
};

/// The (pointer, size, memory space) of any tensor.
template <tensor T>
view<tensor_element_t<T>> as_view(T&& t) {
  using traits = tensor_traits<std::remove_cvref_t<T>>;
  memory_space space;
  if constexpr (detail::per_object_memory_space<T>)
    space = traits::space(std::as_const(t));
  else
    space = traits::space;
  return {traits::data(t), static_cast<std::size_t>(traits::size(std::as_const(t))), space};
}

namespace detail {
/// as_view with the data pointer as the storage type's: how the optimizer registers a tensor of
/// Eigen::half as one of mpopt::half. numeric_traits declared the bits the same, storage_t checked
/// size, alignment and trivial copyability.
template <tensor T>
view<tensor_storage_t<T>> storage_view(T&& t) {
  const auto v = as_view(t);
  return {reinterpret_cast<tensor_storage_t<T>*>(v.data), v.size, v.space};
}

/// A raw pointer given where add() takes a tensor: it has no length. (A pointer and a count is
/// add(param_ptr, n), whose gradient the optimizer holds.)
template <class P, class G>
concept raw_pointer_pair =
    (std::is_pointer_v<std::remove_cvref_t<P>> && !std::is_integral_v<std::remove_cvref_t<G>>) ||
    std::is_pointer_v<std::remove_cvref_t<G>>;

/// Stops compilation on what to write instead of a raw pointer (only instantiated where one was
/// given).
template <class P, class G>
void refuse_raw_pointer() {
  static_assert(!raw_pointer_pair<P, G>,
                "a raw pointer is not a tensor (it has no length): add(param_ptr, grad_ptr, n, name[, shape]), "
                "add(param_ptr, n, name[, shape]) (the optimizer holds the gradient), or mpopt::view<T>{ptr, n}");
}
}  // namespace detail

}  // namespace mpopt
