// Rules written outside the library (examples/user_rules.hpp) over MPI, as the built-in rules are
// held (mpi_zero.cpp): with a deterministic communicator, replicated (sum_by_shard), zero1 and zero2
// train bit for bit alike at any world size; every rank ends with the same parameters; and W ranks
// train like one process that sees their W gradient slices as micro-steps (bit for bit on one rank).
// A partition written here, outside the library, trains to zero1's parameters.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <mpopt/mpi.hpp>
#include <mpopt/mpopt.hpp>

#include <string_view>

#include "../examples/user_rules.hpp"
#include "mpi_world.hpp"
#include "test_backend.hpp"

namespace {

/// Two groups (sizes 1, odd, and one spanning several shards and buckets), the same on every rank.
template <class Opt>
struct rig {
  using P = typename Opt::param_type;
  static constexpr std::size_t rule_state = Opt::rule::state.size();
  Opt opt;
  std::vector<std::vector<P>> params, grads;

  template <class Comm>
  rig(const typename Opt::group_options& a, const typename Opt::group_options& b, mpopt::optimizer_options oo,
        typename Opt::scaler_options so, Comm comm)
      : opt(oo, so, std::move(comm)) {
    const std::vector<std::vector<std::size_t>> sizes = {{1, 77, 70001}, {3, 1024}};
    for (std::size_t gi = 0; gi < 2; ++gi) {
      auto& g = opt.add_group(gi == 0 ? a : b);
      const std::size_t first = params.size();
      for (std::size_t n : sizes[gi]) {
        params.emplace_back(n);
        grads.emplace_back(n, P(0.0f));
        for (std::size_t i = 0; i < n; ++i) params.back()[i] = P(0.5f * std::sin(0.37f * float(i + 7 * params.size())));
      }
      for (std::size_t t = first; t < params.size(); ++t) g.add(params[t], grads[t], "t" + std::to_string(t));
    }
  }

  /// Micro-batch `slice` of step `step`: a fixed pseudo-random gradient, scaled by the loss scale.
  /// Every third step's norm is large enough for clipping to bind.
  void write(int step, int slice) {
    const float scale = float(opt.loss_scale()), size = step % 3 == 0 ? 0.05f : 0.002f;
    for (std::size_t t = 0; t < grads.size(); ++t)
      for (std::size_t i = 0; i < grads[t].size(); ++i) {
        std::uint64_t h = (std::uint64_t(step) * 1000003u + std::uint64_t(slice)) * 0x9E3779B97F4A7C15ull + t * 7919 + i;
        h ^= h >> 29;
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 32;
        grads[t][i] = P(size * (float(h % 20001) / 10000.0f - 1.0f) * scale);
      }
    // zero2 reduces buckets as backward reports tensors done: last first.
    for (std::size_t t = grads.size(); t-- > 0;) opt.grad_ready(t);
  }
};

/// "" when a's state (masters and the rule's buffers, the elements b holds) and parameters equal
/// b's bit for bit, otherwise what differs first; b may hold more than a (replicated vs a shard).
template <class A, class B>
std::string difference(const A& a, const B& b) {
  for (std::size_t t = 0; t < a.params.size(); ++t) {
    const auto o = a.opt.owned(t), whole = b.opt.owned(t);
    const std::size_t shift = o.first - whole.first;
    auto same = [&](auto x, auto y) { return std::equal(x.begin(), x.end(), y.begin() + std::ptrdiff_t(shift)); };
    if (!same(a.opt.master(t), b.opt.master(t))) return "masters of tensor " + std::to_string(t);
    for (std::size_t k = 0; k < A::rule_state; ++k)
      if (!same(a.opt.moment(k, t), b.opt.moment(k, t))) return "state " + std::to_string(k) + " of tensor " + std::to_string(t);
    for (std::size_t i = 0; i < a.params[t].size(); ++i)
      if (float(a.params[t][i]) != float(b.params[t][i])) return "parameters of tensor " + std::to_string(t);
  }
  return {};
}

template <class Precision, class Scaler, class Rule>
struct rule_cfg {
  using precision = Precision;
  using scaler = Scaler;
  using rule = Rule;
};

template <class Rule>
std::pair<typename Rule::options, typename Rule::options> options_of() {
  if constexpr (std::is_same_v<Rule, mpopt::adam> || std::is_same_v<Rule, mpopt::lamb>)
    return {{.lr = 1e-3}, {.lr = 3e-4}};
  else if constexpr (std::is_same_v<Rule, user_rules::lion>)
    return {{.lr = 1e-3, .weight_decay = 0.1}, {.lr = 3e-4, .beta1 = 0.95, .beta2 = 0.98}};
  else if constexpr (std::is_same_v<Rule, user_rules::sgd>)
    return {{.lr = 0.05, .weight_decay = 0.01, .nesterov = true}, {.lr = 0.02, .momentum = 0.8, .dampening = 0.1}};
  else
    return {{.lr = 0.5, .eta = 1e-2}, {.lr = 0.1, .momentum = 0.5, .weight_decay = 0.0, .eta = 2e-2}};
}

/// A partition written outside the library: zero1 with the shards in reverse rank order (rank r
/// holds shard W-1-r). It says only which elements a rank owns; zero1's exchange does the rest.
struct reversed_zero1 : mpopt::zero1 {
  static constexpr std::string_view name = "reversed_zero1";
  struct layout : mpopt::one_shard_each {
    static std::size_t owner(std::size_t shard, std::size_t world) { return world - 1 - shard; }
  };
};
static_assert(mpopt::partition_policy<reversed_zero1, mpopt::fp16, mpopt::host, mpopt::mpi>);

/// Whether a's parameters equal b's bit for bit.
template <class A, class B>
bool same_parameters(const A& a, const B& b) {
  for (std::size_t t = 0; t < a.params.size(); ++t)
    for (std::size_t i = 0; i < a.params[t].size(); ++i)
      if (float(a.params[t][i]) != float(b.params[t][i])) return false;
  return true;
}

#define USER_RULE_CFGS(R) \
  rule_cfg<mpopt::bf16, mpopt::no_scaling, R>, rule_cfg<mpopt::fp16, mpopt::dynamic_scale, R>, rule_cfg<mpopt::fp32, mpopt::no_scaling, R>

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE_TEMPLATE(
      "a user rule under a deterministic communicator: replicated (sum_by_shard), zero1 and zero2 train bit for "
      "bit alike, with the same parameters on every rank",
      C, USER_RULE_CFGS(user_rules::lion), USER_RULE_CFGS(user_rules::sgd), USER_RULE_CFGS(user_rules::lars)) {
    using P = typename C::precision;
    using S = typename C::scaler;
    using R = typename C::rule;
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    CAPTURE(std::string(R::name));
    const auto [a, b] = options_of<R>();
    const mpopt::optimizer_options o{.bucket_elements = 3000, .sum_by_shard = true};
    const typename S::options so{};
    const mpopt::mpi_options det{.deterministic = true};
    rig<mpopt::optimizer<P, S, mpopt::replicated, R, test_backend, mpopt::mpi>> rep(a, b, o, so, mpopt::mpi{MPI_COMM_WORLD, det});
    rig<mpopt::optimizer<P, S, mpopt::zero1, R, test_backend, mpopt::mpi>> z1(a, b, o, so, mpopt::mpi{MPI_COMM_WORLD, det});
    rig<mpopt::optimizer<P, S, mpopt::zero2, R, test_backend, mpopt::mpi>> z2(a, b, o, so, mpopt::mpi{MPI_COMM_WORLD, det});
    for (int s = 1; s <= 8; ++s) {
      CAPTURE(s);
      rep.write(s, rank);
      z1.write(s, rank);
      z2.write(s, rank);
      const auto st = rep.opt.step();
      CHECK(st.applied);
      CHECK(z1.opt.step().grad_norm == st.grad_norm);
      CHECK(z2.opt.step().grad_norm == st.grad_norm);
      const std::string d1 = difference(z1, rep), d2 = difference(z2, rep);
      CHECK_MESSAGE(d1.empty(), "zero1 differs from replicated: " << d1);
      CHECK_MESSAGE(d2.empty(), "zero2 differs from replicated: " << d2);
    }
    if constexpr (mpopt::reducing_rule<R>) {
      const auto kept = z1.opt.tensor_state(), whole = rep.opt.tensor_state();
      CHECK(std::equal(kept.begin(), kept.end(), whole.begin(), whole.end()));
    }
    // Every rank ends with the same parameters: rank 0's, broadcast, compared everywhere.
    for (auto& p : z2.params) {
      std::vector<float> mine(p.begin(), p.end()), root = mine;
      MPI_Bcast(root.data(), int(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
      CHECK(mine == root);
    }
  }

  TEST_CASE_TEMPLATE("a user rule under zero1 and zero2 on W ranks trains like one process seeing the W slices as "
                     "micro-steps (bit for bit on one rank)",
                     C, USER_RULE_CFGS(user_rules::lion), USER_RULE_CFGS(user_rules::sgd), USER_RULE_CFGS(user_rules::lars)) {
    using P = typename C::precision;
    using S = typename C::scaler;
    using R = typename C::rule;
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    CAPTURE(std::string(R::name));
    const auto [a, b] = options_of<R>();
    const typename S::options so{};
    rig<mpopt::optimizer<P, S, mpopt::zero1, R, test_backend, mpopt::mpi>> z1(a, b, {.bucket_elements = 3000}, so,
                                                                               mpopt::mpi{MPI_COMM_WORLD});
    rig<mpopt::optimizer<P, S, mpopt::zero2, R, test_backend, mpopt::mpi>> z2(a, b, {.bucket_elements = 3000}, so,
                                                                               mpopt::mpi{MPI_COMM_WORLD});
    rig<mpopt::optimizer<P, S, mpopt::replicated, R, test_backend>> one(a, b, {.accumulation_steps = w}, so,
                                                                        mpopt::single_process{});
    for (int s = 1; s <= 8; ++s) {
      z1.write(s, rank);
      z2.write(s, rank);
      z1.opt.step();
      z2.opt.step();
      for (int r = 0; r < w; ++r) {
        one.write(s, r);
        one.opt.step();
      }
    }
    if (w == 1) {
      CHECK(difference(z1, one).empty());
      CHECK(difference(z2, one).empty());
      return;
    }
    // Sums in other orders: masters within 1e-5 of the tensor's scale, except where float rounding
    // decides a sign (Lion), at most one element in 10,000 and 2 lr per step.
    auto check_close = [&](const auto& z) {
      for (std::size_t t = 0; t < one.params.size(); ++t) {
        const auto o = z.owned(t);
        const auto mine = z.master(t), whole = one.opt.master(t);
        double scale = 1e-3;
        for (float x : whole) scale = std::max(scale, double(std::abs(x)));
        std::size_t far = 0;
        double worst = 0;
        for (std::size_t i = 0; i < mine.size(); ++i) {
          const double d = std::abs(double(mine[i]) - double(whole[o.first + i]));
          if (d > 1e-5 * scale) ++far;
          worst = std::max(worst, d);
        }
        CAPTURE(t);
        CHECK(worst <= 1e-5 * scale + 16 * a.lr);
        CHECK(far <= (std::is_same_v<R, user_rules::lion> ? 1 + mine.size() / 10000 : 0));
      }
    };
    check_close(z1.opt);
    check_close(z2.opt);
  }

  TEST_CASE_TEMPLATE("a partition written outside the library (zero1, shards in reverse rank order) trains to zero1's "
                     "parameters bit for bit, and their checkpoints load into each other",
                     C, USER_RULE_CFGS(user_rules::lion), USER_RULE_CFGS(user_rules::lars),
                     rule_cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam>, rule_cfg<mpopt::bf16, mpopt::no_scaling, mpopt::lamb>) {
    using P = typename C::precision;
    using S = typename C::scaler;
    using R = typename C::rule;
    using zero1_opt = mpopt::optimizer<P, S, mpopt::zero1, R, test_backend, mpopt::mpi>;
    using reversed_opt = mpopt::optimizer<P, S, reversed_zero1, R, test_backend, mpopt::mpi>;
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    CAPTURE(std::string(R::name));
    const auto [a, b] = options_of<R>();
    const mpopt::optimizer_options o{.bucket_elements = 3000};
    const typename S::options so{};
    const mpopt::mpi_options det{.deterministic = true};
    rig<zero1_opt> z1(a, b, o, so, mpopt::mpi{MPI_COMM_WORLD, det});
    rig<reversed_opt> rev(a, b, o, so, mpopt::mpi{MPI_COMM_WORLD, det});
    rev.opt.finalize();
    z1.opt.finalize();
    // Tensor 0 (one element) lies in shard 0: zero1's rank 0 holds it, the reversed partition's last rank.
    CHECK(z1.opt.owned(0).count == (rank == 0 ? 1u : 0u));
    CHECK(rev.opt.owned(0).count == (rank == w - 1 ? 1u : 0u));
    for (int s = 1; s <= 8; ++s) {
      CAPTURE(s);
      z1.write(s, rank);
      rev.write(s, rank);
      const auto st = z1.opt.step();
      CHECK(st.applied);
      CHECK(rev.opt.step().grad_norm == st.grad_norm);
      CHECK(same_parameters(rev, z1));
    }
    if constexpr (mpopt::reducing_rule<R>) {
      const auto x = rev.opt.tensor_state(), y = z1.opt.tensor_state();
      CHECK(std::equal(x.begin(), x.end(), y.begin(), y.end()));
    }
    // Each one's checkpoint resumes the other: three more steps, all four alike.
    const shared_dir dir;
    z1.opt.save(dir / "zero1.safetensors");
    rev.opt.save(dir / "reversed.safetensors");
    rig<zero1_opt> z1_from_rev(b, a, o, so, mpopt::mpi{MPI_COMM_WORLD, det});
    rig<reversed_opt> rev_from_z1(b, a, o, so, mpopt::mpi{MPI_COMM_WORLD, det});
    z1_from_rev.opt.load(dir / "reversed.safetensors");
    rev_from_z1.opt.load(dir / "zero1.safetensors");
    CHECK(same_parameters(z1_from_rev, z1));
    for (int s = 9; s <= 11; ++s) {
      CAPTURE(s);
      z1.write(s, rank);
      rev.write(s, rank);
      z1_from_rev.write(s, rank);
      rev_from_z1.write(s, rank);
      z1.opt.step();
      rev.opt.step();
      z1_from_rev.opt.step();
      rev_from_z1.opt.step();
      CHECK(same_parameters(rev, z1));
      CHECK(same_parameters(z1_from_rev, z1));
      CHECK(same_parameters(rev_from_z1, z1));
    }
  }
}
