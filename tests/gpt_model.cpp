// The example GPT (examples/gpt/model.hpp): exact gradients, layout, loss and causality, float vs
// double.
#include <doctest/doctest.h>

#include "../examples/gpt/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

std::vector<int> random_ids(std::size_t n, int vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> ids(n);
  for (int& id : ids) id = static_cast<int>(rng() % static_cast<std::uint32_t>(vocab));
  return ids;
}

// GPT-2 initialization leaves biases 0 and LayerNorm weights 1, which would hide errors in their
// gradients (and in the gradients that flow through them): perturb every parameter.
template <class T>
void perturb(gpt::net<T>& model, double noise, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, noise);
  for (T& p : model.params()) p += static_cast<T>(normal(rng));
}

struct batch {
  int B, t;
  std::vector<int> tokens, targets;
};

batch random_batch(int B, int t, int vocab, std::uint32_t seed) {
  const std::size_t n = static_cast<std::size_t>(B * t);
  return {B, t, random_ids(n, vocab, seed), random_ids(n, vocab, seed + 1)};
}

template <class T>
double loss_of(gpt::net<T>& model, const batch& data) {
  return model.forward(data.tokens, data.targets, data.B, data.t);
}

double max_abs(const std::vector<double>& values) {
  double m = 0;
  for (double v : values) m = std::max(m, std::abs(v));
  return m;
}

const gpt::shape tiny{.vocab = 7, .context = 5, .layers = 2, .heads = 2, .width = 4};

}  // namespace

TEST_CASE("gpt: every parameter's gradient matches central finite differences in double") {
  gpt::net<double> model(tiny);
  model.initialize(1);
  perturb(model, 0.3, 2);

  for (int t : {4, 1}) {
    CAPTURE(t);
    const batch data = random_batch(2, t, tiny.vocab, 3 + static_cast<std::uint32_t>(t));
    loss_of(model, data);
    std::vector<std::size_t> ready_order;
    model.backward(1.0, [&](std::size_t i) { ready_order.push_back(i); });
    const std::vector<double> analytic(model.grads().begin(), model.grads().end());

    // Each tensor reported once: lnf first, wte last.
    const std::size_t n_tensors = model.tensors().size();
    REQUIRE(ready_order.size() == n_tensors);
    std::vector<std::size_t> sorted = ready_order;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < n_tensors; ++i) CHECK(sorted[i] == i);
    CHECK(model.tensors()[ready_order[0]].name == "lnf.weight");
    CHECK(model.tensors()[ready_order[1]].name == "lnf.bias");
    CHECK(ready_order[n_tensors - 2] == 1);  // wpe
    CHECK(ready_order.back() == 0);          // wte

    // Linear in scale: 8 is a power of two, so the products are exact.
    model.backward(8.0, [](std::size_t) {});
    for (std::size_t i = 0; i < analytic.size(); ++i)
      CHECK(std::abs(model.grads()[i] - 8 * analytic[i]) <= 1e-12 * std::abs(8 * analytic[i]));

    const double h = 1e-5;
    double worst = 0, worst_abs = 0;
    std::span<double> params = model.params();
    for (const gpt::tensor_info& info : model.tensors())
      for (std::size_t k = info.offset; k < info.offset + info.size; ++k) {
        const double saved = params[k];
        params[k] = saved + h;
        const double up = loss_of(model, data);
        params[k] = saved - h;
        const double down = loss_of(model, data);
        params[k] = saved;
        const double fd = (up - down) / (2 * h);
        const double error = std::abs(analytic[k] - fd);
        worst = std::max(worst, error / (1e-9 + 1e-6 * std::abs(fd)));
        worst_abs = std::max(worst_abs, error);
        CAPTURE(info.name);
        CAPTURE(k - info.offset);
        CHECK(error <= 1e-9 + 1e-6 * std::abs(fd));
      }
    MESSAGE("t = " << t << ": max |analytic - fd| = " << worst_abs << ", max of it / tolerance = " << worst);
  }
}

TEST_CASE("gpt: layout") {
  const gpt::shape s{.vocab = 65, .context = 64, .layers = 4, .heads = 4, .width = 128};
  const std::vector<gpt::tensor_info> tensors = gpt::layout(s);
  const std::size_t V = 65, T = 64, L = 4, C = 128;
  REQUIRE(tensors.size() == 2 + 12 * L + 2);
  const gpt::tensor_info& last = tensors.back();
  CHECK(last.offset + last.size == V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C);

  struct expected {
    std::string name;
    std::vector<std::size_t> shape;
  };
  std::vector<expected> want{{"wte", {V, C}}, {"wpe", {T, C}}};
  for (std::size_t l = 0; l < L; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    const std::vector<expected> block{
        {h + "ln1.weight", {C}},           {h + "ln1.bias", {C}},
        {h + "attn.qkv.weight", {3 * C, C}}, {h + "attn.qkv.bias", {3 * C}},
        {h + "attn.proj.weight", {C, C}},  {h + "attn.proj.bias", {C}},
        {h + "ln2.weight", {C}},           {h + "ln2.bias", {C}},
        {h + "mlp.fc.weight", {4 * C, C}}, {h + "mlp.fc.bias", {4 * C}},
        {h + "mlp.proj.weight", {C, 4 * C}}, {h + "mlp.proj.bias", {C}}};
    want.insert(want.end(), block.begin(), block.end());
  }
  want.push_back({"lnf.weight", {C}});
  want.push_back({"lnf.bias", {C}});

  std::size_t offset = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    CAPTURE(i);
    CHECK(tensors[i].name == want[i].name);
    CHECK(tensors[i].shape == want[i].shape);
    CHECK(tensors[i].offset == offset);
    std::size_t size = 1;
    for (std::size_t d : want[i].shape) size *= d;
    CHECK(tensors[i].size == size);
    CHECK(tensors[i].decay == (want[i].shape.size() == 2));
    offset += size;
  }

  for (gpt::shape bad : {gpt::shape{.vocab = 0}, gpt::shape{.vocab = 5, .context = 0},
                         gpt::shape{.vocab = 5, .layers = 0}, gpt::shape{.vocab = 5, .heads = 0},
                         gpt::shape{.vocab = 5, .width = 0}, gpt::shape{.vocab = 5, .heads = 3}}) {
    CHECK_THROWS_AS(gpt::layout(bad), std::invalid_argument);
    CHECK_THROWS_AS(gpt::net<float>{bad}, std::invalid_argument);
  }
}

TEST_CASE("gpt: initialization") {
  const gpt::shape s{.vocab = 65, .context = 64, .layers = 4, .heads = 4, .width = 128};
  gpt::net<float> a(s), b(s);
  a.initialize(7);
  b.initialize(7);
  CHECK(std::equal(a.params().begin(), a.params().end(), b.params().begin()));
  b.initialize(8);
  CHECK(!std::equal(a.params().begin(), a.params().end(), b.params().begin()));

  for (const gpt::tensor_info& info : a.tensors()) {
    CAPTURE(info.name);
    const std::span<const float> p = std::as_const(a).params().subspan(info.offset, info.size);
    if (!info.decay) {
      const float want = info.name.ends_with("n1.weight") || info.name.ends_with("n2.weight") ||
                                 info.name == "lnf.weight"
                             ? 1.0f
                             : 0.0f;
      CHECK(std::all_of(p.begin(), p.end(), [&](float x) { return x == want; }));
      continue;
    }
    double sum = 0, squares = 0;
    for (float x : p) {
      sum += x;
      squares += double(x) * x;
    }
    const double n = static_cast<double>(p.size());
    const double std_dev = std::sqrt(squares / n - (sum / n) * (sum / n));
    const double want = info.name.ends_with("proj.weight") ? 0.02 / std::sqrt(8.0) : 0.02;
    CHECK(std::abs(std_dev / want - 1) < 5 / std::sqrt(n));
    CHECK(std::abs(sum / n) < 5 * want / std::sqrt(n));
  }
}

TEST_CASE("gpt: logits and loss are consistent") {
  const gpt::shape s{.vocab = 11, .context = 8, .layers = 2, .heads = 2, .width = 8};
  gpt::net<double> model(s);
  model.initialize(4);
  perturb(model, 0.3, 5);
  const batch data = random_batch(3, 8, s.vocab, 6);
  const double loss = loss_of(model, data);

  double total = 0;
  std::vector<std::vector<double>> before;
  for (int b = 0; b < data.B; ++b)
    for (int i = 0; i < data.t; ++i) {
      const std::span<const double> logits = model.logits(b, i);
      REQUIRE(logits.size() == static_cast<std::size_t>(s.vocab));
      before.emplace_back(logits.begin(), logits.end());
      const double m = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (double l : logits) sum += std::exp(l - m);
      total += m + std::log(sum) - logits[static_cast<std::size_t>(data.targets[static_cast<std::size_t>(b * data.t + i)])];
    }
  CHECK(loss == doctest::Approx(total / (data.B * data.t)).epsilon(1e-12));

  // Without targets: logits only, the same ones.
  CHECK(model.forward(data.tokens, {}, data.B, data.t) == 0.0);
  CHECK(std::equal(before[5].begin(), before[5].end(), model.logits(0, 5).begin()));
  CHECK_THROWS_AS(model.backward(1.0, [](std::size_t) {}), std::logic_error);

  // Causal: a token at position j changes no logits before j, and some at j.
  for (int j = 0; j < data.t; ++j) {
    CAPTURE(j);
    batch changed = data;
    int& token = changed.tokens[static_cast<std::size_t>(1 * data.t + j)];
    token = (token + 1) % s.vocab;
    loss_of(model, changed);
    for (int i = 0; i < data.t; ++i) {
      const std::span<const double> now = model.logits(1, i);
      const std::vector<double>& was = before[static_cast<std::size_t>(data.t + i)];
      CHECK(std::equal(was.begin(), was.end(), now.begin()) == (i < j));
      // Other sequences never change.
      CHECK(std::equal(before[static_cast<std::size_t>(i)].begin(), before[static_cast<std::size_t>(i)].end(),
                       model.logits(0, i).begin()));
    }
  }

  // Bad sizes and ids.
  const std::vector<int> ok(6, 0);
  CHECK_THROWS_AS(model.forward(ok, {}, 2, 4), std::invalid_argument);     // 6 != 8
  CHECK_THROWS_AS(model.forward(ok, {}, 0, 6), std::invalid_argument);     // B < 1
  CHECK_THROWS_AS(model.forward(std::vector<int>(9, 0), {}, 1, 9), std::invalid_argument);  // t > context
  CHECK_THROWS_AS(model.forward(std::vector<int>{0, 11}, {}, 1, 2), std::invalid_argument);
  CHECK_THROWS_AS(model.forward(std::vector<int>{0, -1}, {}, 1, 2), std::invalid_argument);
  CHECK_THROWS_AS(model.forward(std::vector<int>{0, 1}, std::vector<int>{0, 11}, 1, 2), std::invalid_argument);
  CHECK_THROWS_AS(model.forward(std::vector<int>{0, 1}, std::vector<int>{0}, 1, 2), std::invalid_argument);
  model.forward(std::vector<int>{0, 1}, {}, 1, 2);
  CHECK_THROWS_AS(model.logits(0, 2), std::invalid_argument);
  CHECK_THROWS_AS(model.logits(1, 0), std::invalid_argument);
}

TEST_CASE("gpt: float and double agree") {
  // Width 16 so that float runs full register tiles (16 columns) of the matmul as well as ragged ones.
  const gpt::shape s{.vocab = 13, .context = 16, .layers = 2, .heads = 4, .width = 16};
  gpt::net<double> reference(s);
  reference.initialize(9);
  perturb(reference, 0.1, 10);
  gpt::net<float> model(s);
  std::transform(reference.params().begin(), reference.params().end(), model.params().begin(),
                 [](double p) { return static_cast<float>(p); });
  // The float weights, exactly, in double.
  std::transform(model.params().begin(), model.params().end(), reference.params().begin(),
                 [](float p) { return static_cast<double>(p); });

  const batch data = random_batch(3, 16, s.vocab, 11);
  const double want = loss_of(reference, data);
  CHECK(loss_of(model, data) == doctest::Approx(want).epsilon(1e-5));
  reference.backward(1.0, [](std::size_t) {});
  model.backward(1.0f, [](std::size_t) {});

  const std::vector<double> expected(reference.grads().begin(), reference.grads().end());
  const double tolerance = 1e-3 * max_abs(expected);
  double worst = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    worst = std::max(worst, std::abs(double(model.grads()[i]) - expected[i]));
    CHECK(std::abs(double(model.grads()[i]) - expected[i]) <= tolerance);
  }
  MESSAGE("float gradients: worst error / max |gradient| = " << worst / max_abs(expected));
}
