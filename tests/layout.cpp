// The layout, the thread count and the SIMD level are invisible: user-owned tensors (add) and a flat
// group (add_flat_group) give bit-identical params, masters, moments, trust ratios and statuses, with
// any number of threads (host::use_threads), and the host backend's AVX2 and AVX-512 paths give its scalar path's
// bits (each level this CPU runs is compared). Stochastically rounded parameters too.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "harness.hpp"
#include "threads.hpp"

using namespace harness;

namespace {

// A cheap deterministic value in [-1, 1) from (seed, step, element): the same for every instance.
double hashed(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return double(x >> 11) * 0x1p-52 - 1.0;
}

/// One optimizer over the given tensors (two groups) in one layout, stepped with `threads` threads.
template <class Opt>
struct instance {
  using P = typename Opt::param_type;
  using G = typename Opt::grad_type;
  Opt opt;
  int threads;
  mpopt::simd_level simd;
  std::vector<std::span<P>> params;
  std::vector<std::span<G>> grads;
  std::vector<std::vector<P>> own_p;
  std::vector<std::vector<G>> own_g;

  instance(layout lay, int threads_, const std::vector<std::vector<std::size_t>>& groups,
           const std::vector<typename Opt::group_options>& options, typename Opt::scaler_options so,
           mpopt::simd_level simd_ = mpopt::host::simd())
      : opt({}, so), threads(threads_), simd(simd_) {
    std::size_t n = 0;
    for (const auto& g : groups) n += g.size();
    own_p.reserve(n);
    own_g.reserve(n);
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      if (lay == layout::flat) {
        std::vector<mpopt::tensor_spec> specs;
        for (std::size_t i = 0; i < groups[gi].size(); ++i) specs.push_back({"t" + std::to_string(params.size() + i), groups[gi][i]});
        auto& g = opt.add_flat_group(options[gi], std::span<const mpopt::tensor_spec>(specs));
        for (std::size_t i = 0; i < groups[gi].size(); ++i) {
          params.push_back(g.param(i));
          grads.push_back(g.grad(i));
        }
      } else {
        auto& g = opt.add_group(options[gi]);
        for (std::size_t size : groups[gi]) {
          own_p.emplace_back(size, P(0.0f));
          own_g.emplace_back(size, G(0.0f));
          g.add(own_p.back(), own_g.back(), "t" + std::to_string(params.size()));
          params.push_back(own_p.back());
          grads.push_back(own_g.back());
        }
      }
    }
    std::size_t e = 0;
    for (auto& p : params)
      for (auto& x : p) x = from_double<P>(0.5 * hashed(e++ ^ 0x5EED));
  }

  /// Copies this step's gradients in and steps with this instance's thread count and SIMD level.
  mpopt::step_status step(const std::vector<std::vector<G>>& g) {
    for (std::size_t i = 0; i < grads.size(); ++i) std::copy(g[i].begin(), g[i].end(), grads[i].begin());
    force_threads(threads);
    mpopt::host::use_simd(simd);
    return opt.step();
  }
};

/// Gradients of step s: hashed values with a per-tensor magnitude, times the loss scale, rounded to G;
/// one NaN on step 9 and one inf on step 17 (a skipped step must be identical too).
template <class G>
std::vector<std::vector<G>> make_grads(const std::vector<std::size_t>& sizes, int s, double scale) {
  std::vector<std::vector<G>> g(sizes.size());
  std::size_t e = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const double mag = 1e-3 * (1 + double(i % 7));
    g[i].resize(sizes[i]);
    for (auto& x : g[i]) x = from_double<G>(mag * hashed((std::uint64_t(s) << 40) ^ e++) * scale);
  }
  if (s == 9) g[g.size() / 2][0] = from_double<G>(NAN);
  if (s == 17) g.back().back() = from_double<G>(INFINITY);
  return g;
}

template <class T>
bool same_bits(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

bool same(const mpopt::step_status& a, const mpopt::step_status& b) {
  return a.result == b.result && a.applied == b.applied && same_bits(a.scale_before, b.scale_before) &&
         same_bits(a.scale_after, b.scale_after) && same_bits(a.grad_norm, b.grad_norm) &&
         same_bits(a.grad_norm_clipped, b.grad_norm_clipped) && same_bits(a.clip_coef, b.clip_coef) && a.step == b.step &&
         a.skipped_steps == b.skipped_steps && a.consecutive_skips == b.consecutive_skips && a.micro_step == b.micro_step;
}

/// Steps every instance `steps` times and compares all of them with the first after every step.
template <class Opt>
void all_identical(std::vector<std::unique_ptr<instance<Opt>>>& runs, int steps) {
  using P = typename Opt::param_type;
  int applied = 0, skipped = 0;
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    std::vector<std::size_t> sizes;
    for (const auto& p : runs[0]->params) sizes.push_back(p.size());
    const auto grads = make_grads<typename Opt::grad_type>(sizes, s, runs[0]->opt.loss_scale());
    for (auto& r : runs) REQUIRE(r->opt.loss_scale() == runs[0]->opt.loss_scale());
    std::vector<mpopt::step_status> st;
    for (auto& r : runs) st.push_back(r->step(grads));
    (st[0].applied ? applied : skipped) += 1;
    const auto& a = runs[0]->opt;
    for (std::size_t j = 1; j < runs.size(); ++j) {
      CAPTURE(j);
      const auto& b = runs[j]->opt;
      CHECK(same(st[0], st[j]));
      std::size_t bad = 0;
      for (std::size_t i = 0; i < runs[0]->params.size(); ++i) {
        bad += !same_bits<P>(runs[0]->params[i], runs[j]->params[i]);
        bad += !same_bits<float>(a.master(i), b.master(i));
        bad += !same_bits<float>(a.moment(0, i), b.moment(0, i));
        bad += !same_bits<float>(a.moment(1, i), b.moment(1, i));
      }
      CHECK_MESSAGE(bad == 0, bad << " tensors' params/masters/moments differ from run 0");
      if constexpr (requires { a.lamb_coeffs(); }) CHECK(same_bits<double>(a.lamb_coeffs(), b.lamb_coeffs()));
      for (std::size_t g = 0; g < a.group_count(); ++g)
        CHECK(const_cast<Opt&>(a).group(g).step() == const_cast<Opt&>(b).group(g).step());
    }
  }
  CHECK(skipped == 2);
  CHECK(applied == steps - 2);
}

template <class Opt>
void run_layouts(const std::vector<std::vector<std::size_t>>& groups, const std::vector<typename Opt::group_options>& options,
                 int steps) {
  typename Opt::scaler_options so{};
  if constexpr (std::is_same_v<typename Opt::scaler_options, mpopt::dynamic_scale_options>) {
    so.init_scale = 1024;
    so.window = 5;
  }
  // Run 0 is user-owned with 2 threads; against it: flat with 2 threads (layout), user-owned with 1
  // thread and flat with 3 threads (thread count, transitively for both layouts).
  std::vector<std::unique_ptr<instance<Opt>>> runs;
  for (auto [lay, threads] : {std::pair{layout::unfused, 2}, {layout::flat, 2}, {layout::unfused, 1}, {layout::flat, 3}})
    runs.push_back(std::make_unique<instance<Opt>>(lay, threads, groups, options, so));
  const threads_restored restore;
  all_identical(runs, steps);
}

/// The scalar path with one thread against every other SIMD level this CPU runs, each with 1, 2 and 3
/// threads and both layouts.
template <class Opt>
void run_simd_levels(const std::vector<std::vector<std::size_t>>& groups,
                     const std::vector<typename Opt::group_options>& options, int steps) {
  typename Opt::scaler_options so{};
  if constexpr (std::is_same_v<typename Opt::scaler_options, mpopt::dynamic_scale_options>) {
    so.init_scale = 1024;
    so.window = 5;
  }
  std::vector<std::unique_ptr<instance<Opt>>> runs;
  runs.push_back(std::make_unique<instance<Opt>>(layout::unfused, 1, groups, options, so, mpopt::simd_level::scalar));
  std::string compared;
  for (auto level : {mpopt::simd_level::avx2, mpopt::simd_level::avx512}) {
    if (!mpopt::cpu_supports(level)) continue;
    compared += " " + std::string(mpopt::to_string(level));
    for (auto [lay, threads] : {std::pair{layout::unfused, 1}, {layout::flat, 2}, {layout::unfused, 3}})
      runs.push_back(std::make_unique<instance<Opt>>(lay, threads, groups, options, so, level));
  }
  MESSAGE("compared with the scalar path:" << (compared.empty() ? " nothing (this CPU has no AVX2)" : compared));
  const threads_restored restore_threads;
  const auto restore_simd = mpopt::host::simd();
  all_identical(runs, steps);
  mpopt::host::use_simd(restore_simd);
}

template <class Rule>
std::vector<typename Rule::options> two_groups() {
  typename Rule::options a, b;
  a.lr = 1e-3;
  a.weight_decay = 0.05;
  b.lr = 2e-3;
  b.weight_decay = 0.0;
  if constexpr (std::is_same_v<Rule, mpopt::adam>) b.decoupled_weight_decay = false;
  else if constexpr (std::is_same_v<Rule, mpopt::lamb>) b.eps_inside_sqrt = true;
  else a.freeze_step = b.freeze_step = 8;  // 1-bit LAMB: warm-up, then the compression stage
  return {a, b};
}

template <class Precision, class Rule>
struct combo {
  using precision = Precision;
  using rule = Rule;
  using scaler = std::conditional_t<std::is_same_v<typename Precision::param_type, mpopt::half>, mpopt::dynamic_scale,
                                    mpopt::no_scaling>;
  using opt = mpopt::optimizer<Precision, scaler, mpopt::replicated, Rule>;
};

}  // namespace

#define LAYOUT_COMBOS                                                                                      \
  combo<mpopt::fp32, mpopt::adam>, combo<mpopt::bf16, mpopt::lamb>, combo<mpopt::fp16, mpopt::adam>,      \
      combo<mpopt::bf16_stochastic, mpopt::adam>, combo<mpopt::fp16_stochastic, mpopt::lamb>,             \
      combo<mpopt::bf16, mpopt::adam>, combo<mpopt::fp32, mpopt::lamb>, combo<mpopt::fp16, mpopt::lamb>

TEST_SUITE("layout") {
  TEST_CASE_TEMPLATE("300 tensors of 1..5000 elements plus one of 200000: flat == user-owned, bit for bit, with 1, 2 and 3 threads",
                     C, LAYOUT_COMBOS) {
    using opt_t = typename C::opt;
    CAPTURE(std::string(C::precision::name));
    CAPTURE(std::string(mpopt::rounding_of_t<typename C::precision>::name));
    CAPTURE(std::string(C::rule::name));
    std::mt19937_64 rng(0x1A40);
    std::uniform_int_distribution<std::size_t> size(1, 5000);
    std::vector<std::vector<std::size_t>> groups(2);
    for (int i = 0; i < 300; ++i) groups[i % 2].push_back(size(rng));
    groups[0].insert(groups[0].begin() + 40, 200000);
    run_layouts<opt_t>(groups, two_groups<typename C::rule>(), 30);
  }

  TEST_CASE_TEMPLATE("3000 tiny tensors and tensors at chunk boundaries: flat == user-owned, bit for bit, with 1, 2 and 3 threads",
                     C, LAYOUT_COMBOS) {
    using opt_t = typename C::opt;
    CAPTURE(std::string(C::precision::name));
    CAPTURE(std::string(mpopt::rounding_of_t<typename C::precision>::name));
    CAPTURE(std::string(C::rule::name));
    std::mt19937_64 rng(0x1A41);
    std::uniform_int_distribution<std::size_t> size(1, 16);
    std::vector<std::vector<std::size_t>> groups(2);
    for (int i = 0; i < 3000; ++i) groups[i % 2].push_back(size(rng));
    for (std::size_t n : {65535, 65536, 65537, 131071}) groups[1].insert(groups[1].begin() + 100, n);
    run_layouts<opt_t>(groups, two_groups<typename C::rule>(), 30);
  }
}

TEST_SUITE("simd") {
  TEST_CASE_TEMPLATE("every SIMD level this CPU runs gives the scalar path's bits, with 1, 2 and 3 threads", C,
                     LAYOUT_COMBOS, combo<mpopt::fp16, mpopt::onebit_lamb>, combo<mpopt::bf16, mpopt::onebit_lamb>,
                     combo<mpopt::with_state<mpopt::bf16, mpopt::bf16_state<mpopt::stochastic_rounding>, mpopt::remainder16>,
                           mpopt::adam>) {
    using opt_t = typename C::opt;
    CAPTURE(std::string(C::precision::name));
    CAPTURE(std::string(mpopt::rounding_of_t<typename C::precision>::name));
    CAPTURE(std::string(C::rule::name));
    std::mt19937_64 rng(0x51D);
    std::uniform_int_distribution<std::size_t> size(1, 3000);
    std::vector<std::vector<std::size_t>> groups(2);
    for (int i = 0; i < 60; ++i) groups[i % 2].push_back(size(rng));
    // Every tail length of both vector widths, and chunk boundaries.
    for (std::size_t n : {1, 2, 7, 8, 9, 15, 16, 17, 23, 31, 33, 65535, 65536, 65537, 140001}) groups[n % 2].push_back(n);
    run_simd_levels<opt_t>(groups, two_groups<typename C::rule>(), 20);
  }
}

TEST_SUITE("layout") {
  TEST_CASE("for any shard order, equal shards or shards of whole tensors, every bucket's pieces and padding tile "
            "it once, each rank's piece where rank order puts it, and the ranks' owned elements tile every tensor once") {
    std::mt19937_64 rng(0x5AAD);
    for (int trial = 0; trial < 300; ++trial) {
      CAPTURE(trial);
      const std::size_t w = 1 + rng() % 4, group_count = 1 + rng() % 3;
      std::vector<std::uint32_t> groups;
      std::vector<std::size_t> sizes;
      for (std::uint32_t g = 0; g < group_count; ++g)
        for (std::size_t i = 0, n = 1 + rng() % 5; i < n; ++i) {
          groups.push_back(g);
          sizes.push_back(1 + rng() % (rng() % 2 ? 40 : 3000));
        }
      std::vector<std::size_t> ranks(w);  // the rank of each shard
      std::iota(ranks.begin(), ranks.end(), std::size_t{0});
      std::shuffle(ranks.begin(), ranks.end(), rng);
      const std::size_t bucket_elements = 1 + rng() % 2000;
      const bool whole = trial % 2 == 1;  // shards start at tensors (a layer-wise layout)
      CAPTURE(whole);
      std::vector<std::vector<std::size_t>> cuts(group_count);  // of each group, when whole
      for (std::uint32_t g = 0; whole && g < group_count; ++g) {
        std::vector<double> costs;
        for (std::size_t t = 0; t < sizes.size(); ++t)
          if (groups[t] == g) costs.push_back(double(1 + rng() % 1000));
        cuts[g] = mpopt::detail::balanced_cuts(costs, w);
      }
      std::vector<std::vector<int>> owned(sizes.size());
      for (std::size_t t = 0; t < sizes.size(); ++t) owned[t].assign(sizes[t], 0);
      for (std::size_t me = 0; me < w; ++me) {
        const auto shard = std::size_t(std::find(ranks.begin(), ranks.end(), me) - ranks.begin());
        std::vector<mpopt::detail::shard_plan> plans;
        for (std::uint32_t g = 0; g < group_count; ++g) plans.push_back({w, shard, ranks, true, cuts[g]});
        const mpopt::detail::flat_layout layout(groups, sizes, plans, true, true);
        CHECK(layout.shards_in_rank_order() == std::is_sorted(ranks.begin(), ranks.end()));
        for (std::size_t t = 0; t < sizes.size(); ++t) {
          const auto o = layout.owned(t);
          if (whole) CHECK((o.count == 0 || o.count == sizes[t]));
          for (std::size_t i = o.first; i < o.first + o.count; ++i) ++owned[t][i];
          CHECK(layout.pieces(t)[me].first == o.first);
          CHECK(layout.pieces(t)[me].count == o.count);
        }
        for (const auto& k : layout.buckets(bucket_elements)) {
          REQUIRE(k.counts.size() == w);
          std::vector<std::size_t> start(w + 1, 0);  // where each rank's piece starts, in rank order
          for (std::size_t r = 0; r < w; ++r) start[r + 1] = start[r] + k.counts[r];
          REQUIRE(start[w] == k.size());
          CHECK(k.my_offset == start[me]);
          std::vector<int> cover(k.size(), 0);
          for (std::size_t c = 0; c < k.pieces.size(); ++c) {
            const auto& p = k.pieces[c];
            const std::size_t r = ranks[p.owner];
            CHECK(p.state >= start[r]);
            CHECK(p.state + p.size <= start[r + 1]);
            for (std::size_t i = p.state; i < p.state + p.size && i < cover.size(); ++i) ++cover[i];
          }
          for (const auto& [at, n] : k.gaps)
            for (std::size_t i = at; i < at + n && i < cover.size(); ++i) ++cover[i];
          CHECK(std::count(cover.begin(), cover.end(), 1) == std::ptrdiff_t(cover.size()));
          for (std::size_t c = 0; c < k.mine.size(); ++c) {
            CHECK(k.mine[c].owner == shard);
            CHECK(k.mine[c].state >= k.my_offset);
            CHECK(k.mine[c].state + k.mine[c].size <= k.my_offset + k.counts[me]);
          }
        }
      }
      for (std::size_t t = 0; t < sizes.size(); ++t)
        CHECK(std::count(owned[t].begin(), owned[t].end(), 1) == std::ptrdiff_t(sizes[t]));
    }
  }

  TEST_CASE("whole tensors are cut where each rank's cost is nearest its share, never above it by more than one "
            "tensor; bad cuts are refused") {
    using mpopt::detail::balanced_cuts;
    using cuts = std::vector<std::size_t>;
    CHECK(balanced_cuts(std::vector<double>{1, 1, 1, 1}, 2) == cuts{0, 2});
    CHECK(balanced_cuts(std::vector<double>{9, 1, 1, 1}, 2) == cuts{0, 1});
    CHECK(balanced_cuts(std::vector<double>{5}, 3) == cuts{0, 0, 1});  // ranks 0 and 2 own no tensor
    CHECK(balanced_cuts(std::vector<double>{}, 2) == cuts{0, 0});
    std::mt19937_64 rng(0xC075);
    for (int trial = 0; trial < 500; ++trial) {
      const std::size_t n = rng() % 30, w = 1 + rng() % 6;
      std::vector<double> costs(n);
      for (double& c : costs) c = double(rng() % 1000);
      const cuts c = balanced_cuts(costs, w);
      REQUIRE(c.size() == w);
      CHECK(c.front() == 0);
      CHECK(std::is_sorted(c.begin(), c.end()));
      CHECK(c.back() <= n);
      const double total = std::accumulate(costs.begin(), costs.end(), 0.0);
      const double largest = n ? *std::max_element(costs.begin(), costs.end()) : 0.0;
      for (std::size_t r = 0; r < w; ++r) {
        const std::size_t end = r + 1 < w ? c[r + 1] : n;
        const double cost = std::accumulate(costs.begin() + std::ptrdiff_t(c[r]), costs.begin() + std::ptrdiff_t(end), 0.0);
        CHECK(cost <= total / double(w) + largest);
      }
    }
    const std::vector<std::uint32_t> groups = {0, 0, 0};
    const std::vector<std::size_t> sizes = {5, 300, 7};
    for (const cuts& bad : {cuts{0, 2}, cuts{1, 2, 3}, cuts{0, 2, 1}, cuts{0, 1, 4}}) {
      const std::vector<mpopt::detail::shard_plan> plans = {{3, 0, {}, true, bad}};
      CHECK_THROWS_WITH_AS(mpopt::detail::flat_layout(groups, sizes, plans, true, true),
                           doctest::Contains("first_tensors must give each of the 3 shards its first tensor"), mpopt::error);
    }
  }

  TEST_CASE("a shard order that is not one rank per shard is refused") {
    const std::vector<std::uint32_t> groups = {0, 0};
    const std::vector<std::size_t> sizes = {5, 300};
    using ranks = std::vector<std::size_t>;
    for (const ranks& bad : {ranks{0, 0, 2}, ranks{0, 1}, ranks{0, 1, 3}, ranks{2, 1, 0, 3}})
      CHECK_THROWS_WITH_AS(mpopt::detail::flat_layout(groups, sizes, 1, 3, 0, true, bad),
                           doctest::Contains("shard_ranks must give each of the 3 shards a rank of its own"), mpopt::error);
    CHECK_NOTHROW(mpopt::detail::flat_layout(groups, sizes, 1, 3, 0, true, ranks{2, 0, 1}));
  }
}
