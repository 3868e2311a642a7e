// doctest's main for the CUDA test executables (suite 'cuda'): without a usable GPU it says why and
// exits 77, which meson reports as skipped; building them with nvcc was the check.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include <cuda_runtime.h>

int main(int argc, char** argv) {
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::printf("%s: built for the device; no GPU here (%s): skipped\n", argv[0],
                e != cudaSuccess ? cudaGetErrorString(e) : "no device");
    return 77;
  }
  return doctest::Context(argc, argv).run();
}
