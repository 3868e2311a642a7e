// The GPUs of the standalone MPI test programs: all ranks decide together whether to run, so that
// mpirun sees one exit status (77 on every rank for a skip).
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <string>

/// The CUDA devices of the rank with the fewest; when none, `why` says so.
struct cuda_ranks {
  int devices = 0;
  std::string why;
};

inline cuda_ranks cuda_devices_on_every_rank() {
  int mine = 0;
  const cudaError_t probe = cudaGetDeviceCount(&mine);
  if (probe != cudaSuccess) mine = 0;
  cuda_ranks r;
  MPI_Allreduce(&mine, &r.devices, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (r.devices == 0)
    r.why = std::string("no CUDA device: ") + (probe != cudaSuccess ? cudaGetErrorString(probe) : "another rank has none");
  return r;
}
