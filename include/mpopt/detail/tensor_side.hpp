// mpopt — where a backend wants the model's tensors: where its state lives (host, cuda), unless it
// says otherwise (offload: the tensors on the device, the state on the host).
#pragma once

#include "../tensor.hpp"

namespace mpopt::detail {

/// The memory the model's tensors (and flat groups' buffers) live in under backend B.
template <class B>
constexpr memory_space tensor_space_of() {
  if constexpr (requires { B::tensor_space; }) return B::tensor_space;
  else return B::space;
}

/// The buffer a flat group's parameters and gradients live in under backend B.
template <class B, class T>
struct tensor_buffer_of {
  using type = typename B::template buffer<T>;
};
template <class B, class T>
  requires requires { typename B::template tensor_buffer<T>; }
struct tensor_buffer_of<B, T> {
  using type = typename B::template tensor_buffer<T>;
};
template <class B, class T>
using tensor_buffer_t = typename tensor_buffer_of<B, T>::type;

}  // namespace mpopt::detail
