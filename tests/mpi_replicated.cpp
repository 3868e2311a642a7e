// Plain data parallelism over MPI (mpopt::replicated with the mpopt::mpi communicator). W ranks each
// back-propagate their own slice of a global batch; at the accumulation boundary the optimizer sums
// the fp32 gradients over ranks and divides by loss_scale * accumulation_steps * W. Every rank must
// therefore train exactly like one process (mpopt::single_process) that receives the W slices as W
// micro-steps, and all ranks must stay bit-identical.
//
// Every rank runs every test case and every collective in the same order, so nothing here may end a
// test case on one rank only: CHECK, never REQUIRE. All data is a pure function of (seed, step,
// micro-batch, tensor, element), so every rank can build every other rank's gradients and feed the
// single-process reference itself; the reference runs on every rank.
//
// Two kinds of data (see `dataset`): smooth random gradients, where the float sum over ranks may be
// ordered differently from the reference's sequential micro-steps (compared within tolerances, see
// check_close; bitwise when at most two values are summed), and gradients on a coarse grid whose
// float sums are exact in any order (compared bit for bit for every W).
#include <doctest/doctest.h>

#include "mpi_harness.hpp"

#include <deque>
#include <optional>
#include <string>

TEST_SUITE("mpi") {
  // ------------------------------------------------------------------------------------------ 1, 2
  TEST_CASE_TEMPLATE(
      "W ranks each with its own gradient slice train like one process averaging the W slices as "
      "micro-steps, and every rank ends with bit-identical params, masters and moments",
      C, ALL_CFGS) {
    using D = typename C::dist;
    using L = typename C::local;
    const int w = world_size();
    const std::string what = C::describe();
    CAPTURE(what);
    CAPTURE(w);
    const shape sh = random_shape(0xD15C0 + w);
    const dataset ds{0x5EED, sh.all(), false};
    const auto so = C::scaler_options(5);  // fp16: the scale doubles every 5 clean steps
    net<D> d(C::lay, sh, 42, mpopt::mpi{MPI_COMM_WORLD}, mpopt::optimizer_options{}, so);
    net<L> l(C::lay, sh, 42, mpopt::optimizer_options{.accumulation_steps = w}, so);
    // Two float summands add the same in any order: with W <= 2 the runs must agree bit for bit.
    const bool bitwise = w <= 2;
    closeness worst;
    int clipped = 0, unclipped = 0;
    const int steps = 20;
    for (int s = 0; s < steps; ++s) {
      CAPTURE(s);
      const auto [sd, sl] = boundary(d, l, ds.batch(s, w), 1);
      CHECK(sd.result == mpopt::step_result::applied);
      worst.norm_rel = std::max(worst.norm_rel, check_status(sd, sl, bitwise));
      (sd.clip_coef < 1 ? clipped : unclipped) += 1;
      if (s % 5 == 4) check_state(d, l, bitwise, s + 1, &worst);
    }
    CHECK(clipped > 0);
    CHECK(unclipped > 0);
    CHECK(d.opt.group(0).step() == std::uint64_t(steps));
    CHECK(d.opt.group(1).step() == std::uint64_t(steps));
    if (std::is_same_v<typename C::scaler, mpopt::dynamic_scale>) CHECK(d.opt.loss_scale() > 1024);  // it grew
    check_same_on_every_rank(d);
    if (!bitwise) worst.report(what, w, "");
  }

  TEST_CASE_TEMPLATE(
      "with gradients whose float sums are exact in any order, W ranks are bit-identical to one "
      "process: summation order is the only difference",
      C, SOME_CFGS) {
    using D = typename C::dist;
    using L = typename C::local;
    const int w = world_size();
    const std::string what = C::describe();
    CAPTURE(what);
    CAPTURE(w);
    const shape sh = random_shape(0xE8AC7 + w);
    const dataset ds{0xE8AC7, sh.all(), true};
    const auto so = C::scaler_options(3);
    net<D> d(C::lay, sh, 7, mpopt::mpi{MPI_COMM_WORLD}, mpopt::optimizer_options{}, so);
    net<L> l(C::lay, sh, 7, mpopt::optimizer_options{.accumulation_steps = w}, so);
    int clipped = 0, unclipped = 0;
    for (int s = 0; s < 10; ++s) {
      CAPTURE(s);
      const auto [sd, sl] = boundary(d, l, ds.batch(s, w), 1);
      CHECK(sd.result == mpopt::step_result::applied);
      check_status(sd, sl, true);
      (sd.clip_coef < 1 ? clipped : unclipped) += 1;
    }
    check_state(d, l, true, 0);
    CHECK(clipped > 0);
    CHECK(unclipped > 0);
    check_same_on_every_rank(d);
  }

  // ------------------------------------------------------------------------------------------ 3
  TEST_CASE_TEMPLATE(
      "inf or NaN in one gradient element on one rank skips the step on every rank bit-exactly, the "
      "scale drops by the rule everywhere, and training continues identically",
      C, ALL_CFGS) {
    using D = typename C::dist;
    using L = typename C::local;
    using G = typename D::grad_type;
    const int w = world_size();
    const int rank = world_rank();
    const std::string what = C::describe();
    CAPTURE(what);
    CAPTURE(w);
    const shape sh = random_shape(0xFA17 + w);
    const auto sizes = sh.all();
    const dataset ds{0xFA17, sizes, true};    // exact sums: the reference comparison is bitwise for every W
    const auto so = C::scaler_options(1000);  // no growth: only the overflows move the scale
    net<D> d(C::lay, sh, 3, mpopt::mpi{MPI_COMM_WORLD}, mpopt::optimizer_options{}, so);
    net<L> l(C::lay, sh, 3, mpopt::optimizer_options{.accumulation_steps = w}, so);

    // Fault f at step fault_steps[f] on rank f % W: tensor, position and value vary; the last one
    // puts +inf on one rank and -inf at the same element on the next (their sum is NaN).
    const int fault_steps[] = {3, 4, 9, 14};
    const std::size_t fault_tensor[] = {3, 0, 6, 2};  // the big one, the 1-element one, ...
    const float fault_value[] = {INFINITY, NAN, -INFINITY, INFINITY};
    double scale = d.opt.loss_scale();
    int faults = 0;
    for (int s = 0; s < 16; ++s) {
      CAPTURE(s);
      const auto* at = std::find(std::begin(fault_steps), std::end(fault_steps), s);
      if (at == std::end(fault_steps)) {
        const auto [sd, sl] = boundary(d, l, ds.batch(s, w), 1);
        CHECK(sd.result == mpopt::step_result::applied);
        check_status(sd, sl, true);
        continue;
      }
      const int f = int(at - std::begin(fault_steps));
      const int bad_rank = f % w;
      const std::size_t t = fault_tensor[f];
      const std::size_t pos = mix(0xBAD + std::uint64_t(f)) % sizes[t];
      CAPTURE(bad_rank);
      CAPTURE(t);
      CAPTURE(pos);
      std::vector<std::pair<int, std::function<void(net<D>&)>>> dist_faults;
      std::vector<std::pair<int, std::function<void(net<L>&)>>> ref_faults;
      dist_faults.push_back({bad_rank, [&](net<D>& n) { n.grads[t][pos] = G(fault_value[f]); }});
      ref_faults.push_back({bad_rank, [&](net<L>& n) { n.grads[t][pos] = G(fault_value[f]); }});
      if (f == 3 && w > 1) {
        const int other = (bad_rank + 1) % w;
        dist_faults.push_back({other, [&](net<D>& n) { n.grads[t][pos] = G(-INFINITY); }});
        ref_faults.push_back({other, [&](net<L>& n) { n.grads[t][pos] = G(-INFINITY); }});
      }
      const snapshot before = take(d);
      const auto [sd, sl] = boundary(d, l, ds.batch(s, w), 1, dist_faults, ref_faults);
      ++faults;
      CHECK(sd.result == mpopt::step_result::skipped_nonfinite);
      CHECK_FALSE(sd.applied);
      CHECK(sd.skipped_steps == std::uint64_t(faults));
      CHECK(sd.consecutive_skips == (f == 1 ? 2u : 1u));
      CHECK(sd.step == before.group_steps[0]);
      check_status(sd, sl, true);
      // DeepSpeed's rule with hysteresis 2: the first overflow is tolerated, every later one halves
      // (no clean window of 1000 steps in between resets the hysteresis).
      if (std::is_same_v<typename C::scaler, mpopt::dynamic_scale>) {
        CHECK(sd.scale_before == scale);
        if (f > 0) scale /= 2;
        CHECK(sd.scale_after == scale);
      } else {
        CHECK(sd.scale_after == 1.0);
      }
      const std::string diff = take(d).difference_except_scale(before);
      CHECK_MESSAGE(diff.empty(), "rank " << rank << ": the skipped step changed " << diff);
      CHECK(d.opt.loss_scale() == scale);
      check_same_on_every_rank(d);
    }
    CHECK(faults == 4);
    CHECK(d.opt.group(0).step() == 12u);
    CHECK(d.opt.group(1).step() == 12u);
    check_state(d, l, true, 0);
    check_same_on_every_rank(d);
  }

  TEST_CASE("per-rank fp16 gradients near the fp16 maximum sum in fp32 without a false overflow") {
    using D =
        mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam, test_backend, mpopt::mpi>;
    using L = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam, test_backend>;
    const int w = world_size();
    const shape sh{{1, 7, 301}, {3, 65}};
    mpopt::dynamic_scale_options so;
    so.init_scale = 1024;
    net<D> d(layout::flat, sh, 5, mpopt::mpi{MPI_COMM_WORLD}, mpopt::optimizer_options{}, so);
    net<L> l(layout::flat, sh, 5, mpopt::optimizer_options{.accumulation_steps = w}, so);
    const dataset ds{0x6550, sh.all(), true};
    auto b = ds.batch(0, w);
    for (auto& mb : b) mb[2][100] = 60000.0 / 1024;  // 60000 in every rank's fp16 gradient: W * 60000 > 65504
    const auto [sd, sl] = boundary(d, l, b, 1);
    CHECK(sd.result == mpopt::step_result::applied);
    check_status(sd, sl, true);
    check_state(d, l, true, 0);
    check_same_on_every_rank(d);
  }

  TEST_CASE_TEMPLATE(
      "an overflow on one rank that the failure policy turns into an error throws mpopt::error on "
      "every rank, changes nothing anywhere, and the next step trains on every rank",
      C, cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::flat>,
      cfg<mpopt::bf16, mpopt::no_scaling, mpopt::lamb, layout::unfused>) {
    using D = typename C::dist;
    using L = typename C::local;
    using G = typename D::grad_type;
    const int w = world_size();
    const std::string what = C::describe();
    CAPTURE(what);
    CAPTURE(w);
    const shape sh{{1, 7, 301, 1001}, {3, 65}};
    const dataset ds{0xE220, sh.all(), true};
    // fp16: at_min_scale::raise with the scale one halving above its minimum; bf16: at most 2
    // consecutive skips. Either way the first overflow skips and the second one throws.
    typename C::scaler::options so{};
    mpopt::optimizer_options oo;
    if constexpr (std::is_same_v<typename C::scaler, mpopt::dynamic_scale>) {
      so.init_scale = 2;
      so.min_scale = 1;
      so.hysteresis = 1;
    } else {
      oo.max_consecutive_skips = 2;
    }
    net<D> d(C::lay, sh, 21, mpopt::mpi{MPI_COMM_WORLD}, oo, so);
    mpopt::optimizer_options lo = oo;
    lo.accumulation_steps = w;
    net<L> l(C::lay, sh, 21, lo, so);
    for (int s = 0; s < 6; ++s) {
      CAPTURE(s);
      const auto b = ds.batch(s, w);
      if (s == 3) {
        // The second overflow in a row, on rank 0 only. The single-process reference never sees
        // this window: a throwing step changes nothing, so it stays where d must stay.
        const snapshot before = take(d);
        d.write(b[std::size_t(world_rank())]);
        if (world_rank() == 0) d.grads[3][77] = G(INFINITY);
        CHECK_THROWS_AS(d.opt.step(), mpopt::error);
        const std::string diff = take(d).difference(before);
        CHECK_MESSAGE(diff.empty(), "the throwing step changed " << diff);
        check_same_on_every_rank(d);
        continue;
      }
      std::vector<std::pair<int, std::function<void(net<D>&)>>> dist_faults;
      std::vector<std::pair<int, std::function<void(net<L>&)>>> ref_faults;
      if (s == 2) {  // the first overflow, on the last rank
        dist_faults.push_back({w - 1, [](net<D>& n) { n.grads[0][0] = G(NAN); }});
        ref_faults.push_back({w - 1, [](net<L>& n) { n.grads[0][0] = G(NAN); }});
      }
      const auto [sd, sl] = boundary(d, l, b, 1, dist_faults, ref_faults);
      CHECK(sd.result == (s == 2 ? mpopt::step_result::skipped_nonfinite : mpopt::step_result::applied));
      check_status(sd, sl, true);
    }
    CHECK(d.opt.group(0).step() == 4u);
    check_state(d, l, true, 0);
    check_same_on_every_rank(d);
  }

  // ------------------------------------------------------------------------------------------ 4
  TEST_CASE_TEMPLATE(
      "accumulation_steps = 2 on W ranks equals one process accumulating all 2W micro-batches, with "
      "combine = mean and sum; an overflow in one rank's micro-step skips the window everywhere",
      C, SOME_CFGS) {
    using D = typename C::dist;
    using L = typename C::local;
    using G = typename D::grad_type;
    const int w = world_size();
    const int a_steps = 2;
    const std::string what = C::describe();
    CAPTURE(what);
    CAPTURE(w);
    // Smooth data (tolerances) with mean and with sum; exact data (bitwise for every W) with mean.
    const std::pair<mpopt::accumulation, bool> runs[] = {
        {mpopt::accumulation::mean, false}, {mpopt::accumulation::sum, false}, {mpopt::accumulation::mean, true}};
    for (const auto& run : runs) {
      const mpopt::accumulation combine = run.first;
      const bool exact = run.second;
      CAPTURE(exact);
      CAPTURE(combine == mpopt::accumulation::mean);
      const shape sh = random_shape(0xACC + w + 10 * exact);
      const dataset ds{0xACC + std::uint64_t(exact), sh.all(), exact};
      const auto so = C::scaler_options(4);
      net<D> d(C::lay, sh, 11, mpopt::mpi{MPI_COMM_WORLD},
               mpopt::optimizer_options{.accumulation_steps = a_steps, .combine = combine}, so);
      net<L> l(C::lay, sh, 11, mpopt::optimizer_options{.accumulation_steps = a_steps * w, .combine = combine}, so);
      // Two summands at most (W = 1) add the same in any order; otherwise bitwise only for exact data.
      const bool bitwise = exact || w * a_steps <= 2;
      closeness worst;
      int applied = 0;
      for (int s = 0; s < 8; ++s) {
        CAPTURE(s);
        std::vector<std::pair<int, std::function<void(net<D>&)>>> dist_faults;
        std::vector<std::pair<int, std::function<void(net<L>&)>>> ref_faults;
        const int bad = s == 5 ? ((w - 1) * a_steps) : -1;  // the first micro-step of the last rank
        if (bad >= 0) {
          dist_faults.push_back({bad, [](net<D>& n) { n.grads[3][5] = G(NAN); }});
          ref_faults.push_back({bad, [](net<L>& n) { n.grads[3][5] = G(NAN); }});
        }
        const std::optional<snapshot> before = bad >= 0 ? std::optional(take(d)) : std::nullopt;
        const auto [sd, sl] = boundary(d, l, ds.batch(s, w * a_steps), a_steps, dist_faults, ref_faults);
        worst.norm_rel = std::max(worst.norm_rel, check_status(sd, sl, bitwise));
        if (bad >= 0) {
          CHECK(sd.result == mpopt::step_result::skipped_nonfinite);
          const std::string diff = take(d).difference_except_scale(*before);
          CHECK_MESSAGE(diff.empty(), "the skipped window changed " << diff);
        } else {
          CHECK(sd.result == mpopt::step_result::applied);
          applied += sd.applied;
        }
        check_state(d, l, bitwise, s + 1, &worst);
      }
      CHECK(applied == 7);
      check_same_on_every_rank(d);
      if (!bitwise) worst.report(what, w, combine == mpopt::accumulation::mean ? " mean" : " sum");
    }
  }

  // ------------------------------------------------------------------------------------------ 5
  TEST_CASE_TEMPLATE(
      "save on every rank (rank 0 writes), load into fresh optimizers on every rank: training continues "
      "bit-identically to an uninterrupted run",
      C, ALL_CFGS) {
    using D = typename C::dist;
    using G = typename D::grad_type;
    const int w = world_size();
    const std::string what = C::describe();
    CAPTURE(what);
    CAPTURE(w);
    const shape sh = random_shape(0x5A7E + w);
    const dataset ds{0x5A7E, sh.all(), true};
    const auto so = C::scaler_options(3);  // fp16: doubles at step 3
    const shared_dir dir;
    const auto path = dir / "state.safetensors";
    // Overflow on one rank at steps 4 and 7: the hysteresis the scaler spent before the save must
    // come back with the load, or the second overflow would not halve the scale; and its window
    // counts from the overflow at step 4, or it would double again at step 6.
    auto run = [&](net<D>& n, int s) {
      n.write(ds.micro_batch(s, world_rank()));
      if ((s == 4 || s == 7) && world_rank() == (s == 4 ? w - 1 : 0)) n.grads[3][17] = G(INFINITY);
      return n.opt.step();
    };
    net<D> whole(C::lay, sh, 9, mpopt::mpi{MPI_COMM_WORLD}, mpopt::optimizer_options{}, so);
    net<D> first(C::lay, sh, 9, mpopt::mpi{MPI_COMM_WORLD}, mpopt::optimizer_options{}, so);
    std::vector<mpopt::step_status> expected;
    for (int s = 0; s < 10; ++s) expected.push_back(run(whole, s));
    for (int s = 0; s < 5; ++s) run(first, s);
    first.opt.save(path);
    MPI_Barrier(MPI_COMM_WORLD);
    // Fresh optimizer, different initial parameters: the load must restore them.
    net<D> resumed(C::lay, sh, 1234, mpopt::mpi{MPI_COMM_WORLD}, mpopt::optimizer_options{}, so);
    resumed.opt.load(path);
    {
      const std::string diff = take(resumed).difference(take(first));
      CHECK_MESSAGE(diff.empty(), "loaded state differs from the saved one: " << diff);
      // The file does not depend on the communicator: a single-process optimizer reads it too.
      net<typename C::local> solo(C::lay, sh, 99, mpopt::optimizer_options{}, so);
      solo.opt.load(path);
      const std::string diff_solo = take(solo).difference(take(first));
      CHECK_MESSAGE(diff_solo.empty(), "a single-process load differs from the saved state: " << diff_solo);
    }
    for (int s = 5; s < 10; ++s) {
      CAPTURE(s);
      const auto st = run(resumed, s);
      const auto& e = expected[std::size_t(s)];
      CHECK(st.result == e.result);
      CHECK(st.step == e.step);
      CHECK(st.skipped_steps == e.skipped_steps);
      CHECK(st.consecutive_skips == e.consecutive_skips);
      CHECK(st.scale_before == e.scale_before);
      CHECK(st.scale_after == e.scale_after);
      CHECK(st.grad_norm == e.grad_norm);
    }
    CHECK(expected[4].result == mpopt::step_result::skipped_nonfinite);
    CHECK(expected[7].result == mpopt::step_result::skipped_nonfinite);
    if (std::is_same_v<typename C::scaler, mpopt::dynamic_scale>) {
      CHECK(expected[3].scale_after == 2048);  // grew before the save
      CHECK(expected[4].scale_after == 2048);  // hysteresis: the first overflow is tolerated
      CHECK(expected[7].scale_after == 1024);  // after the load: the second one halves
      CHECK(expected[9].scale_after == 1024);
    }
    const std::string diff = take(resumed).difference(take(whole));
    CHECK_MESSAGE(diff.empty(), "resumed run differs from the uninterrupted one: " << diff);
    check_same_on_every_rank(resumed);
  }

  TEST_CASE(
      "load of a missing, corrupt or rank-dependent file throws mpopt::error on every rank and changes nothing; "
      "save into a missing directory throws on every rank") {
    using D = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::lamb, test_backend, mpopt::mpi>;
    const int w = world_size();
    const int rank = world_rank();
    CAPTURE(w);
    const shape sh{{1, 7, 301, 4097}, {3, 65}};
    const dataset ds{0x10AD, sh.all(), true};
    const shared_dir dir;
    net<D> a(layout::unfused, sh, 1, mpopt::mpi{MPI_COMM_WORLD});
    net<D> b(layout::unfused, sh, 1, mpopt::mpi{MPI_COMM_WORLD});
    auto run = [&](net<D>& n, int s) {
      n.write(ds.micro_batch(s, rank));
      return n.opt.step();
    };
    for (int s = 0; s < 3; ++s) run(a, s);
    const auto good = dir / "good.safetensors";
    a.opt.save(good);
    const snapshot saved = take(a);
    for (int s = 3; s < 6; ++s) run(a, s);
    const snapshot current = take(a);

    if (rank == 0) {
      std::ifstream in(good, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::ofstream(dir / "truncated.safetensors", std::ios::binary)
          .write(bytes.data(), std::streamsize(bytes.size() / 2));
      std::string flipped = bytes;
      flipped[9] = char(~flipped[9]);  // inside the JSON header
      std::ofstream(dir / "header.safetensors", std::ios::binary)
          .write(flipped.data(), std::streamsize(flipped.size()));
      std::ofstream(dir / "garbage.safetensors", std::ios::binary) << "not a safetensors file";
      std::filesystem::copy_file(good, dir / "rank0.safetensors");
    }
    MPI_Barrier(MPI_COMM_WORLD);

    auto unchanged = [&](const char* what) {
      const std::string diff = take(a).difference(current);
      CHECK_MESSAGE(diff.empty(), what << ": a failed load changed " << diff);
    };
    CHECK_THROWS_AS(a.opt.load(dir / "missing.safetensors"), mpopt::error);
    unchanged("missing");
    for (const char* name : {"truncated.safetensors", "header.safetensors", "garbage.safetensors"}) {
      CAPTURE(name);
      CHECK_THROWS_AS(a.opt.load(dir / name), mpopt::error);
      unchanged(name);
    }
    // Rank-dependent paths: the good file on rank 0, a missing one elsewhere; then the good file on
    // rank 0 and a corrupt one elsewhere. Rank 0 reads a good file, yet must throw and keep its state.
    const auto rank_file = dir / ("rank" + std::to_string(rank) + ".safetensors");
    const auto mixed = rank == 0 ? good : dir / "truncated.safetensors";
    if (w > 1) {
      CHECK_THROWS_AS(a.opt.load(rank_file), mpopt::error);
      unchanged("rank-specific");
      CHECK_THROWS_AS(a.opt.load(mixed), mpopt::error);
      unchanged("corrupt on ranks > 0");
    } else {
      CHECK_NOTHROW(a.opt.load(rank_file));  // one rank: the file exists everywhere
      CHECK(take(a).difference(saved).empty());
    }
    // Only rank 0 writes: a directory that does not exist fails there and on every other rank.
    CHECK_THROWS_AS(a.opt.save(dir / "no_such_dir" / "state.safetensors"), mpopt::error);
    // The collectives are still in step: a good load and one more step on every rank match an
    // optimizer that continued from the same state.
    a.opt.load(good);
    CHECK(take(a).difference(saved).empty());
    for (int s = 0; s < 3; ++s) run(b, s);
    const auto sa = run(a, 3), sb = run(b, 3);
    CHECK(sa.result == mpopt::step_result::applied);
    CHECK(sa.grad_norm == sb.grad_norm);
    const std::string diff = take(a).difference(take(b));
    CHECK_MESSAGE(diff.empty(), "after the failed loads: " << diff);
    check_same_on_every_rank(a);
  }

  TEST_CASE("ranks that load different valid checkpoints throw on every rank, naming what differs, and change nothing") {
    using D = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam, test_backend, mpopt::mpi>;
    const int w = world_size(), rank = world_rank();
    const shape sh{{5, 33}, {7}};
    const dataset ds{0xD1FF, sh.all(), true};
    const shared_dir dir;
    net<D> a(layout::unfused, sh, 1, mpopt::mpi{MPI_COMM_WORLD});
    for (int s = 0; s < 6; ++s) {
      a.write(ds.micro_batch(s, rank));
      a.opt.step();
      if (s == 2) a.opt.save(dir / "early.safetensors");
    }
    a.opt.save(dir / "late.safetensors");
    const snapshot before = take(a);
    const std::string msg = [&]() -> std::string {
      try {
        a.opt.load(dir / (rank == 1 ? "late.safetensors" : "early.safetensors"));
      } catch (const mpopt::error& e) {
        return e.what();
      }
      return "";
    }();
    INFO(msg);
    if (w == 1) {
      CHECK(msg.empty());
      return;
    }
    CHECK(msg.find("the ranks disagree on the checkpoint's step counts (") != std::string::npos);
    CHECK(msg.find("rank 1: 6 applied") != std::string::npos);
    CHECK(msg.find("Every rank must load the same checkpoint") != std::string::npos);
    const std::string diff = take(a).difference(before);
    CHECK_MESSAGE(diff.empty(), "a failed load changed " << diff);
  }

  // ------------------------------------------------------------------------------------------ 6
  TEST_CASE("collectives with mismatched sizes throw mpopt::error on every rank before communicating") {
    const int w = world_size();
    const int rank = world_rank();
    CAPTURE(w);
    mpopt::mpi comm{MPI_COMM_WORLD};
    CHECK(comm.rank() == rank);
    CHECK(comm.size() == w);
    const std::size_t n = 6;
    std::vector<float> in(n * std::size_t(w), 1.0f), out(n * std::size_t(w) + 1, 0.0f);
    const std::span<const float> cin(in);
    // reduce_scatter: in must be W * out.
    CHECK_THROWS_AS(comm.reduce_scatter(cin, std::span<float>(out).first(n + 1), mpopt::reduce_op::sum), mpopt::error);
    CHECK_THROWS_AS(
        comm.reduce_scatter(cin.first(n * std::size_t(w) - 1), std::span<float>(out).first(n), mpopt::reduce_op::sum),
        mpopt::error);
    // all_gather: out must be W * in.
    CHECK_THROWS_AS(comm.all_gather(cin.first(n), std::span<float>(out).first(n * std::size_t(w) + 1)), mpopt::error);
    CHECK_THROWS_AS(comm.all_gather(cin.first(n + 1), std::span<float>(out).first(n * std::size_t(w))), mpopt::error);
    // all_to_all: out must be in, and in must split into W blocks.
    CHECK_THROWS_AS(comm.all_to_all(cin, std::span<float>(out)), mpopt::error);
    if (w > 1)
      CHECK_THROWS_AS(
          comm.all_to_all(cin.first(n * std::size_t(w) - 1), std::span<float>(out).first(n * std::size_t(w) - 1)),
          mpopt::error);
    // broadcast: the root must be a rank.
    CHECK_THROWS_AS(comm.broadcast(std::span<float>(out), w), mpopt::error);
    CHECK_THROWS_AS(comm.broadcast(std::span<float>(out), -1), mpopt::error);
    // The same through the double and byte overloads the optimizer uses.
    std::vector<double> din(std::size_t(w) + 1, 1.0), dout(1);
    CHECK_THROWS_AS(comm.reduce_scatter(std::span<const double>(din), std::span<double>(dout), mpopt::reduce_op::sum),
                    mpopt::error);
    // Nothing was sent: the next collectives match up and compute the right values on every rank.
    std::vector<float> mine(n * std::size_t(w));
    for (std::size_t k = 0; k < mine.size(); ++k) mine[k] = float(rank * 100 + int(k));
    std::vector<float> block(n);
    comm.reduce_scatter(std::span<const float>(mine), std::span<float>(block), mpopt::reduce_op::sum);
    bool ok = true;
    for (std::size_t k = 0; k < n; ++k) {
      float e = 0;
      for (int r = 0; r < w; ++r) e += float(r * 100 + int(std::size_t(rank) * n + k));
      ok &= block[k] == e;
    }
    CHECK(ok);
    std::vector<float> gathered(n * std::size_t(w));
    comm.all_gather(std::span<const float>(block), std::span<float>(gathered));
    std::uint8_t flag = std::uint8_t(rank + 1);
    comm.all_reduce(std::span<std::uint8_t>(&flag, 1), mpopt::reduce_op::max);
    CHECK(flag == std::uint8_t(w));
    comm.barrier();
    // No communicator on MPI_COMM_NULL.
    CHECK_THROWS_AS(mpopt::mpi{MPI_COMM_NULL}, mpopt::error);
  }

  // ------------------------------------------------------------------------------------------ 7
  TEST_CASE("ranks that disagree on policies, options or tensors throw at finalize on every rank, naming what "
            "differs and on which ranks") {
    const int w = world_size();
    const bool odd = world_rank() == 1;  // the rank that differs (with one rank, nothing can)
    using adam_opt = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam, mpopt::host, mpopt::mpi>;
    using lamb_opt = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::lamb, mpopt::host, mpopt::mpi>;
    using stochastic_opt =
        mpopt::optimizer<mpopt::fp16_stochastic, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam, mpopt::host, mpopt::mpi>;
    using bf16_state_opt = mpopt::optimizer<mpopt::with_state<mpopt::fp16, mpopt::bf16_state<>>, mpopt::dynamic_scale,
                                            mpopt::replicated, mpopt::adam, mpopt::host, mpopt::mpi>;
    struct setup {
      mpopt::mpi_options comm = {};
      mpopt::optimizer_options opt = {};
      mpopt::dynamic_scale_options scaler = {};
      double lr = 1e-3;
      std::size_t size = 8, groups = 2;
      std::vector<std::int64_t> shape = {};  // group 0's tensor's
      std::optional<mpopt::lr_schedule> schedule = std::nullopt;
    };
    // What finalize() throws on this rank ("" if nothing); every rank calls it.
    auto finalize = []<class Opt>(const setup& s, Opt*) -> std::string {
      std::deque<std::vector<mpopt::half>> memory;  // stays in place as it grows
      Opt opt{mpopt::mpi{MPI_COMM_WORLD, s.comm}, s.opt, s.scaler};
      for (std::size_t g = 0; g < s.groups; ++g) {
        auto& p = memory.emplace_back(g == 0 ? s.size : 3);
        auto& gr = memory.emplace_back(p.size());
        opt.add_group({.lr = s.lr}).add(p, gr, "t" + std::to_string(g), g == 0 ? mpopt::tensor_shape(s.shape) : mpopt::tensor_shape{});
      }
      if (s.schedule) opt.set_schedule(*s.schedule);
      try {
        opt.finalize();
      } catch (const mpopt::error& e) {
        return e.what();
      }
      return "";
    };
    auto expect = [&](const std::string& msg, std::initializer_list<const char*> needles) {
      INFO(msg);
      if (w == 1) {
        CHECK(msg.empty());
        return;
      }
      CHECK(msg.find("the ranks disagree on ") != std::string::npos);
      for (const char* n : needles) CHECK(msg.find(n) != std::string::npos);
    };
    adam_opt* adam = nullptr;
    CHECK(finalize(setup{}, adam).empty());
    expect(finalize(setup{.lr = odd ? 2e-3 : 1e-3}, adam), {"group 0.lr (", "rank 1: 0.002", ": 0.001"});
    expect(finalize(setup{.opt = {.clip_grad = odd ? 0.5 : 1.0}}, adam), {"clip_grad (", "rank 1: 0.5"});
    expect(finalize(setup{.opt = {.max_consecutive_skips = odd ? 3u : 0u}}, adam), {"max_consecutive_skips (", "rank 1: 3"});
    expect(finalize(setup{.scaler = {.init_scale = odd ? 1024.0 : 2048.0}}, adam),
           {"dynamic_scale.init_scale (", "rank 1: 1024)", "dynamic_scale state.scale ("});
    expect(finalize(setup{.scaler = {.on_min_scale = odd ? mpopt::at_min_scale::keep_skipping : mpopt::at_min_scale::raise}}, adam),
           {"dynamic_scale.on_min_scale (", "rank 1: keep_skipping"});
    expect(finalize(setup{.comm = {.deterministic = odd}}, adam), {"mpi.deterministic (", "rank 1: true"});
    expect(finalize(setup{.opt = {.rounding_seed = odd ? 7u : 0u}}, adam), {"rounding_seed (", "rank 1: 7"});
    expect(finalize(setup{.size = odd ? 9u : 8u}, adam), {"group 0 tensors (", "rank 1: 1 tensors, 9 elements"});
    expect(finalize(setup{.groups = odd ? 3u : 2u}, adam), {"number of groups (", "rank 1: 3"});
    // The same tensors in another shape: rank 0's would be saved, so they must agree too.
    const std::vector<std::int64_t> rows{2, 4}, cols{4, 2};
    CHECK(finalize(setup{.shape = rows}, adam).empty());
    expect(finalize(setup{.shape = odd ? cols : rows}, adam), {"group 0 tensors (", "rank 1: 1 tensors, 8 elements, hash"});
    const mpopt::lr_schedule decay = mpopt::step_decay{.step_size = 5};
    const mpopt::lr_schedule warmup = mpopt::warmup_lr{.warmup_num_steps = odd ? 11 : 10};
    expect(finalize(setup{.schedule = odd ? std::optional(decay) : std::nullopt}, adam),
           {"the learning-rate schedule (", "rank 1: step_decay)", ": none"});
    expect(finalize(setup{.schedule = warmup}, adam), {"the WarmupLR.warmup_num_steps (", "rank 1: 11)", ": 10"});
    // Several at once: each is named.
    expect(finalize(setup{.opt = {.clip_grad = odd ? 0.5 : 1.0}, .lr = odd ? 2e-3 : 1e-3}, adam), {"clip_grad (", "group 0.lr ("});
    // Another update rule on one rank: the policies differ.
    lamb_opt* lamb = nullptr;
    std::string msg;
    if (odd) msg = finalize(setup{}, lamb);
    else msg = finalize(setup{}, adam);
    expect(msg, {"policies (", "rank 1: fp16 dynamic_scale replicated lamb"});
    // Another rounding on one rank: named on its own (the policies' line is cut short in messages).
    stochastic_opt* stochastic = nullptr;
    if (odd) msg = finalize(setup{}, stochastic);
    else msg = finalize(setup{}, adam);
    expect(msg, {"rounding (", "rank 1: stochastic", ": nearest"});
    // Another state precision on one rank: the policies differ, naming it.
    bf16_state_opt* compact = nullptr;
    if (odd) msg = finalize(setup{}, compact);
    else msg = finalize(setup{}, adam);
    expect(msg, {"policies (", "rank 1: fp16 (state bf16, master fp32) dynamic_scale"});
    // Afterwards the ranks agree again and train.
    CHECK(finalize(setup{}, adam).empty());
  }

  TEST_CASE("after the first step set_schedule is collective: ranks that set different schedules throw on every "
            "rank and keep the last") {
    const int w = world_size();
    const bool odd = world_rank() == 1;
    mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::adam, mpopt::host, mpopt::mpi> opt{
        mpopt::mpi{MPI_COMM_WORLD}};
    std::vector<float> p(16, 0.5f), g(16, 0.01f);
    opt.add_group({.lr = 1e-2}).add(p, g, "w");
    CHECK(opt.step().applied);
    const mpopt::lr_schedule same = mpopt::step_decay{.step_size = 2};
    opt.set_schedule(same);
    std::string msg;
    try {
      opt.set_schedule(mpopt::step_decay{.step_size = odd ? 3 : 2});
    } catch (const mpopt::error& e) {
      msg = e.what();
    }
    INFO(msg);
    if (w == 1) {
      CHECK(msg.empty());
    } else {
      CHECK(msg.find("the ranks disagree on the step_decay.step_size (") != std::string::npos);
      CHECK(msg.find("rank 1: 3)") != std::string::npos);
      CHECK(msg.find("Every rank must set the same schedule") != std::string::npos);
      CHECK(mpopt::detail::schedule_settings(opt.schedule()) == mpopt::detail::schedule_settings(same));
    }
    try {  // clearing is collective too
      if (odd) opt.clear_schedule();
      else opt.set_schedule(same);
    } catch (const mpopt::error& e) {
      msg = e.what();
    }
    if (w > 1) CHECK(msg.find(": none") != std::string::npos);
    for (std::uint64_t k = 1; k < 5; ++k) {  // the ranks still step together, on the schedule they agreed
      CHECK(opt.step().applied);
      CHECK(opt.group(0).lr() == mpopt::scheduled_rate(same, k, 1e-2));
    }
  }

}
