// The whole library compiles under nvcc (for every architecture in -Dgpu_arch, warnings as
// errors), and on a GPU the shared element math gives the host's bits. Without a GPU the test
// prints why and exits 77 (skipped): the build itself is the check.
#include <mpopt/mpopt.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

namespace {

struct adam_inputs {
  float g, m, v, p;
};

/// One Adam element update per thread, through the same function the host backend calls.
__global__ void adam_elements(const adam_inputs* in, float* out, mpopt::detail::adam_coefficients c, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  float m = in[i].m, v = in[i].v;
  const float p = mpopt::detail::adam_update(in[i].g, m, v, in[i].p, c);
  out[3 * i] = p;
  out[3 * i + 1] = m;
  out[3 * i + 2] = v;
}

int check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return 0;
  std::fprintf(stderr, "cuda_headers: %s: %s\n", what, cudaGetErrorString(e));
  return 1;
}

}  // namespace

int main() {
  // The host types instantiate under nvcc too.
  mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam> host_optimizer;
  (void)host_optimizer;

  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::printf("cuda_headers: compiled for the device; no GPU here (%s): skipped\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "no device");
    return 77;
  }

  constexpr int n = 1 << 16;
  std::vector<adam_inputs> in(n);
  std::uint32_t state = 12345;
  auto next = [&] {  // xorshift: values of every magnitude and sign
    state ^= state << 13, state ^= state >> 17, state ^= state << 5;
    return float(int(state % 2000001) - 1000000) * 1e-6f * float(1 << (state % 13));
  };
  for (auto& x : in) x = {next(), next(), std::abs(next()), next()};
  const mpopt::detail::adam_coefficients c{1e-3f, 0.9f, 0.999f, 0.1f, 0.001f, 1.9f, 1.3f, 1e-8f, 0.01f, true};

  adam_inputs* d_in = nullptr;
  float* d_out = nullptr;
  std::vector<float> out(3 * std::size_t(n));
  if (check(cudaMalloc(&d_in, sizeof(adam_inputs) * n), "cudaMalloc") ||
      check(cudaMalloc(&d_out, sizeof(float) * out.size()), "cudaMalloc") ||
      check(cudaMemcpy(d_in, in.data(), sizeof(adam_inputs) * n, cudaMemcpyHostToDevice), "copy in"))
    return 1;
  adam_elements<<<n / 256, 256>>>(d_in, d_out, c, n);
  if (check(cudaGetLastError(), "launch") ||
      check(cudaMemcpy(out.data(), d_out, sizeof(float) * out.size(), cudaMemcpyDeviceToHost), "copy out"))
    return 1;

  int mismatches = 0;
  for (int i = 0; i < n; ++i) {
    float m = in[i].m, v = in[i].v;
    const float want[3] = {mpopt::detail::adam_update(in[i].g, m, v, in[i].p, c), m, v};
    if (std::memcmp(want, &out[3 * std::size_t(i)], sizeof want) != 0 && mismatches++ < 5)
      std::fprintf(stderr, "element %d: device %a %a %a, host %a %a %a\n", i, out[3 * i], out[3 * i + 1],
                   out[3 * i + 2], want[0], want[1], want[2]);
  }
  cudaFree(d_in);
  cudaFree(d_out);
  std::printf("cuda_headers: %d of %d Adam updates differ from the host's bits\n", mismatches, n);
  return mismatches == 0 ? 0 : 1;
}
