// mpopt — a CUDA stream that is either its holder's own or borrowed from the caller, for the cuda
// backend and the NCCL communicator. Needs only the CUDA runtime (nccl.hpp includes no Thrust).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <type_traits>

namespace mpopt::detail {

/// Destroys a stream its holder made; leaves a borrowed one to its owner. A destructor cannot
/// report an error, so the result is dropped.
struct stream_destroyer {
  bool owned = true;
  void operator()(cudaStream_t s) const noexcept {
    if (owned) (void)cudaStreamDestroy(s);
  }
};

using stream_holder = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, stream_destroyer>;

}  // namespace mpopt::detail
