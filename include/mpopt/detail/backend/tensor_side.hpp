// mpopt — where a backend wants the model's tensors: where its state lives (host, cuda), unless it
// says otherwise (offload: the tensors on the device, the state on the host).
#pragma once

#include <concepts>
#include <type_traits>

#include "../../tensor.hpp"

namespace mpopt::detail {

/// Backend B keeps the model's tensors apart from its state.
template <class B>
concept says_tensor_space = requires {
  { B::tensor_space } -> std::convertible_to<memory_space>;
};

/// The memory the model's tensors (and flat groups' buffers) live in under backend B.
template <class B>
constexpr memory_space tensor_space_of() {
  if constexpr (says_tensor_space<B>) return B::tensor_space;
  else return B::space;
}

template <class B, class T>
concept names_tensor_buffer = requires { typename B::template tensor_buffer<T>; };

/// The buffer a flat group's parameters and gradients live in under backend B.
template <class B, class T>
struct tensor_buffer_of {
  using type = typename B::template buffer<T>;
};
template <class B, class T>
  requires names_tensor_buffer<B, T>
struct tensor_buffer_of<B, T> {
  using type = typename B::template tensor_buffer<T>;
};
template <class B, class T>
using tensor_buffer_t = typename tensor_buffer_of<B, T>::type;

template <class C>
concept says_space = requires {
  { C::space } -> std::convertible_to<memory_space>;
};

/// The memory communicator C's collectives read and write: device where C says so (nccl).
template <class C>
constexpr memory_space communicator_space() {
  if constexpr (says_space<C>) return C::space;
  else return memory_space::host;
}

/// C's collectives work in the memory of the model's tensors, not in the state's (offload over
/// nccl): the buckets live, and the passes over them run, on the tensors' side (B::collective_side).
template <class B, class C>
concept collectives_on_tensor_side =
    communicator_space<C>() != B::space && communicator_space<C>() == tensor_space_of<B>();

/// Made with this tag, a backend serves a communicator whose collectives are on its tensors' side.
struct tensor_side_collectives {};

/// The buffer a collective of C reads or writes under backend B.
template <class B, class C, class T>
using collective_buffer_t =
    std::conditional_t<collectives_on_tensor_side<B, C>, tensor_buffer_t<B, T>, typename B::template buffer<T>>;

}  // namespace mpopt::detail
