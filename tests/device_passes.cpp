// The device backend (cuda.hpp) against the host backend, pass by pass, on random tensor sets laid
// out as the optimizer lays them out (sizes 1, odd, across chunk boundaries; unaligned user
// tensors): every element it writes is bit for bit the host's (both call the same pass bodies), and
// its per-chunk sums equal the host's up to summation order (1e-5 relative for fp32 sums, 1e-12 for
// double ones; the host's sums are held to float64 references by the optimizer tests).
//
// Built with g++ and THRUST_DEVICE_SYSTEM_OMP (the device backend's source, run on the host), and
// by nvcc as device_passes.cu for the GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <mpopt/cuda.hpp>
#include <mpopt/host.hpp>
#include <mpopt/mpopt.hpp>

#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform_reduce.h>

#include "../include/mpopt/detail/exchange/flat_layout.hpp"
#include "mirrored.hpp"

namespace {

using mpopt::detail::chunk;
using mpopt::detail::work_list;
using update = mpopt::detail::update_stage;
using direction = mpopt::detail::direction_stage;

// The device backend models mpopt::backend_policy for every precision, and every rule's driver
// runs over it (detail::rule_driver), for every partition it serves.
static_assert(mpopt::backend_policy<mpopt::cuda, mpopt::fp32> && mpopt::backend_policy<mpopt::cuda, mpopt::fp16> &&
              mpopt::backend_policy<mpopt::cuda, mpopt::bf16_stochastic>);
static_assert(mpopt::detail::compression_passes<mpopt::cuda, mpopt::fp16>);
template <class Precision, class Partition, class Rule>
using device_pipeline =
    mpopt::detail::step_pipeline<Precision, mpopt::no_scaling, Partition, Rule, mpopt::cuda, mpopt::single_process>;
template <class Pipeline>
constexpr bool drives = mpopt::detail::rule_driver<typename Pipeline::driver_type, typename Pipeline::rule_context_type>;
static_assert(drives<device_pipeline<mpopt::fp32, mpopt::replicated, mpopt::adam>> &&
              drives<device_pipeline<mpopt::fp16, mpopt::zero1, mpopt::lamb>> &&
              drives<device_pipeline<mpopt::bf16, mpopt::zero2, mpopt::lamb>> &&
              drives<device_pipeline<mpopt::fp16, mpopt::replicated, mpopt::onebit_lamb>> &&
              drives<device_pipeline<mpopt::fp16, mpopt::replicated, mpopt::onebit_adam>> &&
              drives<device_pipeline<mpopt::fp16, mpopt::replicated, mpopt::zero_one_adam>>);

/// Tensors of random sizes in one group, laid out like a replicated optimizer's state, each user
/// tensor at `misalign` elements past an aligned start.
template <class P>
struct tensor_set {
  using param_t = typename P::param_type;
  using grad_t = typename P::grad_type;
  std::vector<std::size_t> sizes;
  work_list work;
  std::size_t state = 0;
  std::size_t misalign;
  mirrored<param_t> params;
  mirrored<grad_t> grads;
  std::vector<mpopt::detail::tensor_slot<param_t, grad_t>> host_table, device_table;

  tensor_set(std::vector<std::size_t> s, std::size_t shift, std::mt19937_64& rng)
      : sizes(std::move(s)), misalign(shift), params(total(sizes, shift)), grads(total(sizes, shift)) {
    const mpopt::detail::flat_layout layout(std::vector<std::uint32_t>(sizes.size(), 0), sizes, 1, 1, 0, false);
    work = layout.local_work();
    state = layout.local_elements();
    std::normal_distribution<float> normal;
    std::size_t at = shift;
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      for (std::size_t i = 0; i < sizes[t]; ++i) {
        params.host[at + i] = param_t(normal(rng));
        grads.host[at + i] = grad_t(normal(rng) * 0.1f);
      }
      const std::uint64_t first = host_table.empty() ? 0 : host_table.back().first + host_table.back().size;
      host_table.push_back({params.host.data() + at, grads.host.data() + at, sizes[t], 0, first});
      device_table.push_back({params.device.data() + at, grads.device.data() + at, sizes[t], 0, first});
      at = round(at + sizes[t]) + shift;
    }
  }
  static std::size_t round(std::size_t n) { return (n + 15) / 16 * 16; }
  static std::size_t total(const std::vector<std::size_t>& s, std::size_t shift) {
    std::size_t n = shift;
    for (std::size_t x : s) n = round(n + x) + shift;
    return n;
  }
};

/// Both backends' state for one tensor set.
template <class P>
struct both {
  tensor_set<P>& ts;
  mirrored<float> master, m, v;
  mirrored<typename P::accumulate_type> accum;
  mirrored<float> sums;  // per chunk: a direction stage's two sums of squares, [sum | sum2] as the optimizer lays them
  mirrored<double> grad_sum;  // the overflow-and-norm pass's sums of squares, in double
  mirrored<std::uint8_t> nonfinite;
  mirrored<mpopt::detail::step_decision> decision{1};
  mirrored<double> decision_sums{2};
  mpopt::detail::step_data<P> host_data, device_data;

  explicit both(tensor_set<P>& t)
      : ts(t), master(t.state), m(t.state), v(t.state), accum(t.state), sums(2 * t.work.size()),
        grad_sum(t.work.size()), nonfinite(t.work.size()) {
    host_data = make(false);
    device_data = make(true);
  }
  mpopt::detail::step_data<P> make(bool device) {
    mpopt::detail::step_data<P> d;
    d.tensors = device ? ts.device_table.data() : ts.host_table.data();
    d.tensor_count = ts.sizes.size();
    d.work = &ts.work;
    auto pick = [&](auto& b) { return device ? b.device.data() : b.host.data(); };
    if constexpr (P::has_master) d.master = pick(master);
    d.state[0] = pick(m);
    d.state[1] = pick(v);
    d.state_count = 2;
    d.chunk_sum = pick(sums);
    d.chunk_sum2 = pick(sums) + ts.work.size();
    d.chunk_nonfinite = pick(nonfinite);
    d.decision = pick(decision);
    d.rounding_key = mpopt::detail::rounding_key(7, 1);  // read under stochastic rounding only
    return d;
  }
  /// Both backends decide from their own overflow-and-norm sums; the device's decision is returned.
  mpopt::detail::step_decision decide(mpopt::host& host_backend, mpopt::cuda& device, const mpopt::detail::step_rule& rule) {
    host_backend.step_sums(grad_sum.host.data(), nonfinite.host.data(), ts.work.size(), decision_sums.host.data());
    host_backend.decide_step(rule, decision_sums.host.data(), decision.host.data());
    device.step_sums(grad_sum.device.data(), nonfinite.device.data(), ts.work.size(), decision_sums.device.data());
    device.decide_step(rule, decision_sums.device.data(), decision.device.data());
    return decision.download(device)[0];
  }
  /// Every buffer written by either backend: the device's copy equals the host's, bit for bit.
  void check_elements(mpopt::cuda& b) {
    CHECK(same_bits(ts.params.download(b), ts.params.host));
    CHECK(same_bits(ts.grads.download(b), ts.grads.host));
    CHECK(same_bits(master.download(b), master.host));
    CHECK(same_bits(m.download(b), m.host));
    CHECK(same_bits(v.download(b), v.host));
    CHECK(same_bits(accum.download(b), accum.host));
  }
};

template <class T>
void check_sums(const std::vector<T>& device, const std::vector<T>& host, double tolerance) {
  REQUIRE(device.size() == host.size());
  int bad = 0;
  for (std::size_t c = 0; c < host.size(); ++c) {
    const double want = double(host[c]), got = double(device[c]);
    if (!(std::fabs(got - want) <= tolerance * std::fabs(want) + 1e-30) && bad++ < 3)
      FAIL_CHECK("chunk ", c, ": device ", got, ", host ", want);
  }
  CHECK(bad == 0);
}

bool same_decision(const mpopt::detail::step_decision& a, const mpopt::detail::step_decision& b) {
  return a.sumsq == b.sumsq && a.nonfinite == b.nonfinite && a.norm == b.norm && a.clip == b.clip &&
         a.grad_scale == b.grad_scale && a.skip == b.skip;
}

std::vector<std::size_t> random_sizes(std::mt19937_64& rng) {
  std::vector<std::size_t> s = {1, 7, 16, 3};
  std::uniform_int_distribution<std::size_t> small(1, 300), big(60000, 140000);
  for (int i = 0; i < 4; ++i) s.push_back(small(rng));
  s.push_back(big(rng));
  s.push_back(65536);
  s.push_back(65537);
  return s;
}

template <class P>
void adam_and_lamb(std::size_t misalign) {
  std::mt19937_64 rng(42 + misalign);
  tensor_set<P> ts(random_sizes(rng), misalign, rng);
  both<P> s(ts);
  mpopt::cuda device;
  mpopt::host host_backend;
  ts.params.upload(device);
  ts.grads.upload(device);

  host_backend.initialize_state(s.host_data);
  device.initialize_state(s.device_data);
  s.check_elements(device);

  // Two micro-steps of accumulation, then Adam on the accumulated gradient.
  for (bool first : {true, false}) {
    auto h = s.host_data, d = s.device_data;
    h.accum = s.accum.host.data();
    d.accum = s.accum.device.data();
    host_backend.accumulate(h, first, 0.5f);
    device.accumulate(d, first, 0.5f);
  }
  s.check_elements(device);

  mpopt::detail::adam_coefficients k{1e-3f, 0.9f, 0.999f, 0.1f, 0.001f, 1.9f, 1.3f, 1e-8f, 0.01f, true};
  mirrored<mpopt::detail::adam_coefficients> coefficients(1);
  coefficients.host[0] = k;
  coefficients.upload(device);
  for (int step = 0; step < 3; ++step) {
    auto h = s.host_data, d = s.device_data;
    h.accum = s.accum.host.data();
    d.accum = s.accum.device.data();
    h.grad_scale = d.grad_scale = 0.25f;
    host_backend.gradient_norm(h, s.grad_sum.host.data());
    device.gradient_norm(d, s.grad_sum.device.data());
    check_sums(s.grad_sum.download(device), s.grad_sum.host, 1e-12);
    CHECK(same_bits(s.nonfinite.download(device), s.nonfinite.host));
    // The decision (clip 1: these gradients' norm is larger) from each backend's per-chunk sums, so
    // within their tolerance; the update then reads the host's on both, so the elements match bits.
    const mpopt::detail::step_rule rule{0.25, 1.0, 1.0, true};
    const mpopt::detail::step_decision on_device = s.decide(host_backend, device, rule), &on_host = s.decision.host[0];
    CHECK_FALSE(on_host.skip);
    CHECK_FALSE(on_device.skip);
    CHECK(on_host.clip < 1.0);
    check_sums(std::vector<double>{on_device.sumsq, on_device.clip}, std::vector<double>{on_host.sumsq, on_host.clip}, 1e-5);
    CHECK(on_host.grad_scale == float(0.25 * on_host.clip));
    // The same sums and decision in the norm pass's own kernel: each backend's bits again (on a
    // GPU its last block adds in another order than CUB's, so to summation order).
    mirrored<double> fused_sums(2);
    mirrored<mpopt::detail::step_decision> fused(1);
    host_backend.gradient_norm_sums(h, s.grad_sum.host.data(), fused_sums.host.data(), &rule, fused.host.data());
    device.gradient_norm_sums(d, s.grad_sum.device.data(), fused_sums.device.data(), &rule, fused.device.data());
    CHECK(same_bits(fused_sums.host, s.decision_sums.host));
    CHECK(same_decision(fused.host[0], on_host));
    const mpopt::detail::step_decision on_device_fused = fused.download(device)[0];
    if (MPOPT_DEVICE_IS_GPU) {
      check_sums(fused_sums.download(device), s.decision_sums.download(device), 1e-12);
      check_sums(std::vector<double>{on_device_fused.sumsq, on_device_fused.clip},
                 std::vector<double>{on_device.sumsq, on_device.clip}, 1e-12);
    } else {
      CHECK(same_bits(fused_sums.download(device), s.decision_sums.download(device)));
      CHECK(same_decision(on_device_fused, on_device));
    }
    s.decision.upload(device);
    host_backend.rule_stage<mpopt::adam, update>(h, coefficients.host.data());
    device.rule_stage<mpopt::adam, update>(d, coefficients.device.data());
    s.check_elements(device);
    coefficients.host[0].decoupled = step % 2 == 1;
    coefficients.upload(device);
  }

  // LAMB's two passes on the plain gradients.
  mirrored<mpopt::detail::lamb_coefficients> lk(1);
  lk.host[0] = {0.9f, 0.999f, 0.1f, 0.001f, 1e-6f, 0.01f, false, 1e-3, 0.01, 10.0};
  lk.upload(device);
  mirrored<float> alpha(ts.sizes.size());
  for (std::size_t t = 0; t < alpha.host.size(); ++t) alpha.host[t] = 1e-3f * float(t + 1);
  alpha.upload(device);
  // The moments pass, then the per-tensor sums and trust ratios: on the host as separate calls,
  // on the device in the pass's own kernel.
  const std::size_t n = ts.sizes.size();
  const mpopt::detail::norm_segments segments(ts.work, n);
  REQUIRE(segments.second.empty());
  mirrored<std::size_t> offsets(segments.first.size());
  offsets.host = segments.first;
  offsets.upload(device);
  mirrored<double> tensor_sums(2 * n), kept(n);
  mirrored<float> ratio(n);
  host_backend.rule_stage<mpopt::lamb, direction>(s.host_data, lk.host.data(), nullptr, true);
  host_backend.segmented_sum(s.sums.host.data(), offsets.host.data(), 2 * n, tensor_sums.host.data());
  host_backend.tensor_scales<mpopt::lamb>(s.host_data, lk.host.data(), tensor_sums.host.data(), kept.host.data(),
                                          ratio.host.data());
  device.rule_stage_scales<mpopt::lamb, direction>(s.device_data, lk.device.data(), offsets.device.data(),
                                                   tensor_sums.device.data(), kept.device.data(), ratio.device.data());
  check_sums(s.sums.download(device), s.sums.host, 1e-5);
  check_sums(tensor_sums.download(device), tensor_sums.host, 1e-5);
  check_sums(kept.download(device), kept.host, 1e-5);
  check_sums(ratio.download(device), ratio.host, 1e-5);
  CHECK(std::count(ratio.host.begin(), ratio.host.end(), 0.0f) == 0);
  host_backend.rule_stage<mpopt::lamb, update>(s.host_data, lk.host.data(), alpha.host.data());
  device.rule_stage<mpopt::lamb, update>(s.device_data, lk.device.data(), alpha.device.data());
  s.check_elements(device);

  // An overflow in one element of the big tensor is seen by its chunk only.
  const std::size_t victim = ts.host_table[8].grad - ts.grads.host.data() + 70000 % ts.sizes[8];
  ts.grads.host[victim] = typename P::grad_type(INFINITY);
  ts.grads.upload(device);
  host_backend.gradient_norm(s.host_data, s.grad_sum.host.data());
  device.gradient_norm(s.device_data, s.grad_sum.device.data());
  const auto flags = s.nonfinite.download(device);
  CHECK(same_bits(flags, s.nonfinite.host));
  CHECK(std::count(flags.begin(), flags.end(), 1) == 1);

  // ... and skips the step on both backends: the update passes then change nothing.
  CHECK(s.decide(host_backend, device, {1.0, 1.0, 1.0, true}).skip);
  CHECK(s.decision.host[0].skip);
  const auto params = ts.params.host;
  const auto m = s.m.host, v = s.v.host;
  host_backend.rule_stage<mpopt::adam, update>(s.host_data, coefficients.host.data());
  device.rule_stage<mpopt::adam, update>(s.device_data, coefficients.device.data());
  host_backend.rule_stage<mpopt::lamb, direction>(s.host_data, lk.host.data());
  device.rule_stage<mpopt::lamb, direction>(s.device_data, lk.device.data());
  host_backend.rule_stage<mpopt::lamb, update>(s.host_data, lk.host.data(), alpha.host.data());
  device.rule_stage<mpopt::lamb, update>(s.device_data, lk.device.data(), alpha.device.data());
  s.check_elements(device);
  CHECK(same_bits(ts.params.host, params));
  CHECK(same_bits(s.m.host, m));
  CHECK(same_bits(s.v.host, v));

  host_backend.zero_grad(s.host_data);
  device.zero_grad(s.device_data);
  s.check_elements(device);
}

/// Moments quantized in blocks of State (bf16 parameters, remainder16 masters): three Adam steps of
/// the device optimizer are the host optimizer's bits, parameters, masters and decoded moments, over
/// tensors of odd sizes and of several chunks.
template <class State>
void quantized_adam() {
  CAPTURE(State::name);
  using P = mpopt::with_state<mpopt::bf16, State, mpopt::remainder16>;
  using bf16 = mpopt::bfloat16;
  std::mt19937_64 rng(5);
  const std::vector<std::size_t> sizes = random_sizes(rng);
  mpopt::optimizer<P, mpopt::no_scaling, mpopt::replicated, mpopt::adam, mpopt::host> h;
  mpopt::optimizer<P, mpopt::no_scaling, mpopt::replicated, mpopt::adam, mpopt::cuda> d;
  auto& hg = h.add_group({.lr = 1e-2, .weight_decay = 0.01});
  auto& dg = d.add_group({.lr = 1e-2, .weight_decay = 0.01});
  mpopt::cuda copier;
  std::vector<mirrored<bf16>> params, grads;  // host side: the host optimizer's tensors
  params.reserve(sizes.size());
  grads.reserve(sizes.size());
  std::normal_distribution<float> normal;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    auto& p = params.emplace_back(sizes[t]);
    auto& g = grads.emplace_back(sizes[t]);
    for (auto& x : p.host) x = bf16(normal(rng));
    p.upload(copier);
    const std::string name = "t" + std::to_string(t);
    hg.add(p.host, g.host, name);
    dg.add(p.device_view(), g.device_view(), name);
  }
  for (int step = 0; step < 3; ++step) {
    for (auto& g : grads) {
      for (auto& x : g.host) x = bf16(normal(rng) * 0.1f);
      g.upload(copier);
    }
    REQUIRE(h.step().applied);
    REQUIRE(d.step().applied);
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      CAPTURE(t);
      REQUIRE(same_bits(params[t].download(copier), params[t].host));
      const auto hm = h.master(t);
      const auto dm = d.master(t);
      REQUIRE(std::equal(hm.begin(), hm.end(), dm.begin(), dm.end()));
      for (std::size_t k = 0; k < 2; ++k) {
        const auto a = h.moment(k, t);
        const auto b = d.moment(k, t);
        REQUIRE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
      }
    }
  }
}

}  // namespace

TEST_CASE("device optimizer = host optimizer over moments quantized in blocks: 8-bit, 4-bit and fp8 codes, block "
          "scales, remainder16 masters") {
  quantized_adam<mpopt::blockwise8_state>();
  quantized_adam<mpopt::blockwise4_state>();
  quantized_adam<mpopt::fp8_state>();
}

TEST_CASE("device passes = host passes: fp32, fp16, bf16, with stochastic rounding too; aligned and unaligned user tensors") {
  for (std::size_t misalign : {0, 1, 3}) {
    CAPTURE(misalign);
    adam_and_lamb<mpopt::fp32>(misalign);
    adam_and_lamb<mpopt::fp16>(misalign);
    adam_and_lamb<mpopt::bf16>(misalign);
    adam_and_lamb<mpopt::fp16_stochastic>(misalign);
    adam_and_lamb<mpopt::bf16_stochastic>(misalign);
  }
}

TEST_CASE("the device's blocks take chunks in order across tensors, each until it holds a chunk's worth of "
          "elements or eight chunks") {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<std::size_t> size(0, 140000);
  for (int round = 0; round < 20; ++round) {
    std::vector<std::size_t> sizes(std::size_t(1 + round * 50));
    for (auto& n : sizes) n = round % 4 == 0 ? size(rng) % 300 : size(rng);  // tiny tensors, and zeros, too
    const mpopt::detail::flat_layout layout(std::vector<std::uint32_t>(sizes.size(), 0), sizes, 1, 1, 0, false);
    const work_list w = layout.local_work();
    const std::vector<std::uint32_t> first = mpopt::detail::device_block_starts(w);
    REQUIRE(first.front() == 0);
    REQUIRE(first.back() == w.size());
    for (std::size_t b = 0; b + 1 < first.size(); ++b) {
      REQUIRE(first[b] < first[b + 1]);  // no empty block
      std::size_t elements = 0;
      for (std::size_t c = first[b]; c < first[b + 1]; ++c) elements += w[c].size;
      const std::size_t chunks = first[b + 1] - first[b];
      CHECK(chunks <= mpopt::detail::device_block_chunks);
      // Closed at its size or count, and not before (the last block takes what is left).
      if (b + 2 < first.size()) CHECK((elements >= mpopt::detail::chunk_elements || chunks == 8));
      CHECK(elements - w[first[b + 1] - 1].size < mpopt::detail::chunk_elements);
    }
  }
}

namespace {

std::uint32_t bits_of(float f) { return mpopt::detail::bit_cast<std::uint32_t>(f); }

/// Whether the device lanes widen half h (alone, and among others in a vector) to other bits than
/// float_bits.hpp's half_bits_to_float.
struct widen_differs {
  MPOPT_HOST_DEVICE std::uint64_t operator()(std::uint64_t h) const {
    using namespace mpopt::detail;
    const auto x = mpopt::half::from_bits(std::uint16_t(h)), y = mpopt::half::from_bits(std::uint16_t(h * 40503 + 1));
    const mpopt::half e[4] = {x, y, y, x};
    const quad v = widen4(e);
    const auto differs = [](float got, mpopt::half want) {
      return bit_cast<std::uint32_t>(got) != bit_cast<std::uint32_t>(half_bits_to_float(want.bits));
    };
    return differs(widen(x), x) || differs(v.x[0], x) || differs(v.x[1], y) || differs(v.x[3], x);
  }
};

/// Whether the device lanes narrow the float of bits i * stride to other bits than float_to_half_bits.
struct narrow_differs {
  std::uint64_t stride;
  MPOPT_HOST_DEVICE std::uint64_t operator()(std::uint64_t i) const {
    using namespace mpopt::detail;
    const float f = bit_cast<float>(std::uint32_t(i * stride)), g = bit_cast<float>(std::uint32_t(i * stride * 2654435761u));
    quad v;
    v.x[0] = v.x[3] = f;
    v.x[1] = v.x[2] = g;
    mpopt::half e[4];
    narrow4(v, e);
    const auto differs = [](mpopt::half got, float want) { return got.bits != float_to_half_bits(want); };
    return differs(narrow<mpopt::half>(f), f) || differs(e[0], f) || differs(e[1], g) || differs(e[3], f);
  }
};

}  // namespace

TEST_CASE("fp16 converts in the device lanes with float_bits.hpp's bits: every half, and every float on a GPU "
          "(where cvt converts; off it every 65,537th)") {
  const auto count = [](std::uint64_t n, auto differs) {
    return thrust::transform_reduce(thrust::device, thrust::counting_iterator<std::uint64_t>(0),
                                    thrust::counting_iterator<std::uint64_t>(n), differs, std::uint64_t{0},
                                    thrust::plus<std::uint64_t>());
  };
  CHECK(count(std::uint64_t{1} << 16, widen_differs{}) == 0);
  const std::uint64_t stride = MPOPT_DEVICE_IS_GPU ? 1 : 65537;
  CHECK(count((std::uint64_t{1} << 32) / stride, narrow_differs{stride}) == 0);
  // The checks see a difference: NaN's bits are the rule's, not any NaN.
  CHECK(bits_of(mpopt::detail::widen(mpopt::half::from_bits(0x7C01))) == 0x7FC02000u);
}
