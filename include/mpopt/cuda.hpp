// mpopt — the CUDA backend: the passes of detail/passes/passes.hpp as GPU kernels, written against Thrust
// so that the same source also builds with THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP and g++
// (the build CI runs, with no GPU). It owns no formula: each kernel thread runs a pass's body on
// four lanes (detail/lanes/quad_lanes.hpp), like the host backend runs it on 16 or 1.
//
// Layout: a block of 256 threads takes consecutive chunks of a work list (of up to 64 Ki elements
// each) until it holds 64 Ki elements or eight chunks, across tensors: a tensor's short last chunk
// shares a block with the next tensor's first, so a block's work hardly depends on the tensors'
// sizes. In each of
// its chunks thread t owns the 4-element vectors t, t + 256, t + 512, ... (a warp reads 512
// contiguous bytes per load). Per-chunk sums go through fixed lanes (element i of a chunk to lane
// i % 1024) and one pairwise tree, so they depend neither on the blocks nor on the device. On a GPU
// a block sums each chunk's lanes in shared memory; Thrust's OpenMP system writes them out and sums
// them in a second pass.
//
// Memory: every pointer handed to it (tensors, state, coefficients, outputs) is device memory (in
// the OMP build, host memory). Work lists and the tensor table are copied to the device the first
// time a pass sees them and kept: they are fixed once the optimizer is finalized, so after the first
// step nothing is allocated.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <type_traits>
#include <vector>

#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include "detail/passes/backend_passes.hpp"
#include "detail/config.hpp"
#include "detail/backend/device_buffer.hpp"
#include "detail/backend/device_reduce.hpp"
#include "detail/passes/pass_finish.hpp"
#include "detail/passes/passes.hpp"
#include "detail/lanes/quad_lanes.hpp"
#include "detail/passes/square_sum.hpp"
#include "detail/passes/step_data.hpp"
#include "detail/passes/work_list.hpp"
#include "tensor.hpp"

namespace mpopt {

namespace detail {

// 256, not fewer: a thread's loads are all it has in flight, and an H200 needs about 200k threads'
// worth to reach its bandwidth (64 per chunk reached 0.4 of a copy's).
constexpr std::size_t device_threads_per_chunk = 256;
constexpr std::size_t device_lanes_per_chunk = 4 * device_threads_per_chunk;

/// Whether a pass sums anything (its kernels then write every kind; see device_sums::write).
MPOPT_HOST_DEVICE bool sums_anything(const pass_outputs& o) { return o.sum || o.sum2 || o.sum64 || o.nonfinite || o.largest; }

/// A pass with nothing after it in its kernel (cuda::run).
struct no_finish {};

/// A block takes chunks until it holds this many elements, or this many chunks: blocks of tiny
/// tensors sum each chunk's lanes in turn, and too many in one block would leave the others idle.
constexpr std::size_t device_block_elements = chunk_elements;
constexpr std::size_t device_block_chunks = 8;

/// The chunks each block of a kernel takes: block b takes [first[b], first[b + 1]); null first:
/// chunk b (a flat pass, whose chunks all are full but the last).
struct device_blocks {
  const std::uint32_t* first = nullptr;
  MPOPT_HOST_DEVICE std::size_t begin(std::size_t b) const { return first ? first[b] : b; }
  MPOPT_HOST_DEVICE std::size_t end(std::size_t b) const { return first ? first[b + 1] : b + 1; }
};

/// Where the blocks of a work list start (device_blocks::first): consecutive chunks, a block closed
/// once it holds device_block_elements elements or device_block_chunks chunks.
inline std::vector<std::uint32_t> device_block_starts(const work_list& w) {
  std::vector<std::uint32_t> first{0};
  std::size_t elements = 0;
  for (std::size_t c = 0; c < w.size(); ++c) {
    elements += w[c].size;
    if (elements >= device_block_elements || c + 1 - first.back() == device_block_chunks || c + 1 == w.size()) {
      first.push_back(std::uint32_t(c + 1));
      elements = 0;
    }
  }
  return first;
}

/// Per-lane partial sums of a device pass, device_lanes_per_chunk per chunk.
struct device_partials {
  float* sum;
  float* sum2;
  double* sum64;
  std::uint8_t* nonfinite;
  float* largest;
};

/// One thread's sums over its four lanes.
struct device_sums {
  float sum[4] = {}, sum2[4] = {};
  double sum64[4] = {};
  bool any_nonfinite = false;
  quad max = quad(0.0f);

  MPOPT_HOST_DEVICE static bool holds(full_t, unsigned) { return true; }
  MPOPT_HOST_DEVICE static bool holds(quad_tail t, unsigned j) { return t.holds(j); }

  template <class Tail>
  MPOPT_HOST_DEVICE void square(std::size_t, quad x, Tail t) {
    for (unsigned j = 0; j < 4; ++j)
      if (holds(t, j)) sum[j] = fma(x.x[j], x.x[j], sum[j]);
  }
  template <class Tail>
  MPOPT_HOST_DEVICE void square2(std::size_t, quad x, Tail t) {
    for (unsigned j = 0; j < 4; ++j)
      if (holds(t, j)) sum2[j] = fma(x.x[j], x.x[j], sum2[j]);
  }
  /// Squares of floats are exact in double: contraction cannot change these.
  template <class Tail>
  MPOPT_HOST_DEVICE void square64(std::size_t, quad x, Tail t) {
    for (unsigned j = 0; j < 4; ++j)
      if (holds(t, j)) sum64[j] += double(x.x[j]) * double(x.x[j]);
  }
  template <class Tail>
  MPOPT_HOST_DEVICE void nonfinite(quad x, Tail t) {
    for (unsigned j = 0; j < 4; ++j)
      if (holds(t, j)) any_nonfinite |= detail::any_nonfinite(x.x[j], full_t{});
  }
  template <class Tail>
  MPOPT_HOST_DEVICE void largest(quad x, Tail t) {
    for (unsigned j = 0; j < 4; ++j)
      if (holds(t, j)) max.x[j] = detail::max(max.x[j], x.x[j]);
  }

  /// Lanes 4t .. 4t + 3 of chunk ci (thread index = ci * T + t). A pass that sums anything writes
  /// every kind (the totals kernel reads only its own): one predicate, not one per kind, stays alive
  /// across the element loop (ptxas spilled those).
  MPOPT_HOST_DEVICE void write(const pass_outputs& out, const device_partials& p, std::size_t thread) const {
    if (!sums_anything(out)) return;
    const std::size_t at = thread * 4;
    for (std::size_t j = 0; j < 4; ++j) {
      p.sum[at + j] = sum[j];
      p.sum2[at + j] = sum2[j];
      p.sum64[at + j] = sum64[j];
      p.nonfinite[at + j] = any_nonfinite;
      p.largest[at + j] = max.x[j];
    }
  }
};

/// Thread t's share of chunk ci of a pass, and its lanes' sums. Offsets within a chunk (at most
/// chunk_elements) are 32-bit and the tail vector is taken once, after the loop: few enough live
/// registers that ptxas spills none (suite 'sass' checks it; 64-bit offsets and the tail inside the
/// loop spilled).
template <class L, class Pass>
MPOPT_HOST_DEVICE device_sums chunk_share(const Pass& pass, std::size_t ci, unsigned t) {
  constexpr unsigned T = device_threads_per_chunk;
  const auto s = pass.at(ci);
  const unsigned n = unsigned(pass.size(ci));
  device_sums sums;
  if constexpr (granule_of<Pass>() > 0) {
    constexpr unsigned G = Pass::granule;
    for (unsigned g = t * G; g < n; g += T * G) pass.template apply_granule<L>(s, g, n - g < G ? n - g : G, sums);
  } else {
    unsigned i = 4 * t;
    for (; i + 4 <= n; i += 4 * T) pass.template apply<L>(s, i, full_t{}, sums);
    if (i < n) pass.template apply<L>(s, i, quad_tail{n - i}, sums);
  }
  return sums;
}

/// Thrust's OpenMP system: one thread of a block per index, its lanes of each of the block's chunks
/// written out for chunk_totals_kernel.
template <class Pass, class L>
struct chunk_kernel {
  Pass pass;
  device_blocks blocks;
  device_partials partials;

  MPOPT_HOST_DEVICE void operator()(std::size_t thread) const {
    constexpr unsigned T = device_threads_per_chunk;
    const std::size_t b = thread / T;
    const unsigned t = unsigned(thread % T);
    for (std::size_t ci = blocks.begin(b); ci < blocks.end(b); ++ci)
      chunk_share<L>(pass, ci, t).write(pass.out, partials, ci * T + t);
  }
};

struct chunk_totals_kernel {
  pass_outputs out;
  device_partials partials;

  MPOPT_HOST_DEVICE void operator()(std::size_t ci) const {
    constexpr std::size_t N = device_lanes_per_chunk;
    const std::size_t at = ci * N;
    const auto add = [](auto a, auto b) { return a + b; };
    if (out.sum) out.sum[ci] = lane_tree<N>(partials.sum + at, add);
    if (out.sum2) out.sum2[ci] = lane_tree<N>(partials.sum2 + at, add);
    if (out.sum64) {
      const double total = lane_tree<N>(partials.sum64 + at, add);
      out.sum64[ci] = out.round64 ? round_to_float_precision(total) : total;
    }
    if (out.nonfinite)
      out.nonfinite[ci] = lane_tree<N>(partials.nonfinite + at, [](std::uint8_t a, std::uint8_t b) { return std::uint8_t(a | b); });
    if (out.largest) out.largest[ci] = lane_tree<N>(partials.largest + at, [](float a, float b) { return detail::max(a, b); });
  }
};

#if MPOPT_DEVICE_IS_GPU
/// The block's lanes (thread t's at 4t .. 4t + 3, from `lane`) into one value by lane_tree's pairs,
/// the pairs of each width taken by the threads together: lane_tree's order, so its bits. Written
/// by thread 0 to *out. `room` is shared memory for the lanes.
template <class V, class Lane, class Op>
__device__ void block_lane_tree(void* room, Lane lane, Op op, V* out) {
  constexpr unsigned N = device_lanes_per_chunk;
  V* a = static_cast<V*>(room);
  for (unsigned j = 0; j < 4; ++j) a[4 * threadIdx.x + j] = lane(j);
  for (unsigned w = N / 2; w > 0; w /= 2) {
    __syncthreads();
    for (unsigned j = threadIdx.x; j < w; j += device_threads_per_chunk) a[j] = op(a[j], a[j + w]);
  }
  __syncthreads();
  if (threadIdx.x == 0) *out = a[0];
  __syncthreads();  // before the room is used again
}

/// The per-chunk sums of a block's threads (their lanes in s), made in the block and written for
/// chunk ci by thread 0. `room`: shared memory for device_lanes_per_chunk doubles.
__device__ void write_block_sums(const pass_outputs& out, const device_sums& s, double* room, std::size_t ci) {
  if (!sums_anything(out)) return;  // the same for the whole block
  const auto add = [](auto a, auto b) { return a + b; };
  if (out.sum) block_lane_tree(room, [&](unsigned j) { return s.sum[j]; }, add, out.sum + ci);
  if (out.sum2) block_lane_tree(room, [&](unsigned j) { return s.sum2[j]; }, add, out.sum2 + ci);
  if (out.sum64) {
    block_lane_tree(room, [&](unsigned j) { return s.sum64[j]; }, add, out.sum64 + ci);
    if (out.round64 && threadIdx.x == 0) out.sum64[ci] = round_to_float_precision(out.sum64[ci]);
  }
  if (out.nonfinite)
    block_lane_tree(room, [&](unsigned) { return std::uint8_t(s.any_nonfinite); },
                    [](std::uint8_t a, std::uint8_t b) { return std::uint8_t(a | b); }, out.nonfinite + ci);
  if (out.largest)
    block_lane_tree(room, [&](unsigned j) { return s.max.x[j]; }, [](float a, float b) { return detail::max(a, b); },
                    out.largest + ci);
}

/// Whether this block is the last of its grid to get here; if so, every other block's writes
/// before it are visible to it (read them with __ldcg: not through this SM's L1).
__device__ bool last_block(unsigned* arrived) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(arrived, 1u) == gridDim.x - 1;
  __syncthreads();
  return last;
}

/// step_sums_finish by a block: each thread adds every 256th chunk in order, then the threads' sums
/// go through block_lane_tree (each in its thread's first lane, the others zero). The norm's
/// partials are rounded to float precision, so they add exactly in any order while within about
/// 2^29 of each other: mostly the host's bits, always the same ones.
__device__ void finish_block(const step_sums_finish& f, double* room) {
  double squares = 0, nonfinite = 0;
  for (std::size_t c = threadIdx.x; c < f.chunks; c += device_threads_per_chunk) {
    squares += __ldcg(f.chunk_sums + c);
    nonfinite += __ldcg(f.chunk_nonfinite + c);
  }
  const auto add = [](double a, double b) { return a + b; };
  block_lane_tree(room, [&](unsigned j) { return j == 0 ? squares : 0.0; }, add, f.sums);
  block_lane_tree(room, [&](unsigned j) { return j == 0 ? nonfinite : 0.0; }, add, f.sums + 1);
  if (threadIdx.x == 0) f.decide();  // reads the sums thread 0 wrote
}

/// segments_finish by a block: a warp per segment (its lanes add every 32nd partial in order, then
/// a fixed tree of shuffles), then a thread per tensor.
template <class Scale>
__device__ void finish_block(const segments_finish<Scale>& f, double*) {
  constexpr unsigned W = 32, warps = device_threads_per_chunk / W;
  const unsigned lane = threadIdx.x % W;
  for (std::size_t s = threadIdx.x / W; s < f.segments; s += warps) {
    double v = 0;
    for (std::size_t i = f.offsets[s] + lane; i < f.offsets[s + 1]; i += W) v += double(__ldcg(f.partials + i));
    for (unsigned o = W / 2; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
    if (lane == 0) f.sums[s] = v;
  }
  __syncthreads();
  for (std::size_t t = threadIdx.x; t < f.tensors; t += device_threads_per_chunk) f.scale(t);
}

/// On a GPU: block blockIdx.x of a pass, one thread per block thread, each of its chunks' sums made
/// in the block; then, given a finish, the block that ends last runs it (`arrived` counts the
/// blocks, and is left at 0 for the next launch). One block per SM is all the launch bounds
/// promise: with the block size alone ptxas held these kernels to 64 registers, and three spilled
/// (suite 'sass').
template <class Pass, class L, class Finish>
__global__ void __launch_bounds__(device_threads_per_chunk, 1)
    chunk_block(Pass pass, device_blocks blocks, Finish finish, unsigned* arrived) {
  __shared__ double room[device_lanes_per_chunk];
  for (std::size_t ci = blocks.begin(blockIdx.x); ci < blocks.end(blockIdx.x); ++ci)
    write_block_sums(pass.out, chunk_share<L>(pass, ci, threadIdx.x), room, ci);
  if constexpr (!std::is_same_v<Finish, no_finish>) {
    if (!last_block(arrived)) return;
    finish_block(finish, room);
    if (threadIdx.x == 0) *arrived = 0;
  }
}
#endif

}  // namespace detail

class cuda : public detail::backend_passes<cuda> {
 public:
  static constexpr std::string_view name = "cuda";
  static constexpr memory_space space = memory_space::device;

  /// Optimizer state: device memory, zeroed.
  template <class T>
  using buffer = detail::device_buffer<T>;
  /// Small arrays the passes and the host's step logic share: mapped page-locked host memory, read
  /// by the host after synchronize().
  template <class T>
  using shared_vector = detail::pinned_vector<T>;

  cuda() {
#if MPOPT_DEVICE_IS_GPU
    stream_ = detail::own_stream();
#endif
  }
#if MPOPT_DEVICE_IS_GPU
  /// Runs on `stream`, which stays the caller's. The optimizer passes its NCCL communicator's, so
  /// that passes and collectives follow each other in order with no wait between them.
  explicit cuda(cudaStream_t stream) : stream_(stream, detail::stream_destroyer{false}) {
    if (!stream) detail::fail("cuda: a null stream (the legacy default stream) would serialize with every other");
  }
#endif
  cuda(cuda&&) noexcept = default;
  cuda& operator=(cuda&&) = delete;

#if MPOPT_DEVICE_IS_GPU
  cudaStream_t stream() const { return stream_.get(); }
#endif
  /// Kernels launched so far (docs/gpu-and-offload.md's table of kernels per step is checked against
  /// it): those a GPU launches, on Thrust's OpenMP system too, where a kernel's per-chunk sums and
  /// what its last block runs are loops of their own.
  std::size_t launches() const { return launches_; }
  /// Times the host has waited for the device so far (synchronize(), to_host()).
  std::size_t waits() const { return waits_; }

  /// Waits for every pass issued so far.
  void synchronize() const {
    ++waits_;
#if MPOPT_DEVICE_IS_GPU
    detail::cuda_check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
#endif
  }

  /// n elements between host and device memory (waits for the passes before it).
  template <class T>
  void to_host(T* dst, const T* src, std::size_t n) const {
#if MPOPT_DEVICE_IS_GPU
    detail::cuda_check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync");
    synchronize();
#else
    synchronize();  // counted, as on a GPU
    std::copy_n(src, n, dst);
#endif
  }
  template <class T>
  void to_device(T* dst, const T* src, std::size_t n) const {
#if MPOPT_DEVICE_IS_GPU
    detail::cuda_check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, stream()), "cudaMemcpyAsync");
#else
    std::copy_n(src, n, dst);
#endif
  }

  template <class T>
  void zero(T* p, std::size_t n) const {
#if MPOPT_DEVICE_IS_GPU
    detail::cuda_check(cudaMemsetAsync(p, 0, n * sizeof(T), stream()), "cudaMemsetAsync");
#else
    std::fill_n(p, n, T{});
#endif
  }
  /// Tensors in device memory (in the OMP build, whose device is the host, any memory).
  static constexpr bool accepts(memory_space s) { return !MPOPT_DEVICE_IS_GPU || s == memory_space::device; }

 private:
  friend detail::backend_passes<cuda>;

  detail::stream_handle handle() const {
#if MPOPT_DEVICE_IS_GPU
    return stream();
#else
    return nullptr;
#endif
  }
  auto policy() const {
#if MPOPT_DEVICE_IS_GPU
    return thrust::cuda::par_nosync.on(stream());
#else
    return thrust::device;
#endif
  }

  // ---- How the passes run (detail/passes/backend_passes.hpp).

  template <class Pass>
  void run(const detail::work_list& w, const Pass& pass, bool aligned) {
    run_then(w, pass, aligned, detail::no_finish{});
  }
  /// The pass, then finish in its kernel, by the block that ends last (backend_passes::run_then).
  template <class Pass, class Finish>
  void run_then(const detail::work_list& w, const Pass& pass, bool aligned, const Finish& finish) {
    const published_list& l = published(w);
    if constexpr (!std::is_same_v<Finish, detail::no_finish>)
      if (w.size() == 0) return for_each_index(1, finish);
    launch(pass, l.blocks.size() - 1, {l.blocks.data()}, aligned, finish);
  }
  template <class Pass>
  void run_flat(const Pass& pass, bool aligned) {
    launch(pass, pass.count(), {}, aligned, detail::no_finish{});
  }
  /// CUB's segmented reduction on a GPU, in order off it (detail/backend/device_reduce.hpp).
  template <class T>
  void sum_segments(const T* x, const std::size_t* offsets, std::size_t segments, double* sums) {
    if (segments == 0) return;
    ++launches_;
    reducer_.sum_segments(policy(), handle(), x, offsets, segments, sums);
  }
  /// CUB's reduction on a GPU, in order off it.
  template <class T>
  void sum_all(const T* x, std::size_t n, double* sum) {
    ++launches_;
    reducer_.sum_all(policy(), handle(), x, n, sum);
  }
  template <class F>
  void for_each_index(std::size_t n, const F& f) {
    if (n == 0) return;
    ++launches_;
    thrust::for_each_n(policy(), thrust::counting_iterator<std::size_t>(0), n, f);
  }

  /// On a GPU one kernel of `count` blocks, whose last block runs `finish`. On Thrust's OpenMP
  /// system the same kernel's steps one after the other: one loop over blocks x threads, then (if
  /// the pass sums anything) one over chunks for the blocks' sums, then the finish, in order.
  template <class Pass, class Finish>
  void launch(const Pass& pass, std::size_t count, detail::device_blocks blocks, bool aligned, const Finish& finish) {
    if (count == 0) return;
    ++launches_;
#if MPOPT_DEVICE_IS_GPU
    constexpr unsigned T = detail::device_threads_per_chunk;
    unsigned* arrived = arrived_.data();
    if (aligned) detail::chunk_block<Pass, detail::quad_lanes<true>><<<count, T, 0, stream()>>>(pass, blocks, finish, arrived);
    else detail::chunk_block<Pass, detail::quad_lanes<false>><<<count, T, 0, stream()>>>(pass, blocks, finish, arrived);
    detail::cuda_check(cudaGetLastError(), "a kernel launch");
#else
    const std::size_t chunk_count = blocks.end(count - 1);
    reserve_partials(chunk_count);
    const detail::device_partials partials{sums_.data(), sums2_.data(), sums64_.data(), flags_.data(), maxima_.data()};
    const std::size_t threads = count * detail::device_threads_per_chunk;
    auto first = thrust::counting_iterator<std::size_t>(0);
    if (aligned) thrust::for_each_n(policy(), first, threads, detail::chunk_kernel<Pass, detail::quad_lanes<true>>{pass, blocks, partials});
    else thrust::for_each_n(policy(), first, threads, detail::chunk_kernel<Pass, detail::quad_lanes<false>>{pass, blocks, partials});
    const detail::pass_outputs& o = pass.out;
    if (detail::sums_anything(o)) thrust::for_each_n(policy(), first, chunk_count, detail::chunk_totals_kernel{o, partials});
    if constexpr (!std::is_same_v<Finish, detail::no_finish>) finish(0);
#endif
  }

  /// Lane partials for the largest pass so far (grown only while the optimizer's lists are seen
  /// for the first time).
  void reserve_partials(std::size_t chunk_count) {
    const std::size_t n = chunk_count * detail::device_lanes_per_chunk;
    if (sums_.size() >= n) return;
    sums_ = buffer<float>(n);
    sums2_ = buffer<float>(n);
    sums64_ = buffer<double>(n);
    flags_ = buffer<std::uint8_t>(n);
    maxima_ = buffer<float>(n);
  }

  const detail::chunk* chunks(const detail::work_list& w) { return published(w).device.data(); }

  /// The device copy of a work list and its blocks, made on first use (and again if the list
  /// changed size).
  struct published_list {
    const detail::work_list* host = nullptr;
    std::size_t size = 0, elements = 0;
    buffer<detail::chunk> device;
    buffer<std::uint32_t> blocks;  // device_blocks::first
  };
  const published_list& published(const detail::work_list& w) {
    for (auto& l : lists_)
      if (l.host == &w && l.size == w.size() && l.elements == w.elements()) return l;
    auto it = std::find_if(lists_.begin(), lists_.end(), [&](const auto& l) { return l.host == &w; });
    if (it == lists_.end()) it = lists_.insert(lists_.end(), published_list{&w, 0, 0, {}, {}});
    it->size = w.size();
    it->elements = w.elements();
    it->device = buffer<detail::chunk>(w.size());
    to_device(it->device.data(), w.data(), w.size());
    const std::vector<std::uint32_t> starts = detail::device_block_starts(w);
    it->blocks = buffer<std::uint32_t>(starts.size());
    to_device(it->blocks.data(), starts.data(), starts.size());
    return *it;
  }

  /// The device copy of the optimizer's tensor table, and whether every tensor allows aligned vectors.
  struct published_table {
    const void* host = nullptr;
    buffer<std::byte> device;
    bool aligned = false;
  };

  template <class P>
  const published_table& publish(const detail::step_data<P>& d) {
    for (auto& t : tables_)
      if (t.host == d.tensors) return t;
    using slot = detail::tensor_slot<typename P::param_type, typename P::grad_type>;
    const std::size_t n = d.tensor_count;
    published_table t{d.tensors, buffer<std::byte>(std::max<std::size_t>(n, 1) * sizeof(slot)), true};
    for (std::size_t i = 0; i < n; ++i) t.aligned = t.aligned && is_aligned(d.tensors[i].param) && is_aligned(d.tensors[i].grad);
    to_device(t.device.data(), reinterpret_cast<const std::byte*>(d.tensors), n * sizeof(slot));
    tables_.push_back(std::move(t));
    return tables_.back();
  }
  /// d, addressing the device copy of its tensor table.
  template <class P>
  detail::step_data<P> placed(detail::step_data<P> d) {
    using slot = detail::tensor_slot<typename P::param_type, typename P::grad_type>;
    d.tensors = reinterpret_cast<const slot*>(publish(d).device.data());
    return d;
  }
  template <class P>
  bool aligned(const detail::step_data<P>& d) {
    return publish(d).aligned;
  }

#if MPOPT_DEVICE_IS_GPU
  detail::stream_holder stream_;  // own, or borrowed
#endif
  std::size_t launches_ = 0;
  mutable std::size_t waits_ = 0;
#if MPOPT_DEVICE_IS_GPU
  buffer<unsigned> arrived_{1};  // blocks of a finishing kernel that have ended (chunk_block)
#endif
  detail::device_reducer reducer_;
  std::vector<published_list> lists_;
  std::vector<published_table> tables_;
  buffer<float> sums_, sums2_;
  buffer<double> sums64_;
  buffer<std::uint8_t> flags_;
  buffer<float> maxima_;
};

}  // namespace mpopt
