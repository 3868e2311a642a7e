// mpopt — ZeRO-Offload as a backend: the model's parameters and gradients stay in device memory,
// while the fp32 masters, the moments, the buckets and every pass live on the host and run on the
// host backend at host memory bandwidth (DeepSpeed's offload_optimizer: cpu).
//
// The passes read a mirror of the optimizer's tensor table whose tensors are page-locked host
// copies. Gradients come over the bus tensor by tensor as grad_ready() reports them, so the copies
// overlap the rest of backward; step() brings in the rest. Once a step's parameters are final, the
// 16-bit copies go back. Rules, scalers and partitions see a host backend and change nothing: over
// a host communicator (mpi) a step moves sizeof(grad) bytes per parameter to the host and
// sizeof(param) back, and the collectives run on the host copies.
//
// Over a communicator of device memory (nccl) the buckets are the tensors' side's instead: packed
// from the gradients where they are, reduce-scattered there, and only my reduced piece crosses to
// the host; my updated parameters cross back and are all-gathered there (zero1, zero2). A step then
// moves 1/W of the gradients and parameters over the bus, as DeepSpeed's offload does.
//
// Built with nvcc the copies are cudaMemcpyAsync on a stream of its own; in the Thrust-OMP build
// (CI), whose device is the host, they are plain copies through the same code.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include "detail/passes/backend_passes.hpp"
#include "detail/backend/device_buffer.hpp"
#include "detail/passes/step_data.hpp"
#include "detail/backend/tensor_side.hpp"
#include "detail/passes/work_list.hpp"
#include "cuda.hpp"
#include "host_passes.hpp"  // the state side runs any rule's passes, in any mode
#include "memory_report.hpp"
#include "tensor.hpp"

namespace mpopt {

/// StateSide: where the state lives and the step runs. TensorSide: the passes over the model's
/// tensors in device memory, where a device communicator's buckets are.
template <class StateSide = host, class TensorSide = cuda>
class offload : public detail::backend_passes<offload<StateSide, TensorSide>> {
 public:
  static constexpr std::string_view name = "offload";
  /// Where the state lives and the passes run.
  static constexpr memory_space space = StateSide::space;
  /// Where the model's tensors live (flat groups' buffers too).
  static constexpr memory_space tensor_space = memory_space::device;

  template <class T>
  using buffer = typename StateSide::template buffer<T>;
  template <class T>
  using shared_vector = typename StateSide::template shared_vector<T>;
  template <class T>
  using tensor_buffer = detail::device_buffer<T>;

  /// Tensors in device memory (in the OMP build, whose device is the host, any memory).
  static constexpr bool accepts(memory_space s) { return !MPOPT_DEVICE_IS_GPU || s == memory_space::device; }

  offload() {
#if MPOPT_DEVICE_IS_GPU
    copies_ = detail::own_stream();
#endif
  }
  /// Over communicator `comm` of device memory: buckets on the tensors' side, on its stream if it
  /// has one (the optimizer makes its backend so).
  template <class C>
  offload(detail::tensor_side_collectives, const C& comm) : offload() {
    if constexpr (requires { TensorSide(comm.stream()); }) tensor_side_.emplace(comm.stream());
    else tensor_side_.emplace();
  }
  offload(offload&&) noexcept = default;
  offload& operator=(offload&&) = delete;

  /// Bytes copied over the bus so far for steps (checkpoints apart): gradients to the host,
  /// parameters to the device.
  std::size_t bytes_to_host() const { return to_host_bytes_; }
  std::size_t bytes_to_device() const { return to_device_bytes_; }

  /// The passes run on the calling thread; copies still running are waited for, and the tensors'
  /// side's passes.
  void synchronize() {
    wait_copies();
    if (tensor_side_) tensor_side_->synchronize();
  }
  /// n elements between any two memories (a checkpoint's tensors and state), done when it returns.
  template <class T>
  void to_host(T* dst, const T* src, std::size_t n) const {
    bus_copy(dst, src, n * sizeof(T));
    wait_copies();
  }
  template <class T>
  void to_device(T* dst, const T* src, std::size_t n) const {
    to_host(dst, src, n);
  }
  /// State is host memory.
  template <class T>
  static void zero(T* p, std::size_t n) {
    std::fill_n(p, n, T{});
  }

  // ---- Where the model's tensors change hands (backend_passes.hpp's hooks).

  // With buckets on the tensors' side the gradients are reduced where they are, and the gathered
  // parameters land there: only my pieces cross (collective_side), so these move nothing.

  template <class P>
  void gradient_ready(const detail::step_data<P>& d, std::size_t i) {
    if (tensor_side_) return;
    const auto m = mirror(d);
    if (m.grad_in[i]) return;
    const auto& t = d.tensors[i];
    bus_copy(m.slots[i].grad, t.grad, t.size * sizeof(*t.grad));
    to_host_bytes_ += t.size * sizeof(*t.grad);
    m.grad_in[i] = 1;
  }
  /// The gradients not reported yet come over now; the next micro-step's come anew.
  template <class P>
  void gradients_in(const detail::step_data<P>& d) {
    if (tensor_side_) return;
    const auto m = mirror(d);
    for (std::size_t i = 0; i < d.tensor_count; ++i) gradient_ready(d, i);
    std::fill(m.grad_in.begin(), m.grad_in.end(), 0);
  }
  template <class P>
  void params_in(const detail::step_data<P>& d) {
    const auto m = mirror(d);
    for (std::size_t i = 0; i < d.tensor_count; ++i)
      bus_copy(m.slots[i].param, d.tensors[i].param, d.tensors[i].size * sizeof(*d.tensors[i].param));
    wait_copies();
  }
  /// Tensor i's parameters (all: i = size_t(-1)) to the device, each once a step: done when it returns.
  template <class P>
  void params_out(const detail::step_data<P>& d, std::size_t i) {
    if (tensor_side_) return;
    const auto m = mirror(d);
    const bool all = i == std::size_t(-1);
    for (std::size_t t = all ? 0 : i; t < (all ? d.tensor_count : i + 1); ++t) {
      if (m.param_out[t]) continue;
      const auto& slot = d.tensors[t];
      bus_copy(slot.param, m.slots[t].param, slot.size * sizeof(*slot.param));
      to_device_bytes_ += slot.size * sizeof(*slot.param);
      m.param_out[t] = 1;
    }
    if (all) std::fill(m.param_out.begin(), m.param_out.end(), 0);
    wait_copies();
  }
  /// The model's gradients, where they are, and their host copies (read if grad_ready was early).
  template <class P>
  void zero_grad(const detail::step_data<P>& d) {
    const auto m = mirror(d);
    for (std::size_t i = 0; i < d.tensor_count; ++i) {
      fill_zero(d.tensors[i].grad, d.tensors[i].size * sizeof(*d.tensors[i].grad));
      std::fill_n(m.slots[i].grad, d.tensors[i].size, typename P::grad_type{});
    }
    wait_copies();
  }

  /// Lists the page-locked copies; returns the bytes of bookkeeping (the mirrored table).
  std::size_t list_memory(memory_report& r) const {
    if (mirror_.table == nullptr) return 0;
    r.buffers.push_back({"pinned parameters", "page-locked host copy of the parameters (offload)", mirror_.params.size(), true});
    r.buffers.push_back({"pinned gradients", "page-locked host copy of the gradients (offload)", mirror_.grads.size(), true});
    if (landing_.size())
      r.buffers.push_back({"pinned landing", "page-locked host copy of my reduced piece of a bucket (offload)",
                           landing_.size(), true});
    return mirror_.table_bytes.capacity() + mirror_.grad_in.capacity() + mirror_.param_out.capacity();
  }

  // ---- The buckets' passes when the collectives are on the tensors' side (exchange_context.hpp).

  /// What a sharded exchange does to its buckets, on the tensors' side: packing the gradients,
  /// unpacking the gathered parameters. Only my pieces cross: a reduced piece to the host, where
  /// it joins the shard (or my gradients); my updated parameters to the device before they are packed.
  class collectives {
   public:
    template <class P, class T>
    void pack_gradients(const detail::step_data<P>& d, const detail::work_list& pieces, T* out,
                        const typename P::accumulate_type* accum, float scale) {
      side().pack_gradients(d, pieces, out, accum, scale);
    }
    template <class T>
    void zero(T* p, std::size_t n) {
      side().zero(p, n);
    }
    template <class P>
    void accumulate(const detail::step_data<P>& d, bool first) {
      side().accumulate(d, first);
    }
    template <class P>
    void unpack_params(const detail::step_data<P>& d, const detail::work_list& pieces, const typename P::param_type* in) {
      side().unpack_params(d, pieces, in);
    }
    /// My piece into my gradients on the device, then those to their host copies.
    template <class P, class T>
    void unpack_gradients(const detail::step_data<P>& d, const detail::work_list& mine, const T* in, std::size_t in_offset) {
      side().unpack_gradients(d, mine, in, in_offset);
      o_.cross(d, mine, &detail::tensor_slot<typename P::param_type, typename P::grad_type>::grad, true);
    }
    /// My updated parameters from their host copies to the device, then packed there.
    template <class P>
    void pack_params(const detail::step_data<P>& d, const detail::work_list& mine, typename P::param_type* out) {
      o_.cross(d, mine, &detail::tensor_slot<typename P::param_type, typename P::grad_type>::param, false);
      side().pack_params(d, mine, out);
    }
    /// dst (host) = src (device), or dst + src: through a page-locked landing, folded on the host.
    template <class D, class S>
    void fold(D* dst, const S* src, std::size_t n, bool add) {
      if (o_.landing_.size() < n * sizeof(S)) o_.landing_.resize(n * sizeof(S));  // the first step only
      S* here = reinterpret_cast<S*>(o_.landing_.data());
      side().to_host(here, src, n);
      o_.to_host_bytes_ += n * sizeof(S);
      o_.fold(dst, here, n, add);
    }

   private:
    friend offload;
    explicit collectives(offload& o) : o_(o) {}
    TensorSide& side() { return *o_.tensor_side_; }
    offload& o_;
  };
  collectives collective_side() { return collectives(*this); }

  // ---- How the passes run: on the state side, over the mirrored table.

  template <class Pass>
  void run(const detail::work_list& w, const Pass& pass, bool aligned) {
    wait_copies();
    StateSide::run(w, pass, aligned);
  }
  template <class Pass>
  void run_flat(const Pass& pass, bool aligned) {
    wait_copies();
    StateSide::run_flat(pass, aligned);
  }
  template <class F>
  static void for_each_index(std::size_t n, const F& f) {
    StateSide::for_each_index(n, f);
  }
  template <class T>
  static void sum_segments(const T* x, const std::size_t* offsets, std::size_t segments, double* sums) {
    StateSide::sum_segments(x, offsets, segments, sums);
  }
  template <class T>
  static void sum_all(const T* x, std::size_t n, double* sum) {
    StateSide::sum_all(x, n, sum);
  }
  static const detail::chunk* chunks(const detail::work_list& w) { return StateSide::chunks(w); }
  template <class P>
  detail::step_data<P> placed(detail::step_data<P> d) {
    d.tensors = mirror(d).slots;
    return d;
  }
  template <class P>
  static bool aligned(const detail::step_data<P>&) {
    return true;  // host lanes load any address
  }

 private:
  /// The optimizer's tensor table with each tensor's memory replaced by its place in the copies
  /// (each at a multiple of 64 elements), made at the first pass and fixed after.
  struct mirrored {
    const void* table = nullptr;
    detail::pinned_vector<std::byte> params, grads;
    std::vector<std::byte> table_bytes;
    std::vector<std::uint8_t> grad_in;    // per tensor: this micro-step's gradient is copied
    std::vector<std::uint8_t> param_out;  // per tensor: this step's parameters went back
  };
  template <class P>
  struct typed_mirror {
    using slot = detail::tensor_slot<typename P::param_type, typename P::grad_type>;
    slot* slots;
    std::vector<std::uint8_t>& grad_in;
    std::vector<std::uint8_t>& param_out;
  };

  template <class P>
  typed_mirror<P> mirror(const detail::step_data<P>& d) {
    using slot = typename typed_mirror<P>::slot;
    using param = typename P::param_type;
    using grad = typename P::grad_type;
    if (mirror_.table != d.tensors) {
      if (mirror_.table) detail::fail("offload: one backend serves one optimizer");
      std::vector<std::size_t> at;  // per tensor: its first element in the copies
      std::size_t n = 0;
      for (std::size_t i = 0; i < d.tensor_count; ++i, n = (n + 63) / 64 * 64) {
        at.push_back(n);
        n += d.tensors[i].size;
      }
      mirrored m;
      m.params.resize(n * sizeof(param));
      m.grads.resize(n * sizeof(grad));
      m.table_bytes.resize(d.tensor_count * sizeof(slot));
      m.grad_in.assign(d.tensor_count, 0);
      m.param_out.assign(d.tensor_count, 0);
      for (std::size_t i = 0; i < d.tensor_count; ++i) {
        slot s = d.tensors[i];
        s.param = reinterpret_cast<param*>(m.params.data()) + at[i];
        s.grad = reinterpret_cast<grad*>(m.grads.data()) + at[i];
        std::memcpy(m.table_bytes.data() + i * sizeof(slot), &s, sizeof(slot));
      }
      m.table = d.tensors;
      mirror_ = std::move(m);
    }
    return {reinterpret_cast<slot*>(mirror_.table_bytes.data()), mirror_.grad_in, mirror_.param_out};
  }

  /// The pieces' field (grad or param) between the device tensors and their host copies, a run of
  /// contiguous chunks at a time, on the tensors' side's stream (after its passes); done when it returns.
  template <class P, class T>
  void cross(const detail::step_data<P>& d, const detail::work_list& pieces,
             T* detail::tensor_slot<typename P::param_type, typename P::grad_type>::*field, bool to_host) {
    const auto m = mirror(d);
    for (std::size_t c = 0; c < pieces.size();) {
      const detail::chunk& first = pieces[c];
      std::size_t n = first.size;
      for (++c; c < pieces.size() && pieces[c].tensor == first.tensor && pieces[c].begin == first.begin + n; ++c)
        n += pieces[c].size;
      T* device = d.tensors[first.tensor].*field + first.begin;
      T* copy = m.slots[first.tensor].*field + first.begin;
      if (to_host) tensor_side_->to_host(copy, device, n);
      else tensor_side_->to_device(device, copy, n);
      (to_host ? to_host_bytes_ : to_device_bytes_) += n * sizeof(T);
    }
    tensor_side_->synchronize();
  }

  void bus_copy(void* dst, const void* src, std::size_t bytes) const {
    if (bytes == 0) return;
#if MPOPT_DEVICE_IS_GPU
    detail::cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, copies_.get()), "cudaMemcpyAsync");
    copying_ = true;
#else
    std::memcpy(dst, src, bytes);
#endif
  }
  void fill_zero(void* p, std::size_t bytes) {
#if MPOPT_DEVICE_IS_GPU
    detail::cuda_check(cudaMemsetAsync(p, 0, bytes, copies_.get()), "cudaMemsetAsync");
    copying_ = true;
#else
    std::memset(p, 0, bytes);
#endif
  }
  void wait_copies() const {
#if MPOPT_DEVICE_IS_GPU
    if (!copying_) return;
    detail::cuda_check(cudaStreamSynchronize(copies_.get()), "cudaStreamSynchronize");
    copying_ = false;
#endif
  }

#if MPOPT_DEVICE_IS_GPU
  detail::stream_holder copies_;
  mutable bool copying_ = false;
#endif
  mirrored mirror_;
  std::optional<TensorSide> tensor_side_;    // over a device communicator: where the buckets are
  detail::pinned_vector<std::byte> landing_;  // then: my reduced piece of a bucket, on the host
  std::size_t to_host_bytes_ = 0, to_device_bytes_ = 0;
};

}  // namespace mpopt
