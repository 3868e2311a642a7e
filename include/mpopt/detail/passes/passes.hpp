// mpopt — every element pass of a step, written once over a lane type L and run by every backend.
// A pass says what happens to the vector of elements [i, i + L::width) of one chunk (the `tail`
// marks the lanes past the chunk's end) and which per-chunk sums it feeds; a backend only decides
// how chunks and vectors map onto threads (host.hpp: OpenMP threads and SIMD registers; cuda.hpp:
// GPU threads and 16-byte loads). The formulas live in the rules (rule.hpp: a rule's stages run in
// rule_pass), *_math.hpp and sign_compression.hpp.
//
// Interface of a pass: `at(ci)` returns the chunk's slice (pointers offset to its first element,
// coefficients copied), `size(ci)` its elements, `apply<L>(slice, i, tail, sums)` the body, and
// `out` the per-chunk results it produces. `sums` collects, per chunk, in the backend's lane layout:
// square(x) / square2(x) (fp32 sums of squares), square64(x) (double), nonfinite(x), largest(x).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../precision.hpp"
#include "../config.hpp"
#include "../lanes/float_bits.hpp"
#include "../lanes/lanes.hpp"
#include "../math/sign_compression.hpp"
#include "block_state.hpp"
#include "step_data.hpp"
#include "stored_state.hpp"
#include "work_list.hpp"

namespace mpopt::detail {

/// Where a pass writes its per-chunk results (null: not produced).
struct pass_outputs {
  float* sum = nullptr;           ///< square()
  float* sum2 = nullptr;          ///< square2()
  double* sum64 = nullptr;        ///< square64()
  /// sum64's totals rounded to float's 24 significant bits (round_to_float_precision): the
  /// gradient norm's partials, which then add exactly in double in any order (ranks, shard layouts,
  /// a device's reduction) while within about 2^29 of each other, and cannot overflow as floats.
  bool round64 = false;
  std::uint8_t* nonfinite = nullptr;
  float* largest = nullptr;
};

/// A pointer into a state buffer the backend owns: every chunk of it starts 64-byte aligned and may
/// be read in whole 16-element groups past its end (padding). Lanes that can use this read their
/// tail vector whole (one wide load instead of a masked one); stores stay masked.
template <class T>
struct padded {
  T* p = nullptr;
  MPOPT_HOST_DEVICE padded operator+(std::size_t i) const { return {p + i}; }
  MPOPT_HOST_DEVICE explicit operator bool() const { return p != nullptr; }
};

template <class L>
concept reads_padding = L::reads_padding;

template <class L, class T, class Tail>
MPOPT_HOST_DEVICE typename L::vec vload(const T* p, Tail tail) {
  return L::load(p, tail);
}
template <class L, class T, class Tail>
MPOPT_HOST_DEVICE typename L::vec vload(padded<T> p, Tail tail) {
  if constexpr (reads_padding<L>) return L::load_padded(p.p);
  else return L::load(p.p, tail);
}
template <class L, class T, class Tail>
MPOPT_HOST_DEVICE void vstore(T* p, typename L::vec x, Tail tail) {
  L::store(p, x, tail);
}
template <class L, class T, class Tail>
MPOPT_HOST_DEVICE void vstore(padded<T> p, typename L::vec x, Tail tail) {
  L::store(p.p, x, tail);
}

/// One chunk's pointers, already offset to its first element (quantized state: its first code and
/// its first block's scale).
template <class P>
struct chunk_slice : block_scale_slots<P> {
  using precision = P;
  typename P::param_type* param;
  typename P::grad_type* grad;
  /// The fp32 masters or their remainders; where the parameter is its own master, the parameter.
  std::conditional_t<P::has_master, padded<master_element_t<P>>, typename P::param_type*> master;
  padded<state_element_t<P>> state[max_state_buffers];  // the rule's; null past the tensor's count
  std::uint32_t state_buffers;                           // that count
  padded<typename P::accumulate_type> accum;
  padded<float> matrix;  // a matrix rule's buffer
  bool reduced;  // the gradient is accum alone (already summed over ranks)
  std::size_t n;
  std::uint32_t tensor, group;
  std::uint32_t rounding_key;
  std::uint64_t index;  // of the first element among all registered (stochastic rounding's)
};

template <class P>
MPOPT_HOST_DEVICE chunk_slice<P> slice_of(const step_data<P>& d, const chunk& c) {
  const auto& t = d.tensors[c.tensor];
  const std::size_t o = c.state;
  auto at = [o](auto* p) { return padded<std::remove_reference_t<decltype(*p)>>{p ? p + o : nullptr}; };
  chunk_slice<P> s;
  s.param = t.param + c.begin;
  s.grad = t.grad + c.begin;
  if constexpr (P::has_master) s.master = at(d.master);
  else s.master = t.param + c.begin;
  s.state_buffers = t.state_buffers < d.state_count ? t.state_buffers : d.state_count;
  for (std::size_t k = 0; k < max_state_buffers; ++k) {
    const bool kept = k < s.state_buffers;
    const std::size_t in_buffer = kept ? o - t.state_shift[k] : 0;
    if constexpr (state_in_blocks<P>) {
      using S = state_storage_t<P>;
      s.state[k] = {kept ? d.state[k] + code_bytes<S>(in_buffer) : nullptr};
      s.block_scales[k] = kept ? d.block_scales[k] + in_buffer / S::block : nullptr;
    } else {
      s.state[k] = {kept ? d.state[k] + in_buffer : nullptr};
    }
  }
  if constexpr (state_in_blocks<P>) s.nonnegative = d.nonnegative;
  s.accum = at(d.accum);
  s.matrix = at(d.matrix);
  s.reduced = d.grads_reduced;
  s.n = c.size;
  s.tensor = c.tensor;
  s.group = t.group;
  s.rounding_key = d.rounding_key;
  s.index = t.first + c.begin;
  return s;
}

/// (accum + grad) * scale, grad * scale, or accum * scale once reduced (step_data).
template <class L, class P, class Tail>
MPOPT_HOST_DEVICE typename L::vec true_gradient(const chunk_slice<P>& s, std::size_t i, Tail tail, typename L::vec scale) {
  if (s.reduced) return vload<L>(s.accum + i, tail) * scale;
  auto g = vload<L>(s.grad + i, tail);
  if (s.accum) g = vload<L>(s.accum + i, tail) + g;
  return g * scale;
}

/// The fp32 master, however stored (stored_state.hpp).
template <class L, class P, class Tail>
MPOPT_HOST_DEVICE typename L::vec load_master(const chunk_slice<P>& s, std::size_t i, Tail tail) {
  if constexpr (master_in_remainder<P>) return join_masters<L>(s.param + i, s.master.p + i, tail);
  else return vload<L>(s.master + i, tail);
}

/// The new parameter into the master and, when it is a separate 16-bit tensor, the parameter,
/// rounded as the precision policy says; a remainder16 master into the parameter and its remainder.
template <class L, class P, class Tail>
MPOPT_HOST_DEVICE void store_param(const chunk_slice<P>& s, std::size_t i, typename L::vec p, Tail tail) {
  using T = typename P::param_type;
  if constexpr (master_in_remainder<P>) {
    split_masters<L>(p, s.param + i, s.master.p + i, tail);
  } else if constexpr (P::has_master || !std::is_same_v<T, float>) {
    if constexpr (P::has_master) vstore<L>(s.master + i, p, tail);
    vstore<L>(s.param + i, rounding_of_t<P>::template round<L, T>(p, s.rounding_key, s.index + i), tail);
  } else {
    vstore<L>(s.master + i, p, tail);  // fp32: the parameter is the master
  }
}

/// Passes over the optimizer's tensors (chunks of d.work, given as `chunks` where the backend can
/// read them).
template <class P>
struct tensor_pass {
  step_data<P> d;
  const chunk* chunks;
  pass_outputs out{};
  MPOPT_HOST_DEVICE std::size_t size(std::size_t ci) const { return chunks[ci].size; }
  MPOPT_HOST_DEVICE chunk_slice<P> at(std::size_t ci) const { return slice_of(d, chunks[ci]); }
};

/// The slice of an update pass: per-group coefficients K and the decision's gradient scale, copied
/// once per chunk.
template <class P, class K>
struct coefficient_slice : chunk_slice<P> {
  K c;
  float scale;
};

/// The state's start: masters from the parameters, each state buffer k at initial[g * state_count + k]
/// in group g (zero where `initial` is null); quantized state a block at a time.
template <class P>
struct initialize_pass : tensor_pass<P> {
  static constexpr std::size_t granule = state_granule<P>();
  const float* initial;
  template <class L, class S, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const S& s, std::size_t i, Tail tail, R&) const {
    master_from_param<L>(s, i, tail);
    for (std::uint32_t k = 0; k < s.state_buffers; ++k) vstore<L>(s.state[k] + i, typename L::vec(start(s, k)), tail);
  }
  template <class L, class S, class R>
  MPOPT_HOST_DEVICE void apply_granule(const S& s, std::size_t g, std::size_t count, R&) const {
    using St = state_storage_t<P>;
    std::size_t j = 0;
    for (; j + L::width <= count; j += L::width) master_from_param<L>(s, g + j, full_t{});
    if constexpr (L::width > 1)
      if (j < count) master_from_param<L>(s, g + j, L::first(count - j));
    alignas(64) float values[St::block];
    for (std::uint32_t k = 0; k < s.state_buffers; ++k) {
      for (j = 0; j < count; ++j) values[j] = start(s, k);
      quantize_block<St, L>(values, count, (s.nonnegative >> k) & 1u, s.state[k].p + code_bytes<St>(g),
                            s.block_scales[k] + g / St::block);
    }
  }
  template <class S>
  MPOPT_HOST_DEVICE float start(const S& s, std::uint32_t k) const {
    return initial ? initial[s.group * this->d.state_count + k] : 0.0f;
  }
  template <class L, class S, class Tail>
  MPOPT_HOST_DEVICE void master_from_param(const S& s, std::size_t i, Tail tail) const {
    if constexpr (master_in_remainder<P>) split_masters<L>(vload<L>(s.param + i, tail), s.param + i, s.master.p + i, tail);
    else if constexpr (P::has_master) vstore<L>(s.master + i, vload<L>(s.param + i, tail), tail);
  }
};

template <class P>
struct zero_grad_pass : tensor_pass<P> {
  template <class L, class S, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const S& s, std::size_t i, Tail tail, R&) const {
    vstore<L>(s.grad + i, typename L::vec(0.0f), tail);
  }
};

/// A micro-step: accum = grad * scale (first) or (accum + grad) * scale.
template <class P>
struct accumulate_pass : tensor_pass<P> {
  bool first;
  float scale;
  template <class L, class S, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const S& s, std::size_t i, Tail tail, R&) const {
    auto g = vload<L>(s.grad + i, tail);
    if (!first) g = g + vload<L>(s.accum + i, tail);
    vstore<L>(s.accum + i, g * typename L::vec(scale), tail);
  }
};

/// Per chunk: sum of squares of the true gradient, in double (no finite gradient overflows it), and
/// whether any element is inf or NaN.
template <class P>
struct gradient_norm_pass : tensor_pass<P> {
  template <class L, class S, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const S& s, std::size_t i, Tail tail, R& r) const {
    const auto x = true_gradient<L>(s, i, tail, typename L::vec(this->d.grad_scale));
    r.nonfinite(x, tail);
    r.square64(i, x, tail);
  }
};

/// An update pass: per-group coefficients K (k[g] for group g) and the step's decision, copied
/// into each chunk's slice. A skipped step's chunks are empty, so it changes nothing.
template <class P, class K>
struct coefficient_pass : tensor_pass<P> {
  const K* k;
  using slice = coefficient_slice<P, K>;
  MPOPT_HOST_DEVICE std::size_t size(std::size_t ci) const { return this->d.decision->skip ? 0 : this->chunks[ci].size; }
  MPOPT_HOST_DEVICE slice at(std::size_t ci) const {
    const auto s = tensor_pass<P>::at(ci);
    return {s, k[s.group], this->d.decision->grad_scale};
  }
};

/// The element view a rule's stage sees (rule.hpp): vector i of one chunk, loaded and stored only
/// as the stage asks.
template <class L, class S, class Tail, class R>
struct element {
  using vec = typename L::vec;
  const S& s;
  std::size_t i;
  Tail tail;
  R& sums;
  MPOPT_HOST_DEVICE vec grad() const { return true_gradient<L>(s, i, tail, vec(s.scale)); }
  MPOPT_HOST_DEVICE vec param() const { return load_master<L>(s, i, tail); }
  MPOPT_HOST_DEVICE void set_param(vec p) const { store_param<L>(s, i, p, tail); }
  MPOPT_HOST_DEVICE vec state(std::size_t k) const { return vload<L>(s.state[k] + i, tail); }
  MPOPT_HOST_DEVICE void set_state(std::size_t k, vec x) const {
    vstore<L>(s.state[k] + i, state_to_store<L, typename S::precision>(x, s.rounding_key, k, s.index + i), tail);
  }
  MPOPT_HOST_DEVICE vec matrix() const { return vload<L>(s.matrix + i, tail); }
  MPOPT_HOST_DEVICE void set_matrix(vec x) const { vstore<L>(s.matrix + i, x, tail); }
  MPOPT_HOST_DEVICE void norm(std::size_t j, vec x) const {
    if (j == 0) sums.square(i, x, tail);
    else sums.square2(i, x, tail);
  }
  MPOPT_HOST_DEVICE float tensor_scale() const { return s.tensor_scale; }
};

/// The element view over quantized state (state_precision.hpp): vector j of the block at chunk
/// offset i - j, whose buffers it reads and writes in fp32 (block_values), each decoded whole at its
/// first access (a stage that writes a buffer in some lanes keeps the others).
template <class L, class S, class Tail, class R, class Block>
struct block_element : element<L, S, Tail, R> {
  using vec = typename L::vec;
  using storage = state_storage_t<typename S::precision>;
  Block& block;
  std::size_t j;
  MPOPT_HOST_DEVICE vec state(std::size_t k) const { return L::load(values(k) + j, this->tail); }
  MPOPT_HOST_DEVICE void set_state(std::size_t k, vec x) const {
    L::store(values(k) + j, x, this->tail);
    block.written[k] = true;
  }
  MPOPT_HOST_DEVICE float* values(std::size_t k) const {
    if (!block.decoded[k]) {
      const std::size_t g = this->i - j;
      dequantize_block<storage, L>(this->s.state[k].p + code_bytes<storage>(g), block.count,
                                   this->s.block_scales[k][g / storage::block], (this->s.nonnegative >> k) & 1u,
                                   block.values[k]);
      block.decoded[k] = true;
    }
    return block.values[k];
  }
};

/// Which of a rule's stages a pass runs: `update`, or `direction` before a reduction (feeding the
/// per-chunk sums of squares, square and square2) or before a matrix stage.
struct update_stage {
  static constexpr bool feeds_norms = false;
  template <class Rule, class K, class E>
  MPOPT_HOST_DEVICE static void run(const K& k, E& e) {
    Rule::update(k, e);
  }
};
struct direction_stage {
  static constexpr bool feeds_norms = true;
  template <class Rule, class K, class E>
  MPOPT_HOST_DEVICE static void run(const K& k, E& e) {
    Rule::direction(k, e);
  }
};

/// A matrix rule's `direction`, which writes the matrix stage's input (e.set_matrix) and feeds no sums.
struct matrix_input_stage {
  static constexpr bool feeds_norms = false;
  template <class Rule, class K, class E>
  MPOPT_HOST_DEVICE static void run(const K& k, E& e) {
    Rule::direction(k, e);
  }
};

/// A rule stage's slice: the group's scalars and the tensor's scale, copied once per chunk.
template <class P, class K>
struct rule_slice : coefficient_slice<P, K> {
  float tensor_scale;
};

/// One stage of a rule over every element; tensor_scale[t] (after a reduction) or 1. The update's
/// first pass may also sum the squares of the true gradient (square64, step_data::chunk_grad_sum):
/// the vector it loads anyway, so the status's norm costs no pass of its own.
template <class P, class Rule, class Stage>
struct rule_pass : coefficient_pass<P, typename Rule::scalars> {
  static constexpr std::size_t granule = state_granule<P>();
  using slice = rule_slice<P, typename Rule::scalars>;
  const float* tensor_scale = nullptr;
  bool sums_gradient = false;
  MPOPT_HOST_DEVICE slice at(std::size_t ci) const {
    const auto s = coefficient_pass<P, typename Rule::scalars>::at(ci);
    return {s, tensor_scale ? tensor_scale[s.tensor] : 1.0f};
  }
  template <class L, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const slice& s, std::size_t i, Tail tail, R& r) const {
    element<L, slice, Tail, R> e{s, i, tail, r};
    if (sums_gradient) r.square64(i, e.grad(), tail);
    Stage::template run<Rule>(s.c, e);
  }
  /// Over quantized state: the block at chunk offset g (count elements), vector by vector, then each
  /// buffer the stage wrote quantized.
  template <class L, class R>
  MPOPT_HOST_DEVICE void apply_granule(const slice& s, std::size_t g, std::size_t count, R& r) const {
    using St = state_storage_t<P>;
    constexpr std::size_t buffers = std::tuple_size_v<decltype(Rule::state)>;  // (array::size: host only under nvcc)
    block_values<St, buffers> block;
    block.count = count;
    std::size_t j = 0;
    for (; j + L::width <= count; j += L::width) apply_in_block<L>(s, block, g, j, full_t{}, r);
    if constexpr (L::width > 1)
      if (j < count) apply_in_block<L>(s, block, g, j, L::first(count - j), r);
    for (std::size_t k = 0; k < buffers; ++k)
      if (block.written[k])
        quantize_block<St, L>(block.values[k], count, (s.nonnegative >> k) & 1u, s.state[k].p + code_bytes<St>(g),
                              s.block_scales[k] + g / St::block);
  }
  template <class L, class Block, class Tail, class R>
  MPOPT_HOST_DEVICE void apply_in_block(const slice& s, Block& block, std::size_t g, std::size_t j, Tail tail, R& r) const {
    block_element<L, slice, Tail, R, Block> e{{s, g + j, tail, r}, block, j};
    if (sums_gradient) r.square64(g + j, e.grad(), tail);
    Stage::template run<Rule>(s.c, e);
  }
};

/// Tensor t's scale from its norms, completed across chunks and ranks (sums[t] and
/// sums[count + t], squared), by its group's scalars; the rule's per-tensor value goes to kept[t].
template <class Rule, class Tensor>
struct tensor_scales {
  const Tensor* tensors;
  const typename Rule::scalars* k;
  const double* sums;
  std::size_t count;
  double* kept;
  float* scale;
  MPOPT_HOST_DEVICE void operator()(std::size_t t) const {
    scale[t] = Rule::tensor_scale(k[tensors[t].group], ::sqrt(sums[t]), ::sqrt(sums[count + t]), kept[t]);
  }
};

/// Passes over a flat buffer: the chunks' `state` indexes it.
struct flat_pass {
  const chunk* chunks;
  pass_outputs out{};
  MPOPT_HOST_DEVICE std::size_t size(std::size_t ci) const { return chunks[ci].size; }
  MPOPT_HOST_DEVICE std::size_t at(std::size_t ci) const { return chunks[ci].state; }
};

/// Per chunk, the sum of squares of x in double (square64).
struct sum_squares_pass : flat_pass {
  const float* x;
  template <class L, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(std::size_t at, std::size_t i, Tail tail, R& r) const {
    r.square64(i, vload<L>(x + at + i, tail), tail);
  }
};

/// dst = src.
struct copy_pass : flat_pass {
  float* dst;
  const float* src;
  template <class L, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(std::size_t at, std::size_t i, Tail tail, R&) const {
    vstore<L>(dst + at + i, vload<L>(src + at + i, tail), tail);
  }
};

/// e += x; per chunk, the sum of squares of the new e in double.
struct add_into_pass : flat_pass {
  float* e;
  const float* x;
  template <class L, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(std::size_t at, std::size_t i, Tail tail, R& r) const {
    const auto v = vload<L>(e + at + i, tail) + vload<L>(x + at + i, tail);
    vstore<L>(e + at + i, v, tail);
    r.square64(i, v, tail);
  }
};

/// decoded = element i of the code.
struct decode_signs_pass : flat_pass {
  sign_code code;
  float* decoded;
  template <class L, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(std::size_t at, std::size_t i, Tail tail, R&) const {
    vstore<L>(decoded + at + i, code.template load<L>(0, at + i, tail), tail);
  }
};

/// Passes over a flat buffer whose chunks belong to segments (the chunk's `tensor`): at() gives
/// the chunk.
struct segment_pass {
  const chunk* chunks;
  pass_outputs out{};
  MPOPT_HOST_DEVICE std::size_t size(std::size_t ci) const { return chunks[ci].size; }
  MPOPT_HOST_DEVICE chunk at(std::size_t ci) const { return chunks[ci]; }
};

/// The server's average: c += sum over ranks r of ±weight[r * segments + k] (k: the chunk's
/// segment), the sign being the element's bit in block r (blocks of block_bytes, in rank order); c
/// holds the server error before. Sum c^2 in double.
struct combine_signs_pass : segment_pass {
  const std::uint8_t* blocks;
  std::size_t block_bytes;
  const float* weight;
  int ranks;
  std::size_t segments;
  float* c;
  template <class L, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const chunk& ch, std::size_t i, Tail tail, R& r) const {
    const std::size_t at = ch.state;
    typename L::vec acc(0.0f);
    for (int k = 0; k < ranks; ++k) {
      const auto positive = L::mask_of(sign_bits_at(blocks + std::size_t(k) * block_bytes, at + i));
      acc = acc + signed_scale(positive, typename L::vec(weight[std::size_t(k) * segments + ch.tensor]));
    }
    const auto v = acc + vload<L>(c + at + i, tail);
    vstore<L>(c + at + i, v, tail);
    r.square64(i, v, tail);
  }
};

/// Compresses x in place with the scale of each chunk's segment, scales[k] (compress_sign): the
/// sign of element i goes to bit i of `bits`, its residual stays in x. Works on 16 elements at a
/// time (two whole bytes; chunks start at multiples of 8), whatever the lane width.
struct compress_signs_pass : segment_pass {
  static constexpr std::size_t granule = 16;
  float* x;
  const float* scales;
  std::uint8_t* bits;
  template <class L, class R>
  MPOPT_HOST_DEVICE void apply_granule(const chunk& ch, std::size_t g, std::size_t count, R&) const {
    const std::size_t at = ch.state;
    const typename L::vec s(scales[ch.tensor]);
    std::uint32_t b = 0;
    std::size_t j = 0;
    for (; j + L::width <= count; j += L::width) b |= compress<L>(at + g + j, s, full_t{}) << j;
    if constexpr (L::width > 1)
      if (j < count) b |= compress<L>(at + g + j, s, L::first(count - j)) << j;
    bits[(at + g) / 8] = std::uint8_t(b);
    if (count > 8) bits[(at + g) / 8 + 1] = std::uint8_t(b >> 8);
  }
  /// The sign bits of one vector, its residual left in x.
  template <class L, class Tail>
  MPOPT_HOST_DEVICE std::uint32_t compress(std::size_t i, typename L::vec s, Tail tail) const {
    auto v = vload<L>(x + i, tail);
    const std::uint32_t b = L::bits_of(compress_sign(v, s)) & L::bits_of(tail);
    vstore<L>(x + i, v, tail);
    return b;
  }
};

// ---- ZeRO buckets: `chunks` are the pieces of a bucket; state = offset in the bucket.

/// out[state + i] = T((accum + grad) * scale), accum (indexed like out) null when nothing was
/// accumulated.
template <class P>
struct piece_pass {
  const tensor_slot<typename P::param_type, typename P::grad_type>* tensors;
  const chunk* chunks;
  pass_outputs out{};
  MPOPT_HOST_DEVICE std::size_t size(std::size_t ci) const { return chunks[ci].size; }
  MPOPT_HOST_DEVICE chunk at(std::size_t ci) const { return chunks[ci]; }
};

/// dst = src, or dst + src, computed in fp32 and rounded to dst's type.
template <class L, class D, class S, class Tail>
MPOPT_HOST_DEVICE void fold_vector(D* dst, const S* src, bool add, Tail tail) {
  auto g = vload<L>(src, tail);
  if (add) g = vload<L>(dst, tail) + g;
  vstore<L>(dst, g, tail);
}

/// packed[state + i] = T((accum + grad) * scale), accum (indexed like packed) null when nothing
/// was accumulated.
template <class P, class T>
struct pack_gradients_pass : piece_pass<P> {
  T* packed;
  const typename P::accumulate_type* accum;
  float scale;
  template <class L, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const chunk& c, std::size_t i, Tail tail, R&) const {
    auto g = vload<L>(this->tensors[c.tensor].grad + c.begin + i, tail);
    if (accum) g = vload<L>(accum + c.state + i, tail) + g;
    vstore<L>(packed + c.state + i, g * typename L::vec(scale), tail);
  }
};

/// grad = in[state - in_offset + i]: my reduced pieces of a bucket back into the gradient tensors.
template <class P, class T>
struct unpack_gradients_pass : piece_pass<P> {
  const T* in;
  std::size_t in_offset;
  template <class L, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const chunk& c, std::size_t i, Tail tail, R&) const {
    fold_vector<L>(this->tensors[c.tensor].grad + c.begin + i, in + (c.state - in_offset) + i, false, tail);
  }
};

/// Parameters between the tensors and a bucket, bit for bit: packed[state + i] = param (to_bucket)
/// or param = packed[state + i].
template <class P>
struct copy_params_pass : piece_pass<P> {
  typename P::param_type* packed;
  bool to_bucket;
  template <class L, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(const chunk& c, std::size_t i, Tail, R&) const {
    auto* param = this->tensors[c.tensor].param + c.begin;
    for (std::size_t j = i; j < i + L::width && j < c.size; ++j) {
      if (to_bucket) packed[c.state + j] = param[j];
      else param[j] = packed[c.state + j];
    }
  }
};

/// dst = src (add: dst + src) over n elements, cut into chunks of chunk_elements.
template <class D, class S>
struct fold_pass {
  D* dst;
  const S* src;
  std::size_t n;
  bool add;
  pass_outputs out{};
  MPOPT_HOST_DEVICE std::size_t count() const { return (n + chunk_elements - 1) / chunk_elements; }
  MPOPT_HOST_DEVICE std::size_t size(std::size_t ci) const {
    return n - ci * chunk_elements < chunk_elements ? n - ci * chunk_elements : chunk_elements;
  }
  MPOPT_HOST_DEVICE std::size_t at(std::size_t ci) const { return ci * chunk_elements; }
  template <class L, class Tail, class R>
  MPOPT_HOST_DEVICE void apply(std::size_t at, std::size_t i, Tail tail, R&) const {
    fold_vector<L>(dst + at + i, src + at + i, add, tail);
  }
};

}  // namespace mpopt::detail
