// mpopt — what a backend is: where the optimizer state lives (host or device memory) and how a pass
// over the step's work list runs there (host.hpp: OpenMP threads and SIMD lanes; cuda.hpp: a GPU
// block per chunk; offload.hpp: the state on the host, the model's tensors on the device). It owns
// no formula. backend_policy names everything the optimizer, the partitions' exchanges and the
// default rule driver call on one; deriving from detail::backend_passes<B> (backend_passes.hpp)
// gives every pass, and B then says only how a pass runs.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "detail/passes/passes.hpp"
#include "detail/math/sign_compression.hpp"
#include "detail/passes/step_data.hpp"
#include "detail/math/step_decision.hpp"
#include "detail/passes/work_list.hpp"
#include "tensor.hpp"

namespace mpopt {

namespace detail {

/// Where the passes read and write: made empty or of n elements (zeroed(n): zeros), moved, never copied.
template <class Buffer, class T>
concept state_buffer = std::default_initializable<Buffer> && std::movable<Buffer> &&
                       std::constructible_from<Buffer, std::size_t> &&
                       requires(Buffer& b, const Buffer& cb, std::size_t n) {
                         { Buffer::zeroed(n) } -> std::same_as<Buffer>;
                         { b.data() } -> std::convertible_to<T*>;
                         { cb.data() } -> std::convertible_to<const T*>;
                         { cb.size() } -> std::convertible_to<std::size_t>;
                       };

/// Small arrays both the passes and the host's step logic read and write (per-chunk sums,
/// coefficients): a std::vector, on a GPU in mapped page-locked memory. (Plain expressions rather
/// than the ranges concepts: every optimizer type checks this, and those cost compile time.)
template <class Array, class T>
concept shared_array = std::default_initializable<Array> &&
                       requires(Array& a, const Array& ca, std::size_t n, const T& x) {
                         a.assign(n, x);
                         a.resize(n);
                         { a.data() } -> std::same_as<T*>;
                         { a[n] } -> std::same_as<T&>;
                         { ca.size() } -> std::convertible_to<std::size_t>;
                         { ca.empty() } -> std::convertible_to<bool>;
                         { ca.capacity() } -> std::convertible_to<std::size_t>;
                       };

/// B's buffer<T> and shared_vector<T>.
template <class B, class T>
concept keeps_type = requires {
  typename B::template buffer<T>;
  typename B::template shared_vector<T>;
  requires state_buffer<typename B::template buffer<T>, T>;
  requires shared_array<typename B::template shared_vector<T>, T>;
};
/// ... for every T given.
template <class B, class... T>
concept keeps = (keeps_type<B, T> && ...);

/// Stands in for the rule when a backend's rule passes are checked: they are templates over every
/// rule, and read only its scalars.
struct stand_in_rule {
  struct scalars {
    float lr;
  };
};

/// What the partitions' exchanges do to their buckets (replicated_exchange.hpp, sharded_exchange.hpp),
/// on S: the backend, or where its collectives run on its tensors' side, its collective_side().
template <class S, class Precision>
concept bucket_passes =
    requires(S& s, const step_data<Precision>& d, const work_list& pieces, std::size_t n, bool first, float scale,
             typename Precision::param_type* params, const typename Precision::param_type* gathered,
             typename Precision::accumulate_type* accum, const typename Precision::accumulate_type* earlier,
             typename Precision::communicate_type* sent, const typename Precision::communicate_type* received) {
      s.accumulate(d, first);  // a micro-step's gradients into the accumulator
      s.pack_gradients(d, pieces, sent, earlier, scale);
      s.zero(sent, n);  // a bucket's gaps
      s.fold(accum, received, n, first);  // a reduced piece into the accumulator or the shard
      s.unpack_gradients(d, pieces, received, n);
      s.pack_params(d, pieces, params);
      s.unpack_params(d, pieces, gathered);
    };

/// What the compressing rules' drivers (compressing_driver.hpp) and their compressed all-reduce
/// (compressed_allreduce.hpp) run besides: passes of their own over the step (tensor_pass, given
/// what makes the pass from the step's tables and chunks) and 1-bit passes over flat fp32 buffers.
template <class B, class Precision>
concept compression_passes =
    requires(B& b, const step_data<Precision>& d, copy_pass (*make)(const step_data<Precision>&, const chunk*),
             const work_list& w, float* x, const float* y, std::uint8_t* bits, const std::uint8_t* blocks,
             double* partial, std::size_t n, const sign_code& code, typename B::template buffer<float>& errors) {
      b.tensor_pass(d, make);
      b.copy(w, x, y);
      b.sum_squares(w, y, partial);
      b.add_into(w, x, y, partial);
      b.compress_signs(w, x, y, bits);
      b.combine_signs(w, blocks, n, y, int{}, n, x, partial);
      b.decode_signs(w, code, x);
      b.to_host(x, y, n);
      b.to_device(bits, blocks, n);
      b.zero(x, n);
      { errors.span() } -> std::convertible_to<std::span<float>>;
    };

}  // namespace detail

/// A backend: what the optimizer (detail/step/step_pipeline.hpp), the partitions' exchanges and the
/// default rule driver (detail/drivers/staged_driver.hpp) call on one, for the optimizer's Precision.
template <class B, class Precision>
concept backend_policy =
    // Made once per optimizer (over a device communicator, on its stream: runs_on_stream_of).
    std::default_initializable<B> &&
    // Its memory: buffers for the state, shared arrays for what the host reads too.
    detail::keeps<B, float, double, std::uint8_t, std::uint64_t, std::size_t, std::byte, detail::step_decision,
                  typename Precision::param_type, typename Precision::grad_type,
                  typename Precision::accumulate_type, typename Precision::communicate_type,
                  detail::master_element_t<Precision>, detail::state_element_t<Precision>> &&
    // The buckets' passes; and, where its collectives may run on its tensors' side (offload), there too.
    detail::bucket_passes<B, Precision> &&
    (!requires(B& b) { b.collective_side(); } ||
     requires(B& b) { { b.collective_side() } -> detail::bucket_passes<Precision>; }) &&
    requires(B& b, memory_space space, const detail::step_data<Precision>& d, std::size_t n, bool first,
             detail::step_decision* decision, const detail::step_decision* decided, std::byte* bytes,
             const std::byte* saved, std::size_t* segments, const std::size_t* offsets, const float* initial,
             double* sums, const std::uint8_t* nonfinite, const detail::step_rule& rule,
             const detail::stand_in_rule::scalars* k, float* chunk_sums, float* tensor_scale) {
      // What it is: a name (every rank's must match), where the state lives, which tensors it takes.
      { B::name } -> std::convertible_to<std::string_view>;
      { B::space } -> std::convertible_to<memory_space>;
      typename std::integral_constant<memory_space, B::space>;  // a constant: code is chosen by it
      { B::accepts(space) } -> std::convertible_to<bool>;

      // Memory: copies between the host and the state's memory (the decision, checkpoints' bytes,
      // tables), done when to_host returns; zeros; a wait for every pass issued so far.
      b.to_host(decision, decided, n);
      b.to_device(decision, decided, n);
      b.to_host(bytes, saved, n);
      b.to_device(bytes, saved, n);
      b.to_device(segments, offsets, n);
      b.zero(sums, n);
      b.synchronize();

      // Where the model's tensors change hands: a gradient complete (grad_ready), all of them
      // (step), the parameters set outside the passes (finalize, load), a step's parameters final
      // (tensor n's, or all: size_t(-1)).
      b.gradient_ready(d, n);
      b.gradients_in(d);
      b.params_in(d);
      b.params_out(d, n);

      // The step's passes over the elements this rank updates, and its decision. The state starts
      // from the parameters and, per group and buffer, a value in a shared_vector (null: zero).
      b.initialize_state(d, initial);
      b.zero_grad(d);
      b.gradient_norm(d, sums);  // per chunk: the sum of squares, whether any is inf or NaN
      b.step_sums(sums, nonfinite, n, sums);
      b.decide_step(rule, sums, decision);
      b.gradient_norm_sums(d, sums, sums, &rule, decision);  // the three at once (null rule: no decision)

      // The rule's stages, and a reducing rule's per-tensor norms (per-chunk partials summed by
      // segments) and scales.
      b.template rule_stage<detail::stand_in_rule, detail::direction_stage>(d, k, nullptr, first);
      b.template rule_stage<detail::stand_in_rule, detail::update_stage>(d, k, tensor_scale);
      b.segmented_sum(chunk_sums, segments, n, sums);
      b.segmented_sum(sums, segments, n, sums);
      b.template tensor_scales<detail::stand_in_rule>(d, k, sums, sums, tensor_scale);
      // The direction stage with its per-tensor sums (one level of segments) and scales at once.
      b.template rule_stage_scales<detail::stand_in_rule, detail::direction_stage>(d, k, offsets, sums, sums,
                                                                                  tensor_scale);
    };

}  // namespace mpopt
