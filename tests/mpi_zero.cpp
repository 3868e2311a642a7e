// ZeRO stages 1 and 2 over MPI (mpopt::zero1, mpopt::zero2). Each rank holds master and moments for
// its shard only; gradients are reduce-scattered bucket by bucket (zero2: during backward, as
// grad_ready reports tensors) and the updated parameters all-gathered. Against a single process that
// sees the W gradient slices as micro-steps, and against replicated data parallelism at the same
// world size (bit for bit with a deterministic communicator). Buckets are small (3000 elements) so
// that every run has many, and the large tensor (over 65536 elements) spans several of them and
// several shards.
#include <doctest/doctest.h>

#include "error_of.hpp"
#include "mpi_harness.hpp"

#include <mpopt/detail/checkpoint/state_file.hpp>

#include <sys/resource.h>

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

namespace {

/// Sharded norms are formed per shard: the partial sums of the chunks a shard boundary cuts differ
/// from the single process's (the global norm's are rounded to float precision per chunk, LAMB's
/// per-tensor ones summed in fp32), so the norms, and with them the clip coefficient, differ by up
/// to ~2e-6 relative. The moments are compared normwise within 1e-5, and LAMB's trust ratios
/// within 1e-4; masters keep 1e-6 relative + floor.
constexpr double sharded_moment_tol = 1e-5;

mpopt::optimizer_options zero_options(mpopt::optimizer_options o = {}) {
  o.bucket_elements = 3000;
  return o;
}

// On the device, every precision, rule and layout once per partition.
#define ZERO_CFGS(Z)                                                              \
  cfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::unfused, Z>,           \
      cfg<mpopt::bf16, mpopt::no_scaling, mpopt::lamb, layout::unfused, Z>,       \
      cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::lamb, layout::flat, Z>        \
      HOST_ONLY(cfg<mpopt::bf16, mpopt::no_scaling, mpopt::adam, layout::flat, Z>, \
                cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::unfused, Z>, \
                cfg<mpopt::fp32, mpopt::no_scaling, mpopt::lamb, layout::flat, Z>)

/// A communicator that fails, on every rank, at the n-th variable-count reduce-scatter, all-gather or
/// all-reduce of doubles (as a broken network would be seen by all).
struct failing_mpi : mpopt::mpi {
  using mpopt::mpi::mpi;
  static constexpr std::string_view name = "failing_mpi";
  int fail_reduce_at = -1, fail_gather_at = -1, fail_sum_at = -1, reduces = 0, gathers = 0, sums = 0;

  using mpopt::mpi::all_gather;
  using mpopt::mpi::all_reduce;
  using mpopt::mpi::reduce_scatter;
  void all_reduce(std::span<double> data, mpopt::reduce_op op) {
    if (sums++ == fail_sum_at) throw mpopt::error("failing_mpi: all_reduce failed");
    mpopt::mpi::all_reduce(data, op);
  }
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts, mpopt::reduce_op op) {
    if (reduces++ == fail_reduce_at) throw mpopt::error("failing_mpi: reduce_scatter failed");
    mpopt::mpi::reduce_scatter(in, out, counts, op);
  }
  template <class T>
  void all_gather(std::span<T> data, std::span<const std::size_t> counts) {
    if (gathers++ == fail_gather_at) throw mpopt::error("failing_mpi: all_gather failed");
    mpopt::mpi::all_gather(data, counts);
  }
};
static_assert(mpopt::communicator<failing_mpi>);

/// An optimizer over every rank (partition P) against one over one process, `steps` steps of
/// DeepSpeed-like Adam: rank 0 sends the gradients, the others zeros, summed, so every rank's step
/// sees one process's gradients exactly. Before each step s, edit(s, grads, {}, {}) may change both
/// sides' gradients ({dist, local}); after it, edit(-1 - s, ..., dist status, local status) checks the
/// statuses. Every step must be applied, the same on every rank, and leave the parameters of both
/// the same bits.
/// The one-process optimizer l's checkpoint, loaded by every rank of d (each its shard, where the
/// state is sharded), which held the same state; saved again by d, its tensors are the file's bytes
/// for bytes.
template <class Dist, class Local>
void load_one_process_file(Dist& d, Local& l, int rank) {
  std::vector<std::byte> one, again;
  l.save(one);
  d.load(one);
  d.save(again);
  if (rank != 0) return;
  const mpopt::detail::state_reader a(mpopt::detail::state_source{"one process's", std::span<const std::byte>(one)});
  const mpopt::detail::state_reader b(mpopt::detail::state_source{"the ranks'", std::span<const std::byte>(again)});
  REQUIRE(a.names() == b.names());
  for (const auto& name : a.names()) {
    CAPTURE(name);
    CHECK(a.dtype(name) == b.dtype(name));
    CHECK(a.bytes(name) == b.bytes(name));
  }
}

template <class Precision, class P, int CheckpointAt = -1, class Edit>
void step_as_one_process(const mpopt::optimizer_options& o, const std::vector<std::vector<mpopt::tensor_spec>>& groups,
                         int steps, Edit&& edit) {
  using T = typename Precision::param_type;
  using dist_t = mpopt::optimizer<Precision, mpopt::no_scaling, P, mpopt::adam, test_backend, mpopt::mpi>;
  using local_t = mpopt::optimizer<Precision, mpopt::no_scaling, mpopt::replicated, mpopt::adam, test_backend>;
  const int w = world_size(), rank = world_rank();
  CAPTURE(w);
  dist_t d(mpopt::mpi{MPI_COMM_WORLD}, o);
  local_t l(o);
  std::vector<std::span<T>> dp, lp;
  std::array<std::vector<std::span<T>>, 2> grads;  // dist, local
  for (const auto& specs : groups) {
    auto& a = d.add_flat_group({.lr = 1e-4, .weight_decay = 0.01}, specs);
    auto& b = l.add_flat_group({.lr = 1e-4, .weight_decay = 0.01}, specs);
    for (std::size_t t = 0; t < specs.size(); ++t) {
      dp.push_back(a.param(t)), grads[0].push_back(a.grad(t)), lp.push_back(b.param(t)), grads[1].push_back(b.grad(t));
      for (std::size_t k = 0; k < specs[t].size; ++k)
        dp.back()[k] = lp.back()[k] = T(float(0.5 + 0.25 * unit(mix((std::uint64_t(dp.size()) << 32) + k))));
    }
  }
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    auto& [dg, lg] = grads;
    for (std::size_t t = 0; t < dg.size(); ++t)
      for (std::size_t k = 0; k < dg[t].size(); ++k) {
        lg[t][k] = T(float(unit(mix((std::uint64_t(s) << 40) + (std::uint64_t(t) << 32) + k))));
        dg[t][k] = rank == 0 ? lg[t][k] : T(0.0f);
      }
    edit(s, grads, mpopt::step_status{}, mpopt::step_status{});
    if constexpr (CheckpointAt >= 0)
      if (s == CheckpointAt) load_one_process_file(d, l, rank);
    const auto ds = d.step(), ls = l.step();
    check_status_same_on_every_rank(ds);
    REQUIRE(ds.applied);
    REQUIRE(ls.applied);
    REQUIRE(d.group(0).step() == std::uint64_t(s + 1));
    edit(-1 - s, grads, ds, ls);
    std::size_t differ = 0;
    for (std::size_t t = 0; t < dp.size(); ++t) differ += std::memcmp(dp[t].data(), lp[t].data(), dp[t].size_bytes()) != 0;
    CHECK_MESSAGE(differ == 0, differ << " tensors' parameters differ from one process's");
  }
}

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE_TEMPLATE(
      "zero1 and zero2 on W ranks train like one process averaging the W slices as micro-steps "
      "(fp32: masters within 1e-6 relative), params identical on every rank",
      C, ZERO_CFGS(mpopt::zero1), ZERO_CFGS(mpopt::zero2)) {
    using D = typename C::dist;
    using L = typename C::local;
    const int w = world_size();
    const std::string what = C::describe();
    CAPTURE(what);
    CAPTURE(w);
    const shape sh = random_shape(0x2E40 + w);
    const dataset ds{0x2E40, sh.all(), false};
    const auto so = C::scaler_options(5);
    net<D> d(C::lay, sh, 42, mpopt::mpi{MPI_COMM_WORLD}, zero_options(), so);
    net<L> l(C::lay, sh, 42, mpopt::optimizer_options{.accumulation_steps = w}, so);
    // One rank: one shard, summed in one sequence like the reference. More: per-shard partial norms.
    const bool bitwise = w == 1;
    closeness worst;
    const int steps = 20;
    for (int s = 0; s < steps; ++s) {
      CAPTURE(s);
      const auto [sd, sl] = boundary(d, l, ds.batch(s, w), 1);
      CHECK(sd.result == mpopt::step_result::applied);
      worst.norm_rel = std::max(worst.norm_rel, check_status(sd, sl, bitwise));
      check_state(d, l, bitwise, s + 1, &worst, sharded_moment_tol);
    }
    check_same_on_every_rank(d);
    if (!bitwise) worst.report(what, w, " zero");
  }

  TEST_CASE_TEMPLATE("a model so small that some ranks own only padding trains like one process", C,
                     cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::lamb, layout::unfused, mpopt::zero1>,
                     cfg<mpopt::bf16, mpopt::no_scaling, mpopt::adam, layout::flat, mpopt::zero2>) {
    using D = typename C::dist;
    using L = typename C::local;
    const int w = world_size();
    CAPTURE(w);
    // Tensors start on 16 elements and each group pads to a multiple of 16 W: the shards are 16
    // elements; rank 0 holds a.0 and b.0, rank 1 holds a.1, every other rank only padding.
    const shape tiny{{1, 3}, {2}};
    const dataset ds{0x71, tiny.all(), true};
    const auto so = C::scaler_options(3);
    net<D> d(C::lay, tiny, 4, mpopt::mpi{MPI_COMM_WORLD}, zero_options(), so);
    net<L> l(C::lay, tiny, 4, mpopt::optimizer_options{.accumulation_steps = w}, so);
    for (int s = 0; s < 6; ++s) {
      CAPTURE(s);
      const auto [sd, sl] = boundary(d, l, ds.batch(s, w), 1);
      CHECK(sd.result == mpopt::step_result::applied);
      check_status(sd, sl, true);  // one shard holds everything: the same sums as one process
    }
    std::size_t owned = 0;
    for (std::size_t i = 0; i < d.params.size(); ++i) owned += d.opt.owned(i).count;
    CHECK(owned == (w == 1 ? 6u : world_rank() < 2 ? 3u : 0u));
    check_state(d, l, true, 6);
    check_same_on_every_rank(d);
  }

  TEST_CASE_TEMPLATE(
      "with a deterministic communicator, replicated (sum_by_shard), zero1 and zero2 at the same world size "
      "train bit for bit alike; with accumulation, replicated and zero1",
      C, SOME_CFGS) {
    using P = typename C::precision;
    using S = typename C::scaler;
    using R = typename C::rule;
    using Rep = mpopt::optimizer<P, S, mpopt::replicated, R, test_backend, mpopt::mpi>;
    using Z1 = mpopt::optimizer<P, S, mpopt::zero1, R, test_backend, mpopt::mpi>;
    using Z2 = mpopt::optimizer<P, S, mpopt::zero2, R, test_backend, mpopt::mpi>;
    const int w = world_size(), rank = world_rank();
    const std::string what = C::describe();
    CAPTURE(what);
    CAPTURE(w);
    const shape sh = random_shape(0xB17 + w);
    const dataset ds{0xB17, sh.all(), false};
    const auto so = C::scaler_options(4);
    const mpopt::mpi_options det{.deterministic = true};
    for (int a_steps : {1, 2}) {
      CAPTURE(a_steps);
      const auto o = zero_options({.accumulation_steps = a_steps, .sum_by_shard = true});
      net<Rep> rep(C::lay, sh, 3, mpopt::mpi{MPI_COMM_WORLD, det}, o, so);
      net<Z1> z1(C::lay, sh, 3, mpopt::mpi{MPI_COMM_WORLD, det}, o, so);
      net<Z2> z2(C::lay, sh, 3, mpopt::mpi{MPI_COMM_WORLD, det}, o, so);
      for (int s = 0; s < 10; ++s) {
        CAPTURE(s);
        const auto b = ds.batch(s, w * a_steps);
        mpopt::step_status st[3];
        for (int a = 0; a < a_steps; ++a) {
          const auto& g = b[std::size_t(rank * a_steps + a)];
          rep.write(g);
          z1.write(g);
          z2.write(g);
          z2.report_ready();
          st[0] = rep.opt.step();
          st[1] = z1.opt.step();
          st[2] = z2.opt.step();
        }
        CHECK(st[0].result == mpopt::step_result::applied);
        CHECK(st[1].grad_norm == st[0].grad_norm);
        const std::string d1 = take(z1).difference(take(rep));
        CHECK_MESSAGE(d1.empty(), "zero1 differs from replicated: " << d1);
        // zero2 reduces every micro-step, then adds: another order than folding first.
        if (a_steps == 1) {
          CHECK(st[2].grad_norm == st[0].grad_norm);
          const std::string d2 = take(z2).difference(take(rep));
          CHECK_MESSAGE(d2.empty(), "zero2 differs from replicated: " << d2);
        }
      }
      check_same_on_every_rank(z1);
    }
  }

  TEST_CASE_TEMPLATE(
      "an overflow on one rank's gradients makes every rank skip, with state bit-identical; the element "
      "it hits belongs to another rank's shard",
      C, ZERO_CFGS(mpopt::zero1), ZERO_CFGS(mpopt::zero2)) {
    using D = typename C::dist;
    using L = typename C::local;
    using G = typename D::grad_type;
    const int w = world_size();
    const std::string what = C::describe();
    CAPTURE(what);
    CAPTURE(w);
    const shape sh = random_shape(0x0F + w);
    const dataset ds{0x0F, sh.all(), true};
    const auto so = C::scaler_options(100);
    net<D> d(C::lay, sh, 5, mpopt::mpi{MPI_COMM_WORLD}, zero_options(), so);
    net<L> l(C::lay, sh, 5, mpopt::optimizer_options{.accumulation_steps = w}, so);
    const std::size_t last = sh.all().size() - 1;
    for (int s = 0; s < 6; ++s) {
      CAPTURE(s);
      std::vector<std::pair<int, std::function<void(net<D>&)>>> dist_faults;
      std::vector<std::pair<int, std::function<void(net<L>&)>>> ref_faults;
      if (s == 2) {  // the last rank poisons the first element (rank 0's shard)
        dist_faults.push_back({w - 1, [](net<D>& n) { n.grads[0][0] = G(NAN); }});
        ref_faults.push_back({w - 1, [](net<L>& n) { n.grads[0][0] = G(NAN); }});
      }
      if (s == 4) {  // rank 0 poisons the last element (the last rank's shard)
        dist_faults.push_back({0, [last](net<D>& n) { n.grads[last].back() = G(INFINITY); }});
        ref_faults.push_back({0, [last](net<L>& n) { n.grads[last].back() = G(INFINITY); }});
      }
      const snapshot before = take(d);
      const auto [sd, sl] = boundary(d, l, ds.batch(s, w), 1, dist_faults, ref_faults);
      check_status_same_on_every_rank(sd);
      CHECK(sd.result == sl.result);
      if (s == 2 || s == 4) {
        CHECK(sd.result == mpopt::step_result::skipped_nonfinite);
        const std::string diff = take(d).difference_except_scale(before);
        CHECK_MESSAGE(diff.empty(), "the skipped step changed " << diff);
      } else {
        CHECK(sd.result == mpopt::step_result::applied);
      }
    }
    CHECK(d.opt.group(0).step() == 4u);
    check_state(d, l, w == 1, 6, nullptr, sharded_moment_tol);
    check_same_on_every_rank(d);
  }

  TEST_CASE_TEMPLATE("4 micro-steps of batch B equal 1 step of batch 4B, bit for bit", C,
                     cfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::unfused, mpopt::zero1>,
                     cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::lamb, layout::flat, mpopt::zero1>,
                     cfg<mpopt::fp32, mpopt::no_scaling, mpopt::lamb, layout::flat, mpopt::zero2>,
                     cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::unfused, mpopt::zero2>,
                     cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::flat, mpopt::replicated>) {
    // Exact data: the sum of 4 micro-batch gradients, and a quarter of it, are exact in fp32 and in
    // fp16 (bf16's 8 bits cannot hold the 4B batch's gradient, so it is not among the cases).
    using D = typename C::dist;
    const int w = world_size(), rank = world_rank();
    const std::string what = C::describe();
    CAPTURE(what);
    CAPTURE(w);
    const shape sh = random_shape(0x4B + w);
    const dataset ds{0x4B, sh.all(), true};
    const auto so = C::scaler_options(3);
    net<D> micro(C::lay, sh, 8, mpopt::mpi{MPI_COMM_WORLD}, zero_options({.accumulation_steps = 4}), so);
    net<D> big(C::lay, sh, 8, mpopt::mpi{MPI_COMM_WORLD}, zero_options(), so);
    for (int s = 0; s < 8; ++s) {
      CAPTURE(s);
      const auto sm = run_boundary(micro, ds, s, 4, rank);
      grads_t mean;
      for (int a = 0; a < 4; ++a) {
        const grads_t g = ds.micro_batch(s, rank * 4 + a);
        if (mean.empty()) mean.assign(g.size(), {});
        for (std::size_t i = 0; i < g.size(); ++i) {
          mean[i].resize(g[i].size(), 0.0);
          for (std::size_t k = 0; k < g[i].size(); ++k) mean[i][k] += g[i][k] / 4;
        }
      }
      big.write(mean);
      bool exact = true;
      for (std::size_t i = 0; i < mean.size(); ++i)
        for (std::size_t k = 0; k < mean[i].size(); ++k) exact &= double(big.grads[i][k]) == mean[i][k] * big.opt.loss_scale();
      CHECK_MESSAGE(exact, "the 4B gradient is not exact in the gradient type");
      big.report_ready();
      const auto sb = big.opt.step();
      CHECK(sm.result == mpopt::step_result::applied);
      CHECK(sm.result == sb.result);
      CHECK(sm.grad_norm == sb.grad_norm);
      const std::string diff = take(micro).difference(take(big));
      CHECK_MESSAGE(diff.empty(), "4 x B differs from 1 x 4B: " << diff);
    }
  }

  TEST_CASE_TEMPLATE(
      "a checkpoint saved by W ranks loads at W (bit for bit), W/2 and 1 ranks (within the tolerance of a "
      "changed reduction order) and continues like an uninterrupted run there; replicated loads it too",
      C, cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::unfused, mpopt::zero1>,
      cfg<mpopt::bf16, mpopt::no_scaling, mpopt::lamb, layout::flat, mpopt::zero2>,
      cfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::flat, mpopt::zero2>) {
    using D = typename C::dist;
    const int w = world_size(), rank = world_rank();
    const std::string what = C::describe();
    CAPTURE(what);
    CAPTURE(w);
    const shape sh = random_shape(0xC4E + w);
    const dataset ds{0xC4E, sh.all(), true};  // a global batch of W micro-batches every step
    const auto so = C::scaler_options(3);
    const shared_dir dir;
    const auto path = dir / "zero.safetensors";
    {
      net<D> first(C::lay, sh, 9, mpopt::mpi{MPI_COMM_WORLD}, zero_options(), so);
      for (int s = 0; s < 5; ++s) run_boundary(first, ds, s, 1, rank);
      first.opt.save(path);
      // A replicated single process reads the per-parameter file as well.
      net<typename C::local> solo(C::lay, sh, 99, mpopt::optimizer_options{}, so);
      solo.opt.load(path);
      const std::string diff = take(solo).difference(take(first));
      CHECK_MESSAGE(diff.empty(), "a replicated load differs from the saved state: " << diff);
    }
    std::vector<int> sizes{w};
    if (w % 2 == 0 && w > 2) sizes.push_back(w / 2);
    if (w > 1) sizes.push_back(1);
    for (int size : sizes) {
      CAPTURE(size);
      MPI_Comm sub;
      MPI_Comm_split(MPI_COMM_WORLD, rank / size, rank, &sub);
      int sub_rank = 0;
      MPI_Comm_rank(sub, &sub_rank);
      const int a_steps = w / size;  // the same global batch at every world size
      {
        const auto o = zero_options({.accumulation_steps = a_steps});
        net<D> uninterrupted(C::lay, sh, 9, mpopt::mpi{sub}, o, so);
        net<D> resumed(C::lay, sh, 1234, mpopt::mpi{sub}, o, so);
        for (int s = 0; s < 5; ++s) run_boundary(uninterrupted, ds, s, a_steps, sub_rank);
        resumed.opt.load(path);
        for (int s = 5; s < 10; ++s) {
          CAPTURE(s);
          const auto su = run_boundary(uninterrupted, ds, s, a_steps, sub_rank);
          const auto sr = run_boundary(resumed, ds, s, a_steps, sub_rank);
          CHECK(sr.result == su.result);
          CHECK(sr.step == su.step);
          CHECK(sr.scale_after == su.scale_after);
        }
        if (size == w) {
          const std::string diff = take(resumed).difference(take(uninterrupted));
          CHECK_MESSAGE(diff.empty(), "resumed at the same world size differs: " << diff);
        } else {
          check_close(resumed, uninterrupted, 1e-6 * 10 * max_lr, sharded_moment_tol);
        }
      }
      MPI_Comm_free(&sub);
    }
  }

  TEST_CASE_TEMPLATE(
      "zero2 releases each gradient once its buckets are reduced: overwriting released gradients with NaN during "
      "backward changes nothing; replicated and zero1 release none before step()",
      C, cfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::unfused, mpopt::zero2>,
      cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::lamb, layout::flat, mpopt::zero2>) {
    using D = typename C::dist;
    using G = typename D::grad_type;
    const int w = world_size(), rank = world_rank();
    const std::string what = C::describe();
    CAPTURE(what);
    CAPTURE(w);
    const shape sh = random_shape(0x6E + w);
    const dataset ds{0x6E, sh.all(), true};
    const auto so = C::scaler_options(3);
    for (int a_steps : {1, 2}) {
      CAPTURE(a_steps);
      const auto o = zero_options({.accumulation_steps = a_steps});
      net<D> reused(C::lay, sh, 4, mpopt::mpi{MPI_COMM_WORLD}, o, so);
      net<D> kept(C::lay, sh, 4, mpopt::mpi{MPI_COMM_WORLD}, o, so);
      for (int s = 0; s < 4; ++s) {
        CAPTURE(s);
        mpopt::step_status st[2];
        for (int a = 0; a < a_steps; ++a) {
          const grads_t g = ds.micro_batch(s, rank * a_steps + a);
          reused.write(g);
          kept.write(g);
          kept.report_ready();
          // A backward that reuses gradient memory as soon as the optimizer is done with it.
          const std::size_t n = reused.grads.size();
          std::vector<bool> poisoned(n, false);
          std::size_t early = 0;  // released before the last report
          for (std::size_t i = n; i-- > 0;) {
            CHECK_FALSE(reused.opt.grad_consumed(i));
            reused.opt.grad_ready(i);
            for (std::size_t j = 0; j < n; ++j) {
              if (poisoned[j] || !reused.opt.grad_consumed(j)) continue;
              CHECK(j >= i);  // only reported tensors
              std::fill(reused.grads[j].begin(), reused.grads[j].end(), G(NAN));
              poisoned[j] = true;
              early += i > 0;
            }
          }
          CHECK(std::count(poisoned.begin(), poisoned.end(), true) == std::ptrdiff_t(n));
          CHECK(early > 0);  // buckets of 3000 elements: the large tensors go before the backward ends
          st[0] = reused.opt.step();
          st[1] = kept.opt.step();
        }
        CHECK(st[1].result == mpopt::step_result::applied);
        CHECK(st[0].result == st[1].result);
        const std::string diff = take(reused).difference(take(kept));
        CHECK_MESSAGE(diff.empty(), "reusing released gradient memory changed the run: " << diff);
      }
    }
    using Z1 = mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::zero1, mpopt::adam, test_backend, mpopt::mpi>;
    using Rep = mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::adam, test_backend, mpopt::mpi>;
    net<Z1> z1(layout::unfused, sh, 4, mpopt::mpi{MPI_COMM_WORLD}, zero_options());
    net<Rep> rep(layout::unfused, sh, 4, mpopt::mpi{MPI_COMM_WORLD}, zero_options());
    z1.report_ready();
    rep.report_ready();
    for (std::size_t i = 0; i < z1.grads.size(); ++i) {
      CHECK_FALSE(z1.opt.grad_consumed(i));
      CHECK_FALSE(rep.opt.grad_consumed(i));
    }
  }

  TEST_CASE_TEMPLATE(
      "a collective failing after the update is committed (LAMB's tensor norms, the parameter all-gather): step() "
      "throws on every rank, finish_step() or the next step() completes it, and the run equals one that never failed",
      C, cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::unfused, mpopt::zero2>,
      cfg<mpopt::bf16, mpopt::no_scaling, mpopt::lamb, layout::flat, mpopt::zero1>) {
    using D = mpopt::optimizer<typename C::precision, typename C::scaler, typename C::partition, typename C::rule,
                               test_backend, failing_mpi>;
    constexpr bool is_lamb = std::is_same_v<typename C::rule, mpopt::lamb>;
    const int w = world_size(), rank = world_rank();
    const std::string what = C::describe();
    CAPTURE(what);
    CAPTURE(w);
    const shape sh = random_shape(0xF1 + w);
    const dataset ds{0xF1, sh.all(), true};
    const auto so = C::scaler_options(3);
    net<D> n(C::lay, sh, 5, failing_mpi{MPI_COMM_WORLD}, zero_options(), so);
    net<D> clean(C::lay, sh, 5, failing_mpi{MPI_COMM_WORLD}, zero_options(), so);
    auto step = [&](net<D>& x, int s) { return run_boundary(x, ds, s, 1, rank); };
    enum class fault { lamb_norms, gather };
    int s = 0;
    for (fault f : {fault::lamb_norms, fault::gather, fault::gather}) {
      if (f == fault::lamb_norms && !is_lamb) continue;
      CAPTURE(s);
      CHECK(step(clean, s).applied);
      const snapshot before = take(n);
      auto& comm = n.opt.communicator();
      if (f == fault::gather) comm.fail_gather_at = comm.gathers + 1;  // the second bucket
      else comm.fail_sum_at = comm.sums + 1;  // the first is the global norm, the second the tensor norms
      std::string message;
      try {
        step(n, s);
      } catch (const mpopt::error& e) {
        message = e.what();
      }
      CHECK_MESSAGE(message.find("committed on every rank but unfinished") != std::string::npos, message);
      CHECK(n.opt.group(0).step() == std::uint64_t(s + 1));  // the update counts
      CHECK_FALSE(take(n).difference(before).empty());        // and it has begun
      // The second gather failure is left for the next step() to finish; the others for finish_step().
      if (s < 2) {
        n.opt.finish_step();
        n.opt.finish_step();  // nothing left: a no-op
        const std::string diff = take(n).difference(take(clean));
        CHECK_MESSAGE(diff.empty(), "finish_step() differs from a step that never failed: " << diff);
      }
      ++s;
    }
    for (; s < 5; ++s) {
      CHECK(step(clean, s).applied);
      CHECK(step(n, s).applied);
    }
    const std::string diff = take(n).difference(take(clean));
    CHECK_MESSAGE(diff.empty(), "a run with failed collectives differs from a clean one: " << diff);
    check_same_on_every_rank(n);
  }

  TEST_CASE(
      "bad input under ZeRO: different layouts across ranks, a failing communicator, another model's "
      "checkpoint: mpopt::error on every rank, nothing changed") {
    using D = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam, test_backend, failing_mpi>;
    using Z1 = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::zero1, mpopt::lamb, test_backend, mpopt::mpi>;
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    // Rank-dependent sizes (one rank differs): caught at the first step, before any gradient moves.
    {
      const shape mine{{1, 7, rank == w - 1 ? std::size_t(302) : 301, 4097}, {3, 65}};
      net<Z1> odd(layout::unfused, mine, 1, mpopt::mpi{MPI_COMM_WORLD}, zero_options());
      const dataset ds{1, mine.all(), true};
      odd.write(ds.micro_batch(0, rank));
      if (w > 1) {
        CHECK_THROWS_AS(odd.opt.step(), mpopt::error);
        CHECK(odd.opt.tensor_count() == 0);  // nothing was set up
      } else {
        CHECK(odd.opt.step().applied);
      }
    }
    const shape sh{{1, 7, 301, 4097}, {3, 65}};
    const dataset ds{0xBAD, sh.all(), true};
    net<D> n(layout::unfused, sh, 1, failing_mpi{MPI_COMM_WORLD}, zero_options(), mpopt::dynamic_scale_options{.init_scale = 1024});
    auto step = [&](int s) {
      n.write(ds.micro_batch(s, rank));
      n.report_ready();
      return n.opt.step();
    };
    for (int s = 0; s < 2; ++s) step(s);
    // A reduce-scatter fails in the middle of the gradients: the step throws and changes nothing.
    const snapshot before = take(n);
    auto& comm = n.opt.communicator();
    comm.fail_reduce_at = comm.reduces + 1;
    CHECK_THROWS_AS(step(2), mpopt::error);
    CHECK(take(n).difference(before).empty());
    // The next step works and equals an optimizer that never saw the failure.
    net<D> clean(layout::unfused, sh, 1, failing_mpi{MPI_COMM_WORLD}, zero_options(), mpopt::dynamic_scale_options{.init_scale = 1024});
    for (int s = 0; s < 2; ++s) {
      clean.write(ds.micro_batch(s, rank));
      clean.report_ready();
      clean.opt.step();
    }
    CHECK(step(3).applied);
    clean.write(ds.micro_batch(3, rank));
    clean.report_ready();
    CHECK(clean.opt.step().applied);
    CHECK(take(n).difference(take(clean)).empty());

    // Another model's checkpoint: checked on every rank before anything changes.
    const shared_dir dir;
    const shape other{{1, 7, 301, 4096}, {3, 65}};
    net<D> stranger(layout::unfused, other, 2, failing_mpi{MPI_COMM_WORLD}, zero_options());
    const dataset ods{0x0DD, other.all(), true};
    stranger.write(ods.micro_batch(0, rank));
    stranger.report_ready();
    stranger.opt.step();
    stranger.opt.save(dir / "other.safetensors");
    const snapshot mine = take(n);
    CHECK_THROWS_AS(n.opt.load(dir / "other.safetensors"), mpopt::error);
    CHECK(take(n).difference(mine).empty());
    check_same_on_every_rank(n);
  }
  TEST_CASE("save() on every rank: the same path, or an error on every rank; a failure to write reaches every rank "
            "with its reason (a missing directory, a full disk); nothing changes, and a good save then works") {
    using Z1 = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::zero1, mpopt::lamb, test_backend, mpopt::mpi>;
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    const shape sh{{1, 7, 301, 4097}, {3, 65}};
    const dataset ds{0x5A7E, sh.all(), true};
    net<Z1> n(layout::unfused, sh, 1, mpopt::mpi{MPI_COMM_WORLD}, zero_options());
    n.write(ds.micro_batch(0, rank));
    n.report_ready();
    CHECK(n.opt.step().applied);
    const snapshot before = take(n);
    const shared_dir dir;
    // The writer's reason, on the writer as it is, elsewhere after whose it is.
    auto check_failed = [&](const std::string& m, const std::string& reason) {
      CHECK_MESSAGE(m.find(reason) != std::string::npos, m);
      if (rank != 0) CHECK_MESSAGE(m.starts_with("mpopt: save() failed on rank 0: "), m);
    };
    if (w > 1) {
      const std::string m = error_of([&] { n.opt.save(dir / ("rank" + std::to_string(rank) + ".safetensors")); });
      CHECK_MESSAGE(m.starts_with("mpopt: the ranks disagree on the path given to save() (rank 0: "), m);
      CHECK_FALSE(std::filesystem::exists(dir / "rank0.safetensors"));
    }
    check_failed(error_of([&] { n.opt.save(dir / "missing" / "state.safetensors"); }), "No such file or directory");
    // A full disk: rank 0 may write 4 KiB (the file is larger), and the signal of a write past it is ignored.
    rlimit was{};
    if (rank == 0) {
      std::signal(SIGXFSZ, SIG_IGN);
      getrlimit(RLIMIT_FSIZE, &was);
      rlimit small = was;
      small.rlim_cur = 4096;
      setrlimit(RLIMIT_FSIZE, &small);
    }
    const std::string full = error_of([&] { n.opt.save(dir / "full.safetensors"); });
    if (rank == 0) setrlimit(RLIMIT_FSIZE, &was);
    check_failed(full, "File too large");
    CHECK_FALSE(std::filesystem::exists(dir / "full.safetensors"));
    MPI_Barrier(MPI_COMM_WORLD);
    for (const auto& entry : std::filesystem::directory_iterator(dir.path))  // no temporary file left behind
      CHECK_MESSAGE(entry.path().string().find(".tmp") == std::string::npos, entry.path().string());
    CHECK(take(n).difference(before).empty());
    n.opt.save(dir / "good.safetensors");
    n.opt.load(dir / "good.safetensors");
    CHECK(take(n).difference(before).empty());

    // Into memory: rank 0's buffer holds the file's bytes, the others' are emptied; from rank 0's
    // bytes, sent to every rank, each loads its shard.
    std::vector<std::byte> bytes(9, std::byte{1});
    n.opt.save(bytes);
    std::uint64_t size = bytes.size();
    MPI_Bcast(&size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      std::ifstream in(dir / "good.safetensors", std::ios::binary);
      const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      CHECK(file == std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    } else {
      CHECK(bytes.empty());
    }
    bytes.resize(size);
    MPI_Bcast(bytes.data(), int(size), MPI_BYTE, 0, MPI_COMM_WORLD);
    for (int s = 1; s < 3; ++s) {  // move on, then back
      n.write(ds.micro_batch(s, rank));
      n.report_ready();
      n.opt.step();
    }
    n.opt.load(bytes);
    CHECK(take(n).difference(before).empty());
    check_same_on_every_rank(n);
  }

  TEST_CASE_TEMPLATE("stochastic rounding gives one process's bits on any number of ranks, under every partition", P,
                     mpopt::zero1, mpopt::zero2, mpopt::replicated) {
    // No clipping, which would read the norm's per-shard sums: the masters agree bit for bit and
    // any difference in the parameters would be the rounding's.
    const mpopt::optimizer_options o{
        .clip_grad = 0, .combine = mpopt::accumulation::sum, .bucket_elements = 3000, .rounding_seed = 0xD1CE};
    step_as_one_process<mpopt::bf16_stochastic, P>(o, {{{"a", 5000}, {"b", 1}, {"c", 77}}, {{"d", 70001}, {"e", 3}}}, 8,
                                                   [](int, auto&, const auto&, const auto&) {});
  }

  TEST_CASE_TEMPLATE("bf16 state rounded stochastically and remainder16 masters give one process's bits on any "
                     "number of ranks, under every partition", P, mpopt::zero1, mpopt::zero2, mpopt::replicated) {
    using compact = mpopt::with_state<mpopt::bf16, mpopt::bf16_state<mpopt::stochastic_rounding>, mpopt::remainder16>;
    const mpopt::optimizer_options o{
        .clip_grad = 0, .combine = mpopt::accumulation::sum, .bucket_elements = 3000, .rounding_seed = 0xD1CE};
    step_as_one_process<compact, P>(o, {{{"a", 5000}, {"b", 1}, {"c", 77}}, {{"d", 70001}, {"e", 3}}}, 8,
                                    [](int, auto&, const auto&, const auto&) {});
  }

  template <class State, class Partition>
  struct quantized_on {
    using precision = mpopt::with_state<mpopt::bf16, State, mpopt::remainder16>;
    using partition = Partition;
  };
  TEST_CASE_TEMPLATE("state quantized in blocks (8-bit, 4-bit, fp8) gives one process's bits on any number of ranks: "
                     "no block crosses a shard", Q, quantized_on<mpopt::blockwise8_state, mpopt::zero1>,
                     quantized_on<mpopt::blockwise4_state, mpopt::zero2>, quantized_on<mpopt::fp8_state, mpopt::replicated>) {
    // 4-bit under ZeRO-2: at step 4 each rank loads the one-process checkpoint of codes (two a
    // byte) and scales, its shard's, and goes on (the other storages' files: state_precision.cpp).
    constexpr int checkpoint_at = std::is_same_v<typename Q::partition, mpopt::zero2> ? 4 : -1;
    const mpopt::optimizer_options o{.clip_grad = 0, .combine = mpopt::accumulation::sum, .bucket_elements = 3000};
    step_as_one_process<typename Q::precision, typename Q::partition, checkpoint_at>(
        o, {{{"a", 5000}, {"b", 1}, {"c", 77}}, {{"d", 70001}, {"e", 3}}}, 8, [](int, auto&, const auto&, const auto&) {});
  }

  TEST_CASE_TEMPLATE("a one-process checkpoint of other storage (fp32, or 8-bit blocks of 256) loads into 4-bit "
                     "state under ZeRO-2 as into one process, its blocks read around each shard: the same bits, "
                     "step after step",
                     From, mpopt::bf16, quantized_on<mpopt::blockwise8_state, mpopt::zero1>::precision) {
    using To = quantized_on<mpopt::blockwise4_state, mpopt::zero2>::precision;
    using from_t = mpopt::optimizer<From, mpopt::no_scaling, mpopt::replicated, mpopt::adam, test_backend>;
    using dist_t = mpopt::optimizer<To, mpopt::no_scaling, mpopt::zero2, mpopt::adam, test_backend, mpopt::mpi>;
    using local_t = mpopt::optimizer<To, mpopt::no_scaling, mpopt::replicated, mpopt::adam, test_backend>;
    const int rank = world_rank();
    CAPTURE(world_size());
    const mpopt::optimizer_options o{.clip_grad = 0, .combine = mpopt::accumulation::sum, .bucket_elements = 3000};
    const std::vector<mpopt::tensor_spec> specs = {{"a", 5000}, {"b", 1}, {"c", 77}, {"d", 70001}, {"e", 3}};
    from_t f(o);
    dist_t d(mpopt::mpi{MPI_COMM_WORLD}, o);
    local_t l(o);
    auto& fg = f.add_flat_group({.lr = 1e-4, .weight_decay = 0.01}, specs);
    auto& dg = d.add_flat_group({.lr = 1e-4, .weight_decay = 0.01}, specs);
    auto& lg = l.add_flat_group({.lr = 1e-4, .weight_decay = 0.01}, specs);
    auto gradients = [&](int s, auto& g, bool sender) {
      for (std::size_t t = 0; t < specs.size(); ++t)
        for (std::size_t k = 0; k < specs[t].size; ++k)
          g.grad(t)[k] = sender ? mpopt::bfloat16(float(unit(mix((std::uint64_t(s) << 40) + (std::uint64_t(t) << 32) + k))))
                                : mpopt::bfloat16(0.0f);
    };
    for (std::size_t t = 0; t < specs.size(); ++t)
      for (std::size_t k = 0; k < specs[t].size; ++k)
        fg.param(t)[k] = mpopt::bfloat16(float(0.5 + 0.25 * unit(mix((std::uint64_t(t) << 32) + k))));
    for (int s = 0; s < 3; ++s) {
      gradients(s, fg, true);
      f.step();
    }
    std::vector<std::byte> file;
    f.save(file);
    d.load(file);
    l.load(file);
    for (int s = 3; s < 6; ++s) {
      CAPTURE(s);
      gradients(s, dg, rank == 0);  // summed over the ranks: one process's gradients
      gradients(s, lg, true);
      REQUIRE(d.step().applied);
      REQUIRE(l.step().applied);
      for (std::size_t t = 0; t < specs.size(); ++t)
        REQUIRE(std::memcmp(dg.param(t).data(), lg.param(t).data(), dg.param(t).size_bytes()) == 0);
    }
    load_one_process_file(d, l, rank);  // and their states: the same file
  }

  TEST_CASE_TEMPLATE("with nothing to know before the update the norm comes from the update pass, agreed across "
                     "ranks after it: one process's bits, under every partition", P,
                     mpopt::zero1, mpopt::zero2, mpopt::replicated) {
    // No clipping and no overflow skip: no rank reads its gradients before the update.
    const mpopt::optimizer_options o{
        .clip_grad = 0, .combine = mpopt::accumulation::sum, .skip_nonfinite = false, .bucket_elements = 3000};
    step_as_one_process<mpopt::bf16, P>(o, {{{"a", 5000}, {"b", 1}, {"c", 70001}, {"d", 77}}}, 4,
                                        [](int s, auto& grads, const auto& ds, const auto& ls) {
      if (s >= 0) {
        if (s == 3)  // every rank's gradient: the norm says so
          for (auto& g : grads) g[2][123] = mpopt::bfloat16(NAN);
        return;
      }
      if (!std::isnan(ds.grad_norm)) CHECK(std::abs(ds.grad_norm - ls.grad_norm) <= 1e-12 * ls.grad_norm);
      else CHECK(std::isnan(ls.grad_norm));
    });
  }
}
