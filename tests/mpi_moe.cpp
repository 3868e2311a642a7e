// Mixture-of-experts groups over MPI (optimizer::add_expert_group), in DeepSpeed's layout: E sets of
// experts, rank r holding set r % E, each set replicated on the D = W / E ranks of one expert
// communicator; every E that divides the world size (from 4 ranks on, those between 1 and W).
// Against one process that holds every expert and takes each rank's micro-batch as a micro-step, in
// which a rank's expert gradients are zero for the experts it does not hold: replicated bit for bit,
// zero1 and zero2 within rounding, and bit for bit against replicated with sum_by_shard over
// deterministic communicators. Also: an overflow in one rank's expert gradient skips everywhere;
// checkpoints hold every expert by name and load at the same layout, into one process, and into
// another expert layout; memory_report() lists what finalize() allocates and steps allocate nothing;
// a wrong placement is refused on every rank.
#include <doctest/doctest.h>

#include "counting_new.hpp"
#include "mpi_harness.hpp"

namespace {

/// Experts per rank (DeepSpeed's num_local_experts).
constexpr int moe_local = 2;

/// Groups, in order: 0 dense, 1 expert weights, 2 dense, 3 expert biases. `dense0`/`dense2` are the
/// dense groups' tensor sizes, `weight`/`bias` those of each expert in groups 1 and 3.
struct moe_shape {
  std::vector<std::size_t> dense0{7, 1, 2001}, weight{129, 65600}, dense2{5, 300}, bias{3};
  int experts = 2;  // in all: E * moe_local

  /// Which expert each reference tensor belongs to (-1: dense), in the reference's order.
  std::vector<int> expert_of() const {
    std::vector<int> x(dense0.size(), -1);
    for (int e = 0; e < experts; ++e) x.insert(x.end(), weight.size(), e);
    x.insert(x.end(), dense2.size(), -1);
    for (int e = 0; e < experts; ++e) x.insert(x.end(), bias.size(), e);
    return x;
  }
  std::vector<std::size_t> sizes() const {
    std::vector<std::size_t> s = dense0;
    for (int e = 0; e < experts; ++e) s.insert(s.end(), weight.begin(), weight.end());
    s.insert(s.end(), dense2.begin(), dense2.end());
    for (int e = 0; e < experts; ++e) s.insert(s.end(), bias.begin(), bias.end());
    return s;
  }
};

/// DeepSpeed's E+D layout: expert-parallel groups of E consecutive ranks, expert-data-parallel
/// groups of the ranks r % E.
struct moe_grid {
  int sets = 1;  // E
  int set_of(int rank) const { return rank % sets; }
  /// My expert communicator (MPI_COMM_WORLD split by set), freed at the end.
  MPI_Comm split() const {
    MPI_Comm c = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, set_of(world_rank()), world_rank(), &c);
    return c;
  }
};
struct moe_comm {
  MPI_Comm comm;
  explicit moe_comm(const moe_grid& g) : comm(g.split()) {}
  moe_comm(const moe_comm&) = delete;
  ~moe_comm() { MPI_Comm_free(&comm); }
};

/// The world in `sets` expert sets (two where its size is even, else one per rank), my set's
/// communicator and the model's shape.
struct moe_world {
  int w = world_size(), rank = world_rank();
  moe_grid grid{w % 2 == 0 ? 2 : w};
  moe_comm experts{grid};
  moe_shape sh{.experts = grid.sets * moe_local};
};

/// The model: an optimizer and its tensors. `held`: the experts it holds (their global ids, in the
/// order it registers them). make_comm() gives each expert group's communicator, or nothing: the
/// experts are then registered in plain groups (a process that holds every expert).
template <class Opt>
struct moe_net {
  using P = typename Opt::param_type;
  using G = typename Opt::grad_type;
  using rule = typename Opt::rule;
  Opt opt;
  std::vector<std::vector<P>> params;
  std::vector<std::vector<G>> grads;
  std::vector<std::size_t> ref;  // each tensor's index among the reference's

  template <class MakeComm, class... A>
  moe_net(const moe_shape& sh, const std::vector<int>& held, MakeComm make_comm, A&&... args)
      : opt(std::forward<A>(args)...) {
    const auto [o0, o1] = group_options<rule>();
    std::size_t at = 0;  // the reference's index of the group's first tensor
    auto dense = [&](const typename Opt::group_options& o, const std::vector<std::size_t>& sizes, const char* prefix) {
      auto& g = opt.add_group(o);
      for (std::size_t i = 0; i < sizes.size(); ++i) add(g, sizes[i], prefix + std::to_string(i), at + i);
      at += sizes.size();
    };
    auto experts = [&](const typename Opt::group_options& o, const std::vector<std::size_t>& sizes, const char* part) {
      auto c = make_comm();
      auto& g = [&]() -> auto& {
        if constexpr (std::is_same_v<decltype(c), std::nullopt_t>) return opt.add_group(o);
        else return opt.add_expert_group(o, std::move(c));
      }();
      for (int x : held)
        for (std::size_t i = 0; i < sizes.size(); ++i)
          add(g, sizes[i], "expert" + std::to_string(x) + "." + part + std::to_string(i), at + std::size_t(x) * sizes.size() + i);
      at += std::size_t(sh.experts) * sizes.size();
    };
    dense(o0, sh.dense0, "a.");
    experts(o0, sh.weight, "w");
    dense(o1, sh.dense2, "b.");
    experts(o1, sh.bias, "bias");
  }

  /// A backward: the reference-indexed gradient times the loss scale.
  void write(const grads_t& g) {
    write(g, [](std::size_t) { return true; });
  }
  /// A backward that reaches only the reference tensors r where seen(r): the others' gradients are zero.
  template <class Seen>
  void write(const grads_t& g, Seen seen) {
    const double s = opt.loss_scale();
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (seen(ref[i])) harness_data::round_scaled(g[ref[i]], s, grads[i]);
      else std::fill(grads[i].begin(), grads[i].end(), G(0.0f));
    }
  }
  void report_ready() {
    for (std::size_t i = grads.size(); i-- > 0;) opt.grad_ready(i);
  }

 private:
  template <class Group>
  void add(Group& g, std::size_t n, const std::string& name, std::size_t r) {
    params.emplace_back(n);
    grads.emplace_back(n, G(0.0f));
    harness_data::fill_uniform(key(0x3E, 0x1417, r, 0), params.back());
    g.add(params.back(), grads.back(), name);
    ref.push_back(r);
  }
};

/// The experts of set e: global ids e * moe_local, ..., e * moe_local + moe_local - 1.
std::vector<int> moe_set(int e, int local = moe_local) {
  std::vector<int> x;
  for (int l = 0; l < local; ++l) x.push_back(e * local + l);
  return x;
}
std::vector<int> moe_all(const moe_shape& sh) {
  std::vector<int> x;
  for (int e = 0; e < sh.experts; ++e) x.push_back(e);
  return x;
}

/// Which reference tensors rank `rank`'s backward reaches: the dense ones and its set's experts (a
/// micro-batch's gradient is zero for the experts its rank does not hold).
auto moe_seen_by(const moe_shape& sh, const moe_grid& grid, int rank) {
  return [expert = sh.expert_of(), set = grid.set_of(rank)](std::size_t t) {
    return expert[t] < 0 || expert[t] / moe_local == set;
  };
}

/// Every bit of a run's state, tensor by tensor in the reference's order (the tensors this rank holds).
struct moe_snapshot {
  std::vector<std::size_t> ref;
  std::vector<std::vector<std::uint32_t>> params;
  std::vector<std::array<std::vector<float>, 3>> state;
  std::vector<std::uint64_t> steps;
};
template <class Opt>
moe_snapshot moe_take(moe_net<Opt>& n, MPI_Comm experts) {
  n.opt.finalize();
  moe_snapshot s;
  std::size_t i = 0;
  for (std::size_t g = 0; g < n.opt.group_count(); ++g) {
    const bool expert = n.opt.group(g).expert_parallel();
    for (std::size_t k = 0; k < n.opt.group(g).size(); ++k, ++i) {
      s.ref.push_back(n.ref[i]);
      append_bits(s.params.emplace_back(), n.params[i]);
      s.state.push_back(state_of(n.opt, i, expert ? experts : MPI_COMM_WORLD));
    }
    s.steps.push_back(n.opt.group(g).step());
  }
  return s;
}
/// d's tensors against the same tensors of l (found by reference index): bitwise, or masters within
/// 1e-6 relative + floor, moments normwise within moment_tol, 16-bit params within 1 ulp.
void moe_compare(const moe_snapshot& d, const moe_snapshot& l, bool bitwise, double floor, double moment_tol,
                 const std::string& what = "") {
  CAPTURE(what);
  CHECK(d.steps == l.steps);
  std::size_t bad_master = 0, bad_param = 0, differ = 0;
  double dm[2] = {0, 0}, nm[2] = {0, 0};
  for (std::size_t i = 0; i < d.ref.size(); ++i) {
    const auto at = std::size_t(std::find(l.ref.begin(), l.ref.end(), d.ref[i]) - l.ref.begin());
    REQUIRE(at < l.ref.size());
    const auto &a = d.state[i], &b = l.state[at];
    REQUIRE(a[0].size() == b[0].size());
    // Bitwise, a tensor whose every bit is the same has nothing to count (most tensors; the element
    // loop is slow at the suites' -Og).
    auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
      return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
    };
    if (bitwise && d.params[i] == l.params[at] && same_bits(a[0], b[0]) && same_bits(a[1], b[1]) &&
        same_bits(a[2], b[2]))
      continue;
    for (std::size_t k = 0; k < a[0].size(); ++k) {
      const bool same = bits(a[0][k]) == bits(b[0][k]) && bits(a[1][k]) == bits(b[1][k]) &&
                        bits(a[2][k]) == bits(b[2][k]) && d.params[i][k] == l.params[at][k];
      differ += !same;
      const double e = std::abs(double(a[0][k]) - double(b[0][k]));
      bad_master += !(e <= 1e-6 * std::abs(double(b[0][k])) + floor);
      const std::uint32_t p = d.params[i][k], q = l.params[at][k];
      bad_param += p != q && (p > 0xFFFF || ulp_distance16(std::uint16_t(p), std::uint16_t(q)) > 1) &&
                   bits(a[0][k]) == bits(b[0][k]);
      for (int j = 0; j < 2; ++j) {
        const double x = a[std::size_t(j) + 1][k], y = b[std::size_t(j) + 1][k];
        dm[j] += (x - y) * (x - y);
        nm[j] += y * y;
      }
    }
  }
  if (bitwise) {
    CHECK_MESSAGE(differ == 0, differ << " elements differ in a bit of param, master or moment");
    return;
  }
  CHECK_MESSAGE(bad_master == 0, bad_master << " masters beyond 1e-6 relative + " << floor);
  CHECK_MESSAGE(bad_param == 0, bad_param << " params off by more than rounding");
  for (int j = 0; j < 2; ++j)
    CHECK_MESSAGE(std::sqrt(dm[j]) <= moment_tol * std::sqrt(nm[j]) + 1e-30, "moment " << j << " normwise off");
}

template <class P>
using moe_reference_opt = mpopt::optimizer<typename P::precision, typename P::scaler, mpopt::replicated,
                                           typename P::rule, test_backend, mpopt::single_process>;
template <class C, class Partition>
using moe_opt = mpopt::optimizer<typename C::precision, typename C::scaler, Partition, typename C::rule, test_backend,
                                 mpopt::mpi>;

/// The world's E: every divisor of the world size.
/// Every E that divides W, or from 4 ranks on those strictly between 1 and W: the layouts fewer ranks
/// cannot make (several expert sets, each replicated). One set over every rank (E = 1) and a set per
/// rank (E = W) run on 1 and 2 ranks; on 4 they would triple this test's time.
std::vector<int> moe_sets() {
  const int w = world_size();
  std::vector<int> e;
  for (int s = 1; s <= w; ++s)
    if (w % s == 0 && (w < 4 || (s > 1 && s < w))) e.push_back(s);
  return e;
}

#define MOE_CFGS                                                      \
  cfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::unfused>,  \
      cfg<mpopt::bf16, mpopt::no_scaling, mpopt::lamb, layout::unfused>, \
      cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::unfused>

}  // namespace

TEST_SUITE("mpi_moe") {
  TEST_CASE_TEMPLATE(
      "expert groups train as one process holding every expert: the expert gradients summed over their "
      "replicas and averaged over all ranks, the norm counting each element once; replicated bit for bit, "
      "zero1 and zero2 (with and without overlap_comm) within rounding and bit for bit like replicated "
      "with sum_by_shard; with and without accumulation, for every E dividing the world size (from 4 ranks on, "
      "those between 1 and W)",
      C, MOE_CFGS) {
    using Rep = moe_opt<C, mpopt::replicated>;
    using Z1 = moe_opt<C, mpopt::zero1>;
    using Z2 = moe_opt<C, mpopt::zero2>;
    using L = moe_reference_opt<C>;
    const int w = world_size(), rank = world_rank();
    const std::string what = C::describe();
    CAPTURE(what);
    CAPTURE(w);
    const auto so = C::scaler_options(3);
    const mpopt::mpi_options det{.deterministic = true};
    for (int sets : moe_sets()) {
      for (int a_steps : {1, 2}) {
        CAPTURE(sets);
        CAPTURE(a_steps);
        const moe_grid grid{sets};
        const moe_comm experts(grid);
        moe_shape sh;
        sh.experts = sets * moe_local;
        const dataset ds{0x40E + std::uint64_t(sets), sh.sizes(), true};
        const std::vector<int> mine = moe_set(grid.set_of(rank));
        auto plain = [] { return std::nullopt; };
        auto over = [&](const mpopt::mpi_options& o) { return [&, o] { return mpopt::mpi{experts.comm, o}; }; };
        mpopt::optimizer_options o{.accumulation_steps = a_steps, .bucket_elements = 3000};
        mpopt::optimizer_options by_shard = o, overlapped = o;
        by_shard.sum_by_shard = true;
        overlapped.overlap_comm = true;
        moe_net<Rep> rep(sh, mine, over({}), mpopt::mpi{MPI_COMM_WORLD}, o, so);
        moe_net<Rep> rep_by_shard(sh, mine, over(det), mpopt::mpi{MPI_COMM_WORLD, det}, by_shard, so);
        moe_net<Z1> z1(sh, mine, over(det), mpopt::mpi{MPI_COMM_WORLD, det}, by_shard, so);
        moe_net<Z2> z2(sh, mine, over(det), mpopt::mpi{MPI_COMM_WORLD, det}, by_shard, so);
        moe_net<Z2> z2_overlap(sh, mine, over(det), mpopt::mpi{MPI_COMM_WORLD, det}, overlapped, so);
        moe_net<L> ref(sh, moe_all(sh), plain, mpopt::optimizer_options{.accumulation_steps = w * a_steps}, so);
        for (int s = 0; s < 6; ++s) {
          CAPTURE(s);
          const auto batch = ds.batch(s, w * a_steps);
          mpopt::step_status st[5], sl;
          for (int a = 0; a < a_steps; ++a) {
            const grads_t& g = batch[std::size_t(rank * a_steps + a)];
            for (auto* n : {&rep, &rep_by_shard}) n->write(g);
            for (auto* n : {&z2, &z2_overlap}) n->write(g);
            z1.write(g);
            z2.report_ready();
            z2_overlap.report_ready();
            st[0] = rep.opt.step();
            st[1] = rep_by_shard.opt.step();
            st[2] = z1.opt.step();
            st[3] = z2.opt.step();
            st[4] = z2_overlap.opt.step();
          }
          for (int j = 0; j < w * a_steps; ++j) {
            ref.write(batch[std::size_t(j)], moe_seen_by(sh, grid, j / a_steps));
            sl = ref.opt.step();
          }
          z2_overlap.opt.wait_params();  // its parameters' gathers run on after step()
          check_status(st[0], sl, true);  // the same norm to the bit: each element counted once
          check_status(st[2], sl, false);
          CHECK(st[0].result == mpopt::step_result::applied);
          CHECK(st[1].grad_norm == st[2].grad_norm);
          CHECK(st[3].grad_norm == st[4].grad_norm);
          const moe_snapshot l = moe_take(ref, MPI_COMM_SELF);
          moe_compare(moe_take(rep, experts.comm), l, true, 0, 0, "replicated against one process");
          const moe_snapshot by = moe_take(rep_by_shard, experts.comm);
          moe_compare(by, l, false, 1e-6 * (s + 1) * max_lr, 1e-5, "replicated by shard against one process");
          moe_compare(moe_take(z1, experts.comm), by, true, 0, 0, "zero1 against replicated by shard");
          moe_compare(moe_take(z2_overlap, experts.comm), moe_take(z2, experts.comm), true, 0, 0, "overlap_comm");
          // zero2 reduces every micro-step, then adds: another order than folding first.
          moe_compare(moe_take(z2, experts.comm), by, a_steps == 1, 1e-6 * (s + 1) * max_lr, 1e-5,
                      "zero2 against replicated by shard");
        }
      }
    }
  }

  TEST_CASE_TEMPLATE("an overflow in one rank's expert gradient skips the step on every rank, state bit-identical", C,
                     cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::unfused>,
                     cfg<mpopt::bf16, mpopt::no_scaling, mpopt::lamb, layout::unfused>) {
    using Z2 = moe_opt<C, mpopt::zero2>;
    using Rep = moe_opt<C, mpopt::replicated>;
    using G = typename Z2::grad_type;
    const moe_world m;
    const auto& [w, rank, grid, experts, sh] = m;
    const int sets = grid.sets;
    CAPTURE(sets);
    const dataset ds{0xF0E, sh.sizes(), true};
    const auto so = C::scaler_options(100);
    auto over = [&] { return mpopt::mpi{experts.comm}; };
    const mpopt::optimizer_options o{.bucket_elements = 20000};
    moe_net<Z2> z2(sh, moe_set(grid.set_of(rank)), over, mpopt::mpi{MPI_COMM_WORLD}, o, so);
    moe_net<Rep> rep(sh, moe_set(grid.set_of(rank)), over, mpopt::mpi{MPI_COMM_WORLD}, o, so);
    for (int s = 0; s < 4; ++s) {
      CAPTURE(s);
      const grads_t g = ds.micro_batch(s, rank);
      const auto before_z2 = moe_take(z2, experts.comm), before_rep = moe_take(rep, experts.comm);
      z2.write(g);
      rep.write(g);
      // Step 2: the last rank's last expert bias. Step 3: rank 0's first expert weight.
      if (s == 2 && rank == w - 1) z2.grads.back().back() = rep.grads.back().back() = G(INFINITY);
      if (s == 3 && rank == 0) z2.grads[sh.dense0.size()][0] = rep.grads[sh.dense0.size()][0] = G(NAN);
      z2.report_ready();
      const auto sz = z2.opt.step(), sr = rep.opt.step();
      check_status_same_on_every_rank(sz);
      check_status_same_on_every_rank(sr);
      if (s >= 2) {
        CHECK(sz.result == mpopt::step_result::skipped_nonfinite);
        CHECK(sr.result == mpopt::step_result::skipped_nonfinite);
        auto unchanged = moe_take(z2, experts.comm);
        moe_compare(unchanged, before_z2, true, 0, 0);
        moe_compare(moe_take(rep, experts.comm), before_rep, true, 0, 0);
      } else {
        CHECK(sz.result == mpopt::step_result::applied);
      }
    }
  }

  TEST_CASE_TEMPLATE(
      "a checkpoint holds every expert of every rank, by name: it resumes bit for bit at the same layout, and "
      "loads into one process holding every expert and into every other expert layout of the world; a layout "
      "that leaves an expert out is refused on every rank, changing nothing",
      Z, mpopt::replicated, mpopt::zero2) {
    using C = cfg<mpopt::bf16, mpopt::no_scaling, mpopt::lamb, layout::unfused>;
    using D = moe_opt<C, Z>;
    using L = moe_reference_opt<C>;
    const moe_world m;
    const auto& [w, rank, grid, experts, sh] = m;
    const int sets = grid.sets;
    CAPTURE(sets);
    const dataset ds{0xC4E, sh.sizes(), true};
    const mpopt::optimizer_options o{.bucket_elements = 20000};
    auto over = [&] { return mpopt::mpi{experts.comm}; };
    auto run = [&](auto& n, int from, int to) {
      for (int s = from; s < to; ++s) {
        n.write(ds.micro_batch(s, rank));
        n.report_ready();
        n.opt.step();
      }
    };
    shared_dir dir;
    const auto file = dir / "moe.safetensors";
    moe_net<D> a(sh, moe_set(grid.set_of(rank)), over, mpopt::mpi{MPI_COMM_WORLD}, o);
    run(a, 0, 3);
    a.opt.save(file);
    run(a, 3, 6);

    // The same layout: resumes bit for bit.
    moe_net<D> b(sh, moe_set(grid.set_of(rank)), over, mpopt::mpi{MPI_COMM_WORLD}, o);
    b.opt.load(file);
    run(b, 3, 6);
    moe_compare(moe_take(b, experts.comm), moe_take(a, experts.comm), true, 0, 0);
    CHECK(b.opt.lamb_coeffs().size() == a.opt.lamb_coeffs().size());
    CHECK(std::equal(b.opt.lamb_coeffs().begin(), b.opt.lamb_coeffs().end(), a.opt.lamb_coeffs().begin()));

    // One process holding every expert, in plain groups: exactly what was saved.
    moe_net<D> saved(sh, moe_set(grid.set_of(rank)), over, mpopt::mpi{MPI_COMM_WORLD}, o);
    saved.opt.load(file);
    moe_net<L> one(sh, moe_all(sh), [] { return std::nullopt; }, mpopt::optimizer_options{});
    one.opt.load(file);
    moe_compare(moe_take(saved, experts.comm), moe_take(one, MPI_COMM_SELF), true, 0, 0);
    for (std::size_t t = 0; t < saved.opt.tensor_count(); ++t) {
      const auto at = std::size_t(std::find(one.ref.begin(), one.ref.end(), saved.ref[t]) - one.ref.begin());
      CHECK(saved.opt.lamb_coeffs()[t] == one.opt.lamb_coeffs()[at]);
    }

    // Every other expert layout of this world: E' sets of experts of E * moe_local / E' each.
    for (int other : moe_sets()) {
      if ((sets * moe_local) % other != 0) continue;
      CAPTURE(other);
      const moe_grid g2{other};
      const moe_comm c2(g2);
      const int local = sets * moe_local / other;
      moe_net<D> re(sh, moe_set(g2.set_of(rank), local), [&] { return mpopt::mpi{c2.comm}; }, mpopt::mpi{MPI_COMM_WORLD}, o);
      re.opt.load(file);
      moe_compare(moe_take(re, c2.comm), moe_take(one, MPI_COMM_SELF), true, 0, 0);
    }

    // A layout that leaves experts out (each set its last one): refused on every rank, nothing changed.
    {
      std::vector<int> fewer = moe_set(grid.set_of(rank));
      fewer.pop_back();
      moe_net<D> c(sh, fewer, over, mpopt::mpi{MPI_COMM_WORLD}, o);
      run(c, 0, 1);
      const auto before = moe_take(c, experts.comm);
      CHECK_THROWS_WITH_AS(c.opt.load(file), doctest::Contains("tensors of group 1"), mpopt::error);
      moe_compare(moe_take(c, experts.comm), before, true, 0, 0);
    }
  }

  TEST_CASE_TEMPLATE("with expert groups, finalize allocates exactly the reported bytes (the expert communicators' "
                     "included) and steps allocate nothing, overlap_comm or not",
                     Z, mpopt::replicated, mpopt::zero1, mpopt::zero2) {
    using C = cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::lamb, layout::unfused>;
    using D = moe_opt<C, Z>;
    const moe_world m;
    const auto& [w, rank, grid, experts, sh] = m;
    const int sets = grid.sets;
    CAPTURE(sets);
    const dataset ds{0x3E4, sh.sizes(), true};
    for (bool overlap : {false, true}) {
      CAPTURE(overlap);
      moe_net<D> n(sh, moe_set(grid.set_of(rank)), [&] { return mpopt::mpi{experts.comm}; }, mpopt::mpi{MPI_COMM_WORLD},
                   mpopt::optimizer_options{.bucket_elements = 20000, .overlap_comm = overlap},
                   mpopt::dynamic_scale_options{.init_scale = 1024});
      const long long added = live_bytes_added_by([&] { n.opt.finalize(); });
      const mpopt::memory_report r = n.opt.memory_report();
      // Exact on the host backend; the device backend's own room (work lists, lane partials) is unlisted.
      if constexpr (std::is_same_v<test_backend, mpopt::host>) CHECK(added == static_cast<long long>(r.owned_bytes()));
      for (int s = 0; s < 3; ++s) {
        n.write(ds.micro_batch(s, rank));
        mpopt::step_status st;
        const long long during = live_bytes_added_by([&] {
          n.report_ready();
          st = n.opt.step();
          n.opt.wait_params();
        });
        CHECK(st.applied);
        if (s > 0) CHECK(during == 0);  // the first step's collectives make the communicators' room
      }
    }
  }

  TEST_CASE("a wrong placement of experts is refused on every rank: replicas holding different experts, two sets "
            "naming one expert alike, a communicator whose size does not divide the world; 1-bit LAMB has no "
            "expert groups") {
    using C = cfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::unfused>;
    using D = moe_opt<C, mpopt::zero1>;
    const int w = world_size(), rank = world_rank();
    const moe_grid one_set{1};  // every rank a replica of the others
    const moe_comm all(one_set);
    moe_shape sh;
    sh.experts = moe_local * w;
    auto over = [&] { return mpopt::mpi{all.comm}; };
    if (w > 1) {
      // Each rank registers its own experts, yet the communicator says they are replicas.
      moe_net<D> d(sh, moe_set(rank), over, mpopt::mpi{MPI_COMM_WORLD});
      CHECK_THROWS_WITH_AS(d.opt.finalize(), doctest::Contains("of its expert communicator hold different tensors"),
                           mpopt::error);
      // Every rank its own set (a communicator of one), but named alike: all of them, or in part.
      const moe_grid own{w};
      const moe_comm mine(own);
      moe_net<D> e(sh, moe_set(0), [&] { return mpopt::mpi{mine.comm}; }, mpopt::mpi{MPI_COMM_WORLD});
      CHECK_THROWS_WITH_AS(e.opt.finalize(), doctest::Contains("ranks holding different experts must name them apart"),
                           mpopt::error);
      moe_net<D> f(sh, {rank, rank + 1}, [&] { return mpopt::mpi{mine.comm}; }, mpopt::mpi{MPI_COMM_WORLD});
      CHECK_THROWS_WITH_AS(f.opt.finalize(), doctest::Contains("name expert tensors by their global expert id"),
                           mpopt::error);
    }
    if (w > 2) {
      // Rank 0 alone, the others together: W - 1 ranks do not divide W.
      MPI_Comm rest = MPI_COMM_NULL;
      MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? 0 : 1, rank, &rest);
      D d(mpopt::mpi{MPI_COMM_WORLD});
      mpopt::mpi c{rest};
      if (rank == 0) {
        d.add_expert_group({}, std::move(c));
        CHECK(d.group_count() == 1);
      } else {
        CHECK_THROWS_WITH_AS(d.add_expert_group({}, std::move(c)), doctest::Contains("does not divide the optimizer's"),
                             mpopt::error);
        CHECK(d.group_count() == 0);
      }
      MPI_Comm_free(&rest);
    }
    using B = mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::onebit_lamb, test_backend,
                               mpopt::mpi>;
    B b(mpopt::mpi{MPI_COMM_WORLD});
    std::vector<float> p(8, 0.5f), g(8, 0.1f);
    b.add_expert_group({}, mpopt::mpi{all.comm}).add(p, g, "expert0.w");
    CHECK_THROWS_WITH_AS(b.finalize(), doctest::Contains("1-bit LAMB compresses over every rank"),
                         mpopt::error);
  }
}
