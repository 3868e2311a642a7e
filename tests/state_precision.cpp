// State precision (with_state, state_precision.hpp): bf16 state rounded to nearest or stochastically,
// a remainder16 master, no master. Each step is checked against a float64 evaluation of Adam's and
// LAMB's formulas from the state the optimizer stored before it (as it reads it back), rounded as the
// storage says: to nearest, the stored value is that rounding (either neighbour where the exact value
// lies within float's error of a midpoint); stochastically, one of the two bf16 values around the
// exact one, and over all elements without bias. A remainder16 master is the fp32 master bit for bit;
// its parameter, the master rounded to nearest with ties away from zero, checked against a reference
// that rounds in double. Checkpoints resume bit for bit, and load into any other storage: quantized,
// rounded or decoded as that storage keeps state.
// State quantized in blocks: each block of a moment holds the map values nearest the exact update over
// the block's largest magnitude (either neighbour of a midpoint within float error; the maps written
// from their definitions in quantization_reference.hpp), whatever the SIMD level and thread count.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include <mpopt/adam.hpp>
#include <mpopt/checkpoint.hpp>
#include <mpopt/detail/checkpoint/state_file.hpp>
#include <mpopt/host_passes.hpp>  // the compiled mode has no passes for these precisions: this unit's own
#include <mpopt/lamb.hpp>
#include <mpopt/optimizer.hpp>
#include <mpopt/state_precision.hpp>

#include "error_of.hpp"
#include "quantization_reference.hpp"
#include "same_steps.hpp"
#include "threads.hpp"

namespace {

using mpopt::bfloat16;

template <class P, class Rule>
using opt = mpopt::optimizer<P, mpopt::no_scaling, mpopt::replicated, Rule>;
using bf16_moments_remainder = mpopt::with_state<mpopt::bf16, mpopt::bf16_state<>, mpopt::remainder16>;
using bf16_moments = mpopt::with_state<mpopt::bf16, mpopt::bf16_state<>>;
using stochastic_moments_remainder =
    mpopt::with_state<mpopt::bf16, mpopt::bf16_state<mpopt::stochastic_rounding>, mpopt::remainder16>;
using masterless = mpopt::with_state<mpopt::bf16_stochastic, mpopt::fp32_state, mpopt::no_master>;

// Sizes: 1, odd, and one over 65536 elements (several chunks).
const std::vector<std::size_t> sizes = {1, 7, 33, 1000, 70001};
constexpr double float_error = 0x1p-20;  // a few float roundings, relative to the terms of a formula

double bf16_value(std::uint16_t bits) { return float(bfloat16::from_bits(bits)); }
double bf16_nearest(double x) { return float(bfloat16(x)); }

/// The bf16 value next to b (a bf16 value) towards +inf.
double bf16_above(double b) {
  if (b == 0) return bf16_value(0x0001);
  const std::uint16_t bits = bfloat16(b).bits;
  return bf16_value(std::uint16_t(b > 0 ? bits + 1 : bits - 1));
}
double bf16_below(double b) { return -bf16_above(-b); }

/// Whether `stored` is a bf16 value.
bool is_bf16(float stored) { return (std::bit_cast<std::uint32_t>(stored) & 0xFFFFu) == 0; }

/// Whether `stored` is x rounded to nearest bf16, x known within `err`: the rounding of some value
/// of [x - err, x + err] (rounding is monotonic: the bf16 values between the ends' roundings).
bool nearest_bf16(float stored, double x, double err) {
  return is_bf16(stored) && stored >= bf16_nearest(x - err) && stored <= bf16_nearest(x + err);
}

/// The signed roundings of stochastically rounded values, in units of the gap each lies in: without
/// bias their mean is 0, within 5 standard deviations (each has a variance of at most 1/4).
struct rounding_bias {
  double sum = 0;
  std::size_t n = 0;
  bool unbiased() const { return std::fabs(sum / double(n)) < 5 * std::sqrt(0.25 / double(n)); }
};

/// Whether `stored` is one of the bf16 values around x (known within `err`); adds its rounding to
/// `bias`.
bool stochastic_bf16(float stored, double x, double err, rounding_bias& bias) {
  const double a = bf16_nearest(x - err), b = bf16_nearest(x + err);
  const double lo = a <= x - err ? a : bf16_below(a), hi = b >= x + err ? b : bf16_above(b);
  if (!is_bf16(stored) || stored < lo || stored > hi) return false;
  if (hi > lo) bias.sum += (stored - x) / (hi - lo), ++bias.n;
  return true;
}

/// The bf16 parameter of a finite master: to nearest, a tie away from zero, decided in double
/// (beyond the largest bf16, the next value would be 2^128: rounding there gives inf).
std::uint16_t nearest_away(float master) {
  const auto down = std::uint16_t(std::bit_cast<std::uint32_t>(master) >> 16), up = std::uint16_t(down + 1);
  if (std::isinf(master)) return down;
  auto value = [](std::uint16_t h) {
    const double x = bf16_value(h);
    return std::isinf(x) ? std::copysign(0x1p128, x) : x;
  };
  return std::fabs(double(master) - value(down)) < std::fabs(value(up) - double(master)) ? down : up;
}

struct model {
  std::vector<std::vector<bfloat16>> w, g;
  std::mt19937_64 rng{0x5eed};

  model() {
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (const std::size_t s : sizes) {
      w.emplace_back(s);
      g.emplace_back(s);
      for (auto& x : w.back()) x = bfloat16(n(rng));
    }
  }
  void backward() {
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (auto& t : g)
      for (auto& x : t) x = bfloat16(n(rng) * 1e-2f);
  }
  template <class Opt>
  void attach(Opt& o, const typename Opt::rule::options& h) {
    auto& group = o.add_group(h);
    for (std::size_t i = 0; i < w.size(); ++i) group.add(w[i], g[i], "w" + std::to_string(i));
  }
};

mpopt::optimizer_options no_clipping() {
  mpopt::optimizer_options o;
  o.clip_grad = 0;
  return o;
}

mpopt::adam::options adam_options() {
  mpopt::adam::options h;
  h.lr = 1e-2;
  h.weight_decay = 0.1;
  return h;
}

/// What one Adam step makes of the state the optimizer stored before it (one element), and the
/// size of the terms each result sums (what a float evaluation's error is relative to).
struct adam_step {
  double m, v, p, m_terms, v_terms, p_terms;
};
adam_step adam_reference(const mpopt::adam::options& h, std::uint64_t t, double m, double v, double p, double g) {
  const double bc1 = 1 - std::pow(h.beta1, double(t)), bc2 = 1 - std::pow(h.beta2, double(t));
  adam_step r;
  r.m = h.beta1 * m + (1 - h.beta1) * g;
  r.v = h.beta2 * v + (1 - h.beta2) * g * g;
  r.m_terms = h.beta1 * std::fabs(m) + (1 - h.beta1) * std::fabs(g);
  r.v_terms = r.v;
  const double u = (r.m / bc1) / (std::sqrt(r.v / bc2) + h.eps) + h.weight_decay * p;
  r.p = p - h.lr * u;
  // (m's terms, not m: where they cancel, m's float error is theirs)
  r.p_terms = std::fabs(p) + h.lr * ((r.m_terms / bc1) / (std::sqrt(r.v / bc2) + h.eps) + h.weight_decay * std::fabs(p));
  return r;
}

/// The stored state of every tensor, as fp32.
struct stored {
  std::vector<std::vector<float>> p, m, v, param;
  template <class Opt>
  explicit stored(const Opt& o, const model& x) {
    for (std::size_t i = 0; i < o.tensor_count(); ++i) {
      // (one declaration each: master() and moment() may return a span or a vector)
      const auto pm = o.master(i);
      const auto mm = o.moment(0, i);
      const auto vm = o.moment(1, i);
      p.emplace_back(pm.begin(), pm.end());
      m.emplace_back(mm.begin(), mm.end());
      v.emplace_back(vm.begin(), vm.end());
      param.emplace_back(x.w[i].begin(), x.w[i].end());
    }
  }
};

/// `steps` steps on fresh gradients, each checked by check(t, before, after) with the state stored
/// around it.
template <class Opt, class Check>
void each_step(Opt& o, model& a, std::uint64_t steps, Check&& check) {
  for (std::uint64_t t = 1; t <= steps; ++t) {
    a.backward();
    o.finalize();
    const stored before(o, a);
    o.step();
    check(t, before, stored(o, a));
  }
}

}  // namespace

TEST_CASE("remainder16: the bf16 parameter and its 16-bit remainder are the fp32 master exactly; the parameter "
          "is the master rounded to nearest, a tie away from zero") {
  std::mt19937_64 rng(16);
  std::vector<std::uint32_t> bits = {0x00000000u, 0x80000000u, 0x00000001u, 0x807FFFFFu, 0x3F800000u, 0x3F808000u,
                                     0xBF808000u, 0x3F807FFFu, 0x3F7FFFFFu, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F7F8000u,
                                     0x7F800000u, 0xFF800000u};
  for (int k = 0; k < 1 << 20; ++k) bits.push_back(std::uint32_t(rng()));
  for (const std::uint32_t b : bits) {
    const float master = std::bit_cast<float>(b);
    const auto s = mpopt::detail::split_master(master);
    if (std::isnan(master)) {
      CHECK(std::isnan(float(bfloat16::from_bits(s.param))));
      CHECK(std::isnan(mpopt::detail::join_master(s.param, s.remainder)));
      continue;
    }
    REQUIRE(std::bit_cast<std::uint32_t>(mpopt::detail::join_master(s.param, s.remainder)) == b);
    REQUIRE(s.param == nearest_away(master));
  }
}

TEST_CASE("bf16 state, remainder16 master: Adam's moments are stored as the bf16 nearest the exact update of "
          "the stored ones, the master bit for bit an fp32 master's, in 6 bytes a parameter instead of 12") {
  const auto h = adam_options();
  model a, b;  // remainder16; fp32 master
  opt<bf16_moments_remainder, mpopt::adam> with_remainder(no_clipping());
  opt<bf16_moments, mpopt::adam> with_master(no_clipping());
  a.attach(with_remainder, h);
  b.attach(with_master, h);
  for (std::uint64_t t = 1; t <= 6; ++t) {
    a.backward();
    b.g = a.g;
    with_remainder.finalize();
    const stored before(with_remainder, a);
    with_remainder.step();
    with_master.step();
    const stored after(with_remainder, a), other(with_master, b);
    for (std::size_t i = 0; i < sizes.size(); ++i)
      for (std::size_t j = 0; j < sizes[i]; ++j) {
        const auto r = adam_reference(h, t, before.m[i][j], before.v[i][j], before.p[i][j], float(a.g[i][j]));
        REQUIRE(nearest_bf16(after.m[i][j], r.m, r.m_terms * float_error));
        REQUIRE(nearest_bf16(after.v[i][j], r.v, r.v_terms * float_error));
        REQUIRE(std::fabs(after.p[i][j] - r.p) <= r.p_terms * float_error);
        // The master's bits, and the moments', are an fp32 master's; the parameter its rounding.
        REQUIRE(std::bit_cast<std::uint32_t>(after.p[i][j]) == std::bit_cast<std::uint32_t>(other.p[i][j]));
        REQUIRE(after.m[i][j] == other.m[i][j]);
        REQUIRE(after.v[i][j] == other.v[i][j]);
        REQUIRE(a.w[i][j].bits == nearest_away(after.p[i][j]));
      }
  }
  std::size_t state = 0;
  for (const auto& buffer : with_remainder.memory_report().buffers)
    if (buffer.name == "master remainder" || buffer.name == "exp_avg" || buffer.name == "exp_avg_sq") state += buffer.bytes;
  std::size_t elements = 0;
  for (const std::size_t s : sizes) elements += (s + 15) / 16 * 16;  // each tensor's padding to 64 bytes
  CHECK(state == 6 * elements);
}

TEST_CASE("bf16 state rounded stochastically, remainder16 master, LAMB: each stored moment is one of the two "
          "bf16 values around the exact update of the stored ones, without bias; the update reads them") {
  mpopt::lamb::options h;
  h.lr = 1e-2;
  h.weight_decay = 0.01;
  model a;
  opt<stochastic_moments_remainder, mpopt::lamb> o(no_clipping());
  a.attach(o, h);
  rounding_bias bias;
  each_step(o, a, 4, [&](std::uint64_t t, const stored& before, const stored& after) {
    const auto ratios = o.lamb_coeffs();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      // The trust ratio from the exact moments; the step from the stored ones.
      double pp = 0, uu = 0;
      std::vector<double> m(sizes[i]), v(sizes[i]), m_terms(sizes[i]);
      for (std::size_t j = 0; j < sizes[i]; ++j) {
        const double g = float(a.g[i][j]);
        m[j] = h.beta1 * before.m[i][j] + (1 - h.beta1) * g;
        v[j] = h.beta2 * before.v[i][j] + (1 - h.beta2) * g * g;
        m_terms[j] = h.beta1 * std::fabs(before.m[i][j]) + (1 - h.beta1) * std::fabs(g);
        const double u = m[j] / (std::sqrt(v[j]) + h.eps) + h.weight_decay * before.p[i][j];
        pp += double(before.p[i][j]) * before.p[i][j];
        uu += u * u;
      }
      const double ratio = std::clamp(std::sqrt(pp) / std::sqrt(uu), h.min_coeff, h.max_coeff);
      REQUIRE(std::fabs(ratios[i] - ratio) <= 1e-5 * ratio);
      const double step = h.lr * std::sqrt(1 - std::pow(h.beta2, double(t))) / (1 - std::pow(h.beta1, double(t)));
      for (std::size_t j = 0; j < sizes[i]; ++j) {
        REQUIRE(stochastic_bf16(after.m[i][j], m[j], m_terms[j] * float_error, bias));
        REQUIRE(stochastic_bf16(after.v[i][j], v[j], v[j] * float_error, bias));
        const double d = after.m[i][j] / (std::sqrt(double(after.v[i][j])) + h.eps);
        const double p = before.p[i][j] - step * ratios[i] * (d + h.weight_decay * before.p[i][j]);
        const double terms = std::fabs(before.p[i][j]) + step * ratios[i] * (std::fabs(d) + h.weight_decay * std::fabs(before.p[i][j]));
        REQUIRE(std::fabs(after.p[i][j] - p) <= terms * float_error);
      }
    }
  });
  CHECK(bias.unbiased());
}

TEST_CASE("no master: the bf16 parameter is the master, each update rounded into it stochastically, without bias") {
  const auto h = adam_options();
  model a;
  opt<masterless, mpopt::adam> o(no_clipping());
  a.attach(o, h);
  rounding_bias bias;
  each_step(o, a, 4, [&](std::uint64_t t, const stored& before, const stored& after) {
    for (std::size_t i = 0; i < sizes.size(); ++i)
      for (std::size_t j = 0; j < sizes[i]; ++j) {
        REQUIRE(before.p[i][j] == before.param[i][j]);  // master() is the parameter
        const auto r = adam_reference(h, t, before.m[i][j], before.v[i][j], before.p[i][j], float(a.g[i][j]));
        REQUIRE(std::fabs(after.m[i][j] - r.m) <= r.m_terms * float_error);
        REQUIRE(std::fabs(after.v[i][j] - r.v) <= r.v_terms * float_error);
        REQUIRE(stochastic_bf16(after.param[i][j], r.p, r.p_terms * float_error, bias));
      }
  });
  CHECK(bias.unbiased());
  bool listed = false;
  for (const auto& buffer : o.memory_report().buffers) listed = listed || buffer.name == "master" || buffer.name == "master remainder";
  CHECK_FALSE(listed);
}

/// o on a's tensors, three Adam steps; returns what it saves then.
template <class Opt>
std::vector<std::byte> saved_after_three_steps(Opt& o, model& a) {
  a.attach(o, adam_options());
  for (int t = 0; t < 3; ++t) {
    a.backward();
    o.step();
  }
  std::vector<std::byte> file;
  o.save(file);
  return file;
}

/// Three steps, save(), then three more steps both by the saver and by a second optimizer that
/// load()ed the file: parameters, masters and moments the same bits. Returns the file and the model.
template <class P>
std::pair<std::vector<std::byte>, model> check_resumes() {
  const auto h = adam_options();
  model a;
  opt<P, mpopt::adam> first(no_clipping());
  const std::vector<std::byte> file = saved_after_three_steps(first, a);
  model b = a;
  opt<P, mpopt::adam> second(no_clipping());
  b.attach(second, h);
  second.load(file);
  for (int t = 0; t < 3; ++t) {
    a.backward();
    b.g = a.g;
    first.step();
    second.step();
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    for (std::size_t j = 0; j < sizes[i]; ++j) REQUIRE(a.w[i][j].bits == b.w[i][j].bits);
    const auto m1 = first.master(i), m2 = second.master(i);
    REQUIRE(std::equal(m1.begin(), m1.end(), m2.begin(), m2.end()));
    for (std::size_t k = 0; k < 2; ++k) {
      const auto x = first.moment(k, i), y = second.moment(k, i);
      REQUIRE(std::equal(x.begin(), x.end(), y.begin(), y.end()));
    }
  }
  return {file, a};
}

TEST_CASE("a checkpoint of bf16 state and remainder16 masters resumes bit for bit") {
  check_resumes<stochastic_moments_remainder>();
}

TEST_CASE("stochastic rounding keeps the updates rounding to nearest loses: a second moment decaying by 0.1% a "
          "step, a bf16 parameter moving by a quarter of its step") {
  // Rounded to nearest, v * 0.999 is v again (half a bf16 step is 0.2% or more), and 1 - 0.001 is 1.
  model a;
  for (auto& t : a.w) std::fill(t.begin(), t.end(), bfloat16(1.0f));
  SUBCASE("the state") {
    auto h = adam_options();
    h.weight_decay = 0;
    opt<stochastic_moments_remainder, mpopt::adam> o(no_clipping());
    a.attach(o, h);
    for (auto& t : a.g) std::fill(t.begin(), t.end(), bfloat16(1.0f));
    o.step();
    for (auto& t : a.g) std::fill(t.begin(), t.end(), bfloat16(0.0f));
    const stored first(o, a);
    for (int t = 0; t < 100; ++t) o.step();
    const stored last(o, a);
    double ratio = 0, n = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      for (std::size_t j = 0; j < sizes[i]; ++j, ++n) ratio += last.v[i][j] / first.v[i][j];
    CHECK(std::fabs(ratio / n - std::pow(0.999, 100)) < 2e-3);
  }
  SUBCASE("the parameter, its own master") {
    auto h = adam_options();
    h.lr = 1e-3;
    h.weight_decay = 0;
    opt<masterless, mpopt::adam> o(no_clipping());
    a.attach(o, h);
    for (auto& t : a.g) std::fill(t.begin(), t.end(), bfloat16(1e-2f));
    for (int t = 0; t < 40; ++t) o.step();  // each step -lr: m / sqrt(v) is 1 for a constant gradient
    double mean = 0, n = 0;
    for (const auto& t : a.w)
      for (const bfloat16 x : t) mean += float(x), ++n;
    CHECK(std::fabs(mean / n - (1 - 40 * h.lr)) < 2e-3);
  }
}

// ---- State quantized in blocks: blockwise8_state, blockwise4_state, fp8_state.

namespace {

template <class State>
using blocks_remainder = mpopt::with_state<mpopt::bf16, State, mpopt::remainder16>;

/// The values State's map holds for a buffer (non-negative: the unsigned map), from the definitions.
template <class State>
std::vector<double> reference_map(bool nonnegative) {
  namespace q = quantization_reference;
  if constexpr (std::is_same_v<State, mpopt::fp8_state>) return q::reference_e4m3_values();
  else if constexpr (State::bits == 8) return q::reference_dynamic_map(!nonnegative, 8);
  else return nonnegative ? q::reference_linear_map4() : q::reference_dynamic_map(true, 4);
}

/// Whether `stored` (one block as the optimizer decodes it) is State's quantization of the exact
/// values x (x[j] known within err[j]): per element a map value v times the block's scale s (the
/// largest |x|, over 448 for fp8), v the nearest to x[j] / s, or either value beside a midpoint that
/// x[j] / s lies within its error of.
template <class State>
bool quantized_block(std::span<const float> stored, std::span<const double> x, std::span<const double> err,
                     const std::vector<double>& map) {
  const double per_unit = std::is_same_v<State, mpopt::fp8_state> ? 448.0 : 1.0;
  double largest = 0, largest_err = 0;
  for (std::size_t j = 0; j < x.size(); ++j) {
    largest = std::max(largest, std::fabs(x[j]));
    largest_err = std::max(largest_err, err[j]);
  }
  const double s = largest / per_unit, s_err = (largest_err + largest * 0x1p-23) / per_unit;
  for (std::size_t j = 0; j < x.size(); ++j) {
    if (largest <= largest_err) {  // a block of zeros, or all but zero
      if (std::fabs(stored[j]) > 2 * largest_err) return false;
      continue;
    }
    const double y = x[j] / s, y_err = (err[j] + std::fabs(y) * s_err) / s + 0x1p-22;
    double nearest = std::numeric_limits<double>::infinity();
    for (const double v : map) nearest = std::min(nearest, std::fabs(y - v));
    bool found = false;
    for (const double v : map)
      found = found || (std::fabs(y - v) <= nearest + 2 * y_err &&
                        std::fabs(stored[j] - v * s) <= std::fabs(v) * (s_err + s * 0x1p-22));
    if (!found) return false;
  }
  return true;
}

}  // namespace

TEST_CASE_TEMPLATE("state quantized in blocks, remainder16 master, Adam: each block of a moment holds the map "
                   "values nearest the exact update of the stored moments over the block's largest magnitude (the "
                   "unsigned map for exp_avg_sq); the master takes the exact update",
                   State, mpopt::blockwise8_state, mpopt::blockwise4_state, mpopt::fp8_state) {
  const auto h = adam_options();
  model a;
  opt<blocks_remainder<State>, mpopt::adam> o(no_clipping());
  a.attach(o, h);
  const auto signed_map = reference_map<State>(false), unsigned_map = reference_map<State>(true);
  each_step(o, a, 5, [&](std::uint64_t t, const stored& before, const stored& after) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::size_t n = sizes[i];
      std::vector<double> m(n), v(n), m_err(n), v_err(n);
      for (std::size_t j = 0; j < n; ++j) {
        const auto r = adam_reference(h, t, before.m[i][j], before.v[i][j], before.p[i][j], float(a.g[i][j]));
        m[j] = r.m, v[j] = r.v, m_err[j] = r.m_terms * float_error, v_err[j] = r.v_terms * float_error;
        REQUIRE(std::fabs(after.p[i][j] - r.p) <= r.p_terms * float_error);
        REQUIRE(a.w[i][j].bits == nearest_away(after.p[i][j]));
      }
      for (std::size_t b = 0; b < n; b += State::block) {
        CAPTURE(i);
        CAPTURE(b);
        const std::size_t c = std::min(State::block, n - b);
        REQUIRE(quantized_block<State>(std::span(after.m[i]).subspan(b, c), std::span(m).subspan(b, c),
                                       std::span(m_err).subspan(b, c), signed_map));
        REQUIRE(quantized_block<State>(std::span(after.v[i]).subspan(b, c), std::span(v).subspan(b, c),
                                       std::span(v_err).subspan(b, c), unsigned_map));
      }
    }
  });
  // The memory report: the remainders, each moment's codes and its scales, over each tensor padded
  // to whole blocks.
  std::size_t elements = 0;
  for (const std::size_t s : sizes) elements += (s + State::block - 1) / State::block * State::block;
  std::size_t state = 0;
  for (const auto& buffer : o.memory_report().buffers) {
    if (buffer.name == "master remainder") CHECK(buffer.bytes == 2 * elements);
    if (buffer.name == "exp_avg" || buffer.name == "exp_avg_sq") CHECK(buffer.bytes == elements * State::bits / 8);
    if (buffer.name == "exp_avg scales" || buffer.name == "exp_avg_sq scales")
      CHECK(buffer.bytes == elements / State::block * 4);
    if (buffer.name.starts_with("master") || buffer.name.starts_with("exp_avg")) state += buffer.bytes;
  }
  CHECK(state == elements * 2 + 2 * (elements * State::bits / 8 + elements / State::block * 4));
}

TEST_CASE_TEMPLATE("state quantized in blocks: every SIMD level and 1, 2 or 3 threads give the same bits, LAMB "
                   "included",
                   State, mpopt::blockwise8_state, mpopt::blockwise4_state, mpopt::fp8_state) {
  using P = blocks_remainder<State>;
  const threads_restored restore_threads;
  const auto restore_simd = mpopt::host::simd();
  auto run = [](mpopt::simd_level level, int threads) {
    mpopt::host::use_simd(level);
    force_threads(threads);
    model a;
    opt<P, mpopt::lamb> o(no_clipping());
    a.attach(o, mpopt::lamb::options{});
    for (int t = 0; t < 3; ++t) {
      a.backward();
      o.step();
    }
    return stored(o, a);
  };
  const stored first = run(mpopt::simd_level::scalar, 1);
  for (const auto level : {mpopt::simd_level::scalar, mpopt::simd_level::avx2, mpopt::simd_level::avx512}) {
    if (!mpopt::cpu_supports(level)) continue;
    for (int threads : {1, 2, 3}) {
      CAPTURE(mpopt::to_string(level));
      CAPTURE(threads);
      const stored again = run(level, threads);
      REQUIRE(again.p == first.p);
      REQUIRE(again.m == first.m);
      REQUIRE(again.v == first.v);
      REQUIRE(again.param == first.param);
    }
  }
  mpopt::host::use_simd(restore_simd);
}

TEST_CASE_TEMPLATE("state quantized in blocks: a checkpoint holds each moment's codes and scales, and resumes bit "
                   "for bit",
                   State, mpopt::blockwise8_state, mpopt::blockwise4_state, mpopt::fp8_state) {
  auto file = check_resumes<blocks_remainder<State>>().first;
  const mpopt::detail::state_reader f(mpopt::detail::state_source{"the checkpoint", std::span<const std::byte>(file)});
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::string name = "w" + std::to_string(i);
    CHECK(f.dtype("exp_avg/" + name) == "U8");
    CHECK(f.shape("exp_avg_sq/" + name) == std::vector<std::int64_t>{std::int64_t((sizes[i] * State::bits + 7) / 8)});
    CHECK(f.dtype("exp_avg_scale/" + name) == "F32");
    CHECK(f.shape("exp_avg_sq_scale/" + name) ==
          std::vector<std::int64_t>{std::int64_t((sizes[i] + State::block - 1) / State::block)});
  }
}

// ---- Loading across storages.

namespace {

/// Whether `stored` (a buffer as an optimizer of precision P reads it back) is P's storage of x: x
/// itself in fp32, x rounded to nearest in bf16, or each block of x quantized (quantized_block).
template <class P>
bool stored_as(std::span<const float> stored, std::span<const float> x, bool nonnegative) {
  using S = mpopt::state_storage_t<P>;
  if constexpr (std::is_same_v<S, mpopt::fp32_state>) {
    return std::ranges::equal(stored, x);
  } else if constexpr (mpopt::detail::quantized_in_blocks<S>) {
    const auto map = reference_map<S>(nonnegative);
    for (std::size_t b = 0; b < x.size(); b += S::block) {
      const std::size_t c = std::min(S::block, x.size() - b);
      const std::vector<double> exact(x.begin() + std::ptrdiff_t(b), x.begin() + std::ptrdiff_t(b + c)), err(c, 0.0);
      if (!quantized_block<S>(stored.subspan(b, c), exact, err, map)) return false;
    }
    return true;
  } else {
    for (std::size_t j = 0; j < x.size(); ++j)
      if (!nearest_bf16(stored[j], x[j], 0)) return false;
    return true;
  }
}

/// Three Adam steps in From, save(), load() into To: To's moments are its storage of From's (as From
/// reads them back), its masters From's exactly (without one, the parameter is the master); into
/// remainder16 the parameter is its master rounded to nearest, a tie away from zero.
template <class From, class To>
void check_converts() {
  CAPTURE(mpopt::detail::stored_precision_name<From>());
  CAPTURE(mpopt::detail::stored_precision_name<To>());
  model a;
  opt<From, mpopt::adam> first(no_clipping());
  const std::vector<std::byte> file = saved_after_three_steps(first, a);
  const stored saved(first, a);
  model b;  // other parameters: the file's replace them
  opt<To, mpopt::adam> second(no_clipping());
  b.attach(second, adam_options());
  second.load(file);
  const stored loaded(second, b);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    CAPTURE(i);
    REQUIRE(stored_as<To>(loaded.m[i], saved.m[i], false));
    REQUIRE(stored_as<To>(loaded.v[i], saved.v[i], true));
    REQUIRE(loaded.p[i] == (To::has_master ? saved.p[i] : saved.param[i]));
    for (std::size_t j = 0; j < sizes[i]; ++j)
      if constexpr (std::is_same_v<mpopt::master_storage_t<To>, mpopt::remainder16>)
        REQUIRE(b.w[i][j].bits == nearest_away(saved.p[i][j]));
      else
        REQUIRE(b.w[i][j].bits == a.w[i][j].bits);
  }
}

template <class... P>
struct storages {};

/// check_converts for From into each of To..., and back.
template <class From, class... To>
void check_converts_with(storages<To...>) {
  (([] {
     if constexpr (!std::is_same_v<From, To>) {
       check_converts<From, To>();
       check_converts<To, From>();
     }
   }()),
   ...);
}

}  // namespace

TEST_CASE("load() converts between state storages: a moment quantized, rounded or decoded as the optimizer stores "
          "it, a master split into its parameter and remainder or joined from them") {
  using all = storages<mpopt::bf16, bf16_moments, bf16_moments_remainder, blocks_remainder<mpopt::blockwise8_state>,
                       blocks_remainder<mpopt::blockwise4_state>, blocks_remainder<mpopt::fp8_state>>;
  check_converts_with<mpopt::bf16>(all{});
  check_converts_with<blocks_remainder<mpopt::blockwise8_state>>(
      storages<bf16_moments_remainder, blocks_remainder<mpopt::blockwise4_state>, blocks_remainder<mpopt::fp8_state>>{});
  check_converts_with<blocks_remainder<mpopt::blockwise4_state>>(storages<blocks_remainder<mpopt::fp8_state>>{});
  // Parameters rounded stochastically (not their master's nearest), and without a master, where
  // the parameter is the master.
  using stochastic_remainder = mpopt::with_state<mpopt::bf16_stochastic, mpopt::fp32_state, mpopt::remainder16>;
  check_converts_with<mpopt::bf16_stochastic>(storages<masterless, stochastic_remainder>{});
  check_converts_with<masterless>(storages<stochastic_remainder>{});
}

TEST_CASE("make_optimizer_as builds the types it is given from a configuration that agrees with them, and refuses "
          "one that does not, naming each difference") {
  using eight_bit = mpopt::with_state<mpopt::bf16, mpopt::blockwise8_state, mpopt::remainder16>;
  const std::string agrees = R"({"bf16": {"enabled": true}, "gradient_clipping": 0.5,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}}})";
  same_steps::check_same_steps<opt<eight_bit, mpopt::adam>, true>(agrees, 8, -1);
  CHECK(mpopt::make_optimizer_as<eight_bit, mpopt::no_scaling, mpopt::replicated, mpopt::adam>(
            mpopt::deepspeed_config::parse_text(agrees))
            .schedule()
            .has_value());

  const mpopt::deepspeed_config differs = mpopt::deepspeed_config::parse_text(
      R"({"fp16": {"enabled": true}, "zero_optimization": {"stage": 2}, "optimizer": {"type": "Lamb"}})");
  CHECK(error_of([&] { mpopt::make_optimizer_as<eight_bit, mpopt::no_scaling, mpopt::replicated, mpopt::adam>(differs); }) ==
        "mpopt: make_optimizer_as<bf16, no_scaling, replicated, adam>: the configuration says fp16 parameters where "
        "the types have bf16 parameters; a dynamic loss scale where the types have no loss scale; ZeRO stage 2 where "
        "the types have ZeRO stage 0; rule lamb where the types have rule adam");
  const mpopt::deepspeed_config four = mpopt::deepspeed_config::parse_text(
      R"({"bf16": {"enabled": true}, "optimizer": {"type": "Adam"},
          "train_batch_size": 64, "train_micro_batch_size_per_gpu": 8})",
      4);
  CHECK(error_of([&] { mpopt::make_optimizer_as<eight_bit, mpopt::no_scaling, mpopt::replicated, mpopt::adam>(four); })
            .find("the configuration was read for 4 ranks") != std::string::npos);
}
