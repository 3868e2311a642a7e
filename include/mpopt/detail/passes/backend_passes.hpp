// mpopt — the passes of a step as backend member functions, written once for every backend
// (host.hpp, cuda.hpp); detail/passes/passes.hpp says what each computes. A backend B derives from
// backend_passes<B> and says only how and where a pass runs:
//   run(list, pass, aligned)   every chunk of the work list; `aligned`: whole vectors may be loaded
//   run_flat(pass, aligned)    a pass over one flat range (fold_pass), on the caller's stream or thread
//   chunks(list)               the list's chunks, where B's kernels read them
//   placed(d)                  d with its tensor table where B's kernels read it
//   aligned(d)                 whether every tensor of d allows aligned vectors
//   for_each_index(n, f)       f(i) for i in [0, n): one thread per index (short loops: per tensor)
//   sum_segments(x, o, n, s)   segmented_sum below
//   sum_all(x, n, s)           *s = the sum of x[0, n) in double (step_sums below)
// A backend whose passes read the model's tensors from copies of its own (offload.hpp) also
// replaces the hooks below, where the optimizer says the tensors changed hands.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "passes.hpp"
#include "pass_finish.hpp"
#include "../math/sign_compression.hpp"
#include "step_data.hpp"
#include "../math/step_decision.hpp"
#include "work_list.hpp"

namespace mpopt::detail {

template <class B>
class backend_passes {
 public:
  template <class P>
  void initialize_state(const step_data<P>& d, const float* initial = nullptr) {
    update(d, initialize_pass<P>{{placed(d), chunks(*d.work)}, initial});
  }
  template <class P>
  void accumulate(const step_data<P>& d, bool first, float scale = 1.0f) {
    update(d, accumulate_pass<P>{{placed(d), chunks(*d.work)}, first, scale});
  }
  /// The overflow-and-norm pass: per chunk, the gradient's sum of squares into chunk_sums (double)
  /// and whether it holds inf or NaN.
  template <class P>
  void gradient_norm(const step_data<P>& d, double* chunk_sums) {
    update(d, norm_pass(d, chunk_sums));
  }
  /// gradient_norm, then step_sums and, given a rule, decide_step: one kernel where the backend runs
  /// what follows a pass in the pass's own (run_then).
  template <class P>
  void gradient_norm_sums(const step_data<P>& d, double* chunk_sums, double* sums, const step_rule* rule,
                          step_decision* decision) {
    self().run_then(*d.work, norm_pass(d, chunk_sums), self().aligned(d),
                    step_sums_finish(chunk_sums, d.chunk_nonfinite, d.work->size(), sums, rule, decision));
  }
  /// One stage of a rule (rule.hpp) over every element, with k[g] the scalars of group g and, after
  /// a reduction, tensor_scale[t] the factor of tensor t. A `direction` stage writes the per-chunk
  /// sums of squares its norms feed; the update's `first` stage also the gradient's, where d asks
  /// for them (chunk_grad_sum).
  template <class Rule, class Stage, class P>
  void rule_stage(const step_data<P>& d, const typename Rule::scalars* k, const float* tensor_scale = nullptr,
                  bool first = false) {
    update(d, stage_pass<Rule, Stage>(d, k, tensor_scale, first));
  }
  /// A reducing rule's first `direction` stage, then its per-tensor sums (segmented_sum over
  /// `offsets`, one segment per tensor and norm) and scales (tensor_scales): one kernel where the
  /// backend runs what follows a pass in the pass's own. For partials that need no combining
  /// across owners or ranks.
  template <class Rule, class Stage, class P>
  void rule_stage_scales(const step_data<P>& d, const typename Rule::scalars* k, const std::size_t* offsets,
                         double* sums, double* kept, float* scale) {
    static_assert(Stage::feeds_norms);
    const std::size_t n = d.tensor_count;
    self().run_then(*d.work, stage_pass<Rule, Stage>(d, k, nullptr, true), self().aligned(d),
                    segments_finish<scales<Rule, P>>{d.chunk_sum, offsets, 2 * n, sums, scales_of<Rule>(d, k, sums, kept, scale), n});
  }
  /// sums[s] = the sum of x over [offsets[s], offsets[s + 1]) in double (segment_sum, square_sum.hpp;
  /// on a GPU, CUB's order): per-chunk partials into per-tensor sums.
  template <class T>
  void segmented_sum(const T* x, const std::size_t* offsets, std::size_t segments, double* sums) {
    self().sum_segments(x, offsets, segments, sums);
  }
  /// The overflow-and-norm pass's per-chunk results summed where they are: sums[0] the squared
  /// norm, sums[1] the non-finite chunks (what ranks add up to agree on a skip).
  void step_sums(const double* chunk_sums, const std::uint8_t* chunk_nonfinite, std::size_t chunks, double* sums) {
    self().sum_all(chunk_sums, chunks, sums);
    self().sum_all(chunk_nonfinite, chunks, sums + 1);
  }
  /// The step's decision from those sums, by one thread.
  void decide_step(const step_rule& rule, const double* sums, step_decision* out) {
    self().for_each_index(1, detail::decide_step{rule, sums, out});
  }
  /// A reducing rule's per-tensor scales from the squared norms sums (tensor_scales, passes.hpp),
  /// unless the step is skipped: what the rule keeps per tensor is state.
  template <class Rule, class P>
  void tensor_scales(const step_data<P>& d, const typename Rule::scalars* k, const double* sums, double* kept,
                     float* scale) {
    self().for_each_index(d.tensor_count, scales_of<Rule>(d, k, sums, kept, scale));
  }
  template <class P>
  void zero_grad(const step_data<P>& d) {
    update(d, zero_grad_pass<P>{{placed(d), chunks(*d.work)}});
  }

  // Hooks: the passes read the tensors where they are, so nothing moves.
  /// Tensor i's gradient of this micro-step is complete (grad_ready).
  template <class P>
  void gradient_ready(const step_data<P>&, std::size_t) {}
  /// Every gradient of this micro-step is complete (step): the passes may read them now.
  template <class P>
  void gradients_in(const step_data<P>&) {}
  /// The parameters were set outside the passes (finalize, load): the passes read them from now on.
  template <class P>
  void params_in(const step_data<P>&) {}
  /// The committed step's parameters are final (tensor i's, or all of them for size_t(-1)): the
  /// model reads them from now on.
  template <class P>
  void params_out(const step_data<P>&, std::size_t) {}

  // Buckets: pieces start anywhere in a bucket, so their vectors are read element by element.

  /// out[c.state + i] = T((accum + grad) * scale); accum (indexed like out) null when nothing was
  /// accumulated.
  template <class P, class T>
  void pack_gradients(const step_data<P>& d, const work_list& pieces, T* out, const typename P::accumulate_type* accum,
                      float scale) {
    self().run(pieces, pack_gradients_pass<P, T>{{table(d), chunks(pieces)}, out, accum, scale}, false);
  }
  /// grad = in[c.state - in_offset + i]: my reduced pieces of a bucket back into the gradients.
  template <class P, class T>
  void unpack_gradients(const step_data<P>& d, const work_list& pieces, const T* in, std::size_t in_offset) {
    self().run(pieces, unpack_gradients_pass<P, T>{{table(d), chunks(pieces)}, in, in_offset}, false);
  }
  /// out[c.state + i] = param: this rank's updated pieces, to be gathered.
  template <class P>
  void pack_params(const step_data<P>& d, const work_list& pieces, typename P::param_type* out) {
    self().run(pieces, copy_params_pass<P>{{table(d), chunks(pieces)}, out, true}, false);
  }
  /// param = in[c.state + i]: every rank's pieces back into the parameter tensors.
  template <class P>
  void unpack_params(const step_data<P>& d, const work_list& pieces, const typename P::param_type* in) {
    self().run(pieces, copy_params_pass<P>{{table(d), chunks(pieces)}, const_cast<typename P::param_type*>(in), false},
               false);
  }
  /// dst = src (add: dst + src) over n elements, computed in fp32 and rounded to dst's type.
  template <class D, class S>
  void fold(D* dst, const S* src, std::size_t n, bool add) {
    self().run_flat(fold_pass<D, S>{dst, src, n, add}, is_aligned(dst) && is_aligned(src));
  }

  /// A pass of a rule's driver (rule_driver.hpp) over d's work list: make(tables, chunks) builds it
  /// from d as the backend's kernels read it (placed) and the list's chunks. Element by element:
  /// such passes may address buffers of their own, unaligned.
  template <class P, class Make>
  void tensor_pass(const step_data<P>& d, Make&& make) {
    self().run(*d.work, make(placed(d), chunks(*d.work)), false);
  }

  // Flat state-indexed buffers; the compressed all-reduce's chunks start at multiples of 16.

  void sum_squares(const work_list& w, const float* x, double* partial) {
    self().run(w, sum_squares_pass{{chunks(w), {.sum64 = partial}}, x}, true);
  }
  void copy(const work_list& w, float* dst, const float* src) { self().run(w, copy_pass{{chunks(w)}, dst, src}, true); }
  void add_into(const work_list& w, float* e, const float* x, double* partial) {
    self().run(w, add_into_pass{{chunks(w), {.sum64 = partial}}, e, x}, true);
  }
  void compress_signs(const work_list& w, float* x, const float* scales, std::uint8_t* bits) {
    self().run(w, compress_signs_pass{{chunks(w)}, x, scales, bits}, true);
  }
  void combine_signs(const work_list& w, const std::uint8_t* blocks, std::size_t block_bytes, const float* weight,
                     int ranks, std::size_t segments, float* c, double* partial) {
    self().run(w, combine_signs_pass{{chunks(w), {.sum64 = partial}}, blocks, block_bytes, weight, ranks, segments, c},
               true);
  }
  void decode_signs(const work_list& w, const sign_code& code, float* out) {
    self().run(w, decode_signs_pass{{chunks(w)}, code, out}, true);
  }

 private:
  B& self() { return static_cast<B&>(*this); }

  /// A pass over d's work list, with whole vectors where every tensor allows them.
  template <class P, class Pass>
  void update(const step_data<P>& d, const Pass& pass) {
    self().run(*d.work, pass, self().aligned(d));
  }
  /// A pass, then finish(0) once its sums are written: in order after it, where the backend has no
  /// way of its own (cuda.hpp runs it in the pass's kernel).
  template <class Pass, class Finish>
  void run_then(const work_list& w, const Pass& pass, bool aligned, const Finish& finish) {
    self().run(w, pass, aligned);
    self().for_each_index(1, finish);
  }

  template <class P>
  gradient_norm_pass<P> norm_pass(const step_data<P>& d, double* chunk_sums) {
    return {{placed(d), chunks(*d.work), {.sum64 = chunk_sums, .round64 = true, .nonfinite = d.chunk_nonfinite}}};
  }
  template <class Rule, class Stage, class P>
  rule_pass<P, Rule, Stage> stage_pass(const step_data<P>& d, const typename Rule::scalars* k, const float* tensor_scale,
                                       bool first) {
    pass_outputs out = Stage::feeds_norms ? pass_outputs{.sum = d.chunk_sum, .sum2 = d.chunk_sum2} : pass_outputs{};
    if (first) out.sum64 = d.chunk_grad_sum;
    return {{{placed(d), chunks(*d.work), out}, k}, tensor_scale, out.sum64 != nullptr};
  }
  /// Each tensor's scale, unless the step is skipped: what a reducing rule keeps per tensor is state.
  template <class Rule, class P>
  using scales = unless_skipped<detail::tensor_scales<Rule, tensor_slot<typename P::param_type, typename P::grad_type>>>;
  template <class Rule, class P>
  scales<Rule, P> scales_of(const step_data<P>& d, const typename Rule::scalars* k, const double* sums, double* kept,
                            float* scale) {
    return {d.decision, {table(d), k, sums, d.tensor_count, kept, scale}};
  }
  const chunk* chunks(const work_list& w) { return self().chunks(w); }
  template <class P>
  step_data<P> placed(const step_data<P>& d) {
    return self().placed(d);
  }
  template <class P>
  auto table(const step_data<P>& d) {
    return self().placed(d).tensors;
  }

 protected:
  /// Whole vectors of T: 16 bytes of fp32, 8 of 16-bit types (chunks start at multiples of 4).
  template <class T>
  static bool is_aligned(const T* p) {
    return reinterpret_cast<std::uintptr_t>(p) % (4 * sizeof(T)) == 0;
  }
};

}  // namespace mpopt::detail
