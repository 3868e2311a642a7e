// The whole library compiles under nvcc (cuda_headers.cu, for every architecture in -Dgpu_arch,
// warnings as errors), tensors of CUDA's __half and __nv_bfloat16 train on the host bit for bit like
// mpopt's (numeric_traits from <mpopt/interop.hpp>), and on a GPU the shared element math gives the
// host's bits. Without a GPU nvcc compiles it as a check (tests/cuda_check.sh) and g++ builds this
// file's host checks, with CUDA's 16-bit headers; the test then prints why and exits 77 (skipped).
#include <mpopt/mpopt.hpp>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

#include <mpopt/interop.hpp>  // after CUDA's 16-bit headers: declares __half and __nv_bfloat16

// Device memory holding __half goes to an fp16 optimizer as mpopt::view<__half>, no cast.
static_assert(mpopt::tensor_storing<mpopt::view<__half>, mpopt::half>);
static_assert(mpopt::tensor_storing<std::vector<__nv_bfloat16>, mpopt::bfloat16>);
static_assert(!mpopt::tensor_storing<std::vector<__half>, mpopt::bfloat16>);

namespace {

#ifdef __CUDACC__
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
#endif

/// Three Adam steps on host tensors of Cuda (__half or __nv_bfloat16) and of S, its mpopt type, from
/// the same bits; 0 when every parameter comes out the same.
template <class Precision, class Cuda>
int check_cuda_type(const char* what) {
  using S = typename Precision::param_type;
  using optimizer = mpopt::optimizer<Precision, mpopt::no_scaling, mpopt::replicated, mpopt::adam>;
  constexpr std::size_t n = 100;
  std::vector<S> p(n), g(n);
  std::vector<Cuda> cp(n), cg(n);
  for (std::size_t i = 0; i < n; ++i) cp[i] = std::bit_cast<Cuda>(p[i] = S(0.01f * float(i) - 0.3f));
  optimizer a, b;
  a.add_group({.lr = 1e-2}).add(p, g, "w");
  b.add_group({.lr = 1e-2}).add(cp, cg, "w");
  for (int step = 1; step <= 3; ++step) {
    for (std::size_t i = 0; i < n; ++i) cg[i] = std::bit_cast<Cuda>(g[i] = S(std::sin(float(i + step))));
    if (!a.step().applied || !b.step().applied) {
      std::fprintf(stderr, "cuda_headers: %s: a step was skipped\n", what);
      return 1;
    }
  }
  if (std::memcmp(p.data(), cp.data(), n * sizeof(S)) != 0 || std::bit_cast<S>(cp[7]) == S(0.01f * 7 - 0.3f)) {
    std::fprintf(stderr, "cuda_headers: %s tensors did not train like mpopt's\n", what);
    return 1;
  }
  return 0;
}

#ifdef __CUDACC__
int check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return 0;
  std::fprintf(stderr, "cuda_headers: %s: %s\n", what, cudaGetErrorString(e));
  return 1;
}
#endif

}  // namespace

int main() {
  // The host types instantiate under nvcc too.
  mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam> host_optimizer;
  (void)host_optimizer;
  if (check_cuda_type<mpopt::fp16, __half>("__half") || check_cuda_type<mpopt::bf16, __nv_bfloat16>("__nv_bfloat16"))
    return 1;
  std::printf("cuda_headers: host tensors of __half and __nv_bfloat16 train like mpopt::half and mpopt::bfloat16\n");
#ifndef __CUDACC__
  std::printf("cuda_headers: built by the host compiler; the device's checks need nvcc and a GPU: skipped\n");
  return 77;
#else

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
#endif
}
