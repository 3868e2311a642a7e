// The loss-spike guard (optimizer_options::spike_guard, llm.c's outlier detector) over MPI, against a
// float64 reference of its z-scores written here from llm.c's definition: each boundary's loss (the
// mean over its micro-steps and ranks) and gradient norm join a window of the last n finite values,
// and the newest scores (x - mean) / std over the window that holds it. A step whose loss, then whose
// norm, scores above its z is skipped: every rank reports the same verdict and scores, the state
// stays bit-identical, the loss scaler sees no step, and the run ends bit for bit where an unguarded
// run that never took those steps ends. Also: a window not yet full skips nothing; a non-finite
// gradient skips as before and its norm stays out of the window; a non-finite norm is held once the
// window is full; the windows resume from a checkpoint; bad options and a missing loss are refused.
#include <doctest/doctest.h>

#include "error_of.hpp"
#include "mpi_harness.hpp"

namespace {

constexpr int guard_window = 16;
constexpr double guard_z = 3;

/// The reference score of the newest of `history` (oldest first, finite values only): NaN until n
/// values; population standard deviation; 0 when it is 0.
double reference_z(const std::vector<double>& history, std::size_t n) {
  if (history.size() < n) return NAN;
  const std::vector<double> w(history.end() - std::ptrdiff_t(n), history.end());
  double mean = 0;
  for (double x : w) mean += x;
  mean /= double(n);
  double var = 0;
  for (double x : w) var += (x - mean) * (x - mean);
  var /= double(n);
  return var == 0 ? 0.0 : (w.back() - mean) / std::sqrt(var);
}

/// The score a value gets: its z, or +inf for a non-finite value once the window is full.
double reference_score(std::vector<double>& history, double x, std::size_t n) {
  if (!std::isfinite(x)) return history.size() >= n ? INFINITY : NAN;
  history.push_back(x);
  return reference_z(history, n);
}

bool same_score(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::fabs(a - b) <= 1e-9 * (1 + std::fabs(b));
}

// The plan of a run: spikes before the windows fill (skip nothing), then a loss spike, a norm
// spike, a NaN gradient, both spikes at once (the loss is named), and a spike right after resume.
// Each spike leaves its window before the next of its kind (two in one window would score lower).
constexpr int early_norm_spike = 3, early_loss_spike = 5, loss_spike = 24, norm_spike = 28, nan_step = 31,
              both_spikes = 42, total_steps = 45, resume_at = 26;

/// Rank r's loss of micro-step a at step s: smooth, plus a spike on the last rank.
double loss_of(int s, int r, int a) {
  const int w = world_size();
  const bool spike = s == early_loss_spike || s == loss_spike || s == both_spikes;
  return 2.0 + 0.25 * std::sin(1.7 * s + 0.9 * r + 0.3 * a) + (spike && r == w - 1 && a == 0 ? 40.0 * w : 0.0);
}

/// One boundary of A micro-steps on this rank, with the plan's faults.
template <class D>
mpopt::step_status guarded_boundary(net<D>& n, const dataset& ds, int s, int a_steps) {
  using G = typename D::grad_type;
  const int r = world_rank();
  mpopt::step_status st;
  for (int a = 0; a < a_steps; ++a) {
    n.write(ds.micro_batch(s, r * a_steps + a));
    if ((s == early_norm_spike || s == norm_spike || s == both_spikes) && r == 0 && a == 0)
      for (auto& g : n.grads)
        for (auto& x : g) x = G(float(x) * 1024.0f);  // exact: a power of two
    if (s == nan_step && r == world_size() - 1 && a + 1 == a_steps) n.grads[3][5] = G(NAN);
    n.report_ready();
    st = n.opt.step(loss_of(s, r, a));
  }
  return st;
}

/// The reference mean loss of step s over micro-steps and ranks.
double reference_loss(int s, int a_steps) {
  double sum = 0;
  for (int r = 0; r < world_size(); ++r)
    for (int a = 0; a < a_steps; ++a) sum += loss_of(s, r, a);
  return sum / double(a_steps * world_size());
}

mpopt::optimizer_options guarded(int a_steps, int window = guard_window) {
  mpopt::optimizer_options o;
  o.accumulation_steps = a_steps;
  o.spike_guard = {.window = window, .loss_z = guard_z, .norm_z = guard_z};
  return o;
}

#define GUARD_CFGS                                                               \
  cfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::unfused>,             \
      cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::lamb, layout::flat, mpopt::zero2>, \
      cfg<mpopt::bf16, mpopt::no_scaling, mpopt::adam, layout::flat, mpopt::zero1>

TEST_SUITE("mpi_spike_guard") {
  TEST_CASE_TEMPLATE(
      "spikes are skipped on every rank by the reference's scores, changing nothing; the run ends where an "
      "unguarded run without those steps ends; the windows resume from a checkpoint",
      C, GUARD_CFGS) {
    using D = typename C::dist;
    const int w = world_size();
    const std::string what = C::describe();
    CAPTURE(what);
    CAPTURE(w);
    const shape sh = random_shape(0x5B1CE + w);
    const dataset ds{0x5B1CE, sh.all(), true};
    const auto so = C::scaler_options(1000);
    const shared_dir dir;
    const auto path = dir / "guarded.safetensors";
    for (const int a_steps : {1, 2}) {
      CAPTURE(a_steps);
      net<D> g(C::lay, sh, 7, mpopt::mpi{MPI_COMM_WORLD}, guarded(a_steps), so);
      mpopt::optimizer_options plain_options;
      plain_options.accumulation_steps = a_steps;
      net<D> plain(C::lay, sh, 7, mpopt::mpi{MPI_COMM_WORLD}, plain_options, so);
      std::vector<double> losses, norms;
      std::vector<mpopt::step_status> statuses;
      std::uint64_t skipped = 0;
      for (int s = 0; s < total_steps; ++s) {
        CAPTURE(s);
        if (s == resume_at) g.opt.save(path);
        const snapshot before = take(g);
        const auto scaler_before = g.opt.scaler().save();
        const mpopt::step_status st = guarded_boundary(g, ds, s, a_steps);
        statuses.push_back(st);
        check_status_same_on_every_rank(st);  // the scores too

        const double loss_z = reference_score(losses, reference_loss(s, a_steps), guard_window);
        const double norm_z = st.result == mpopt::step_result::skipped_nonfinite
                                  ? NAN  // its norm stays out of the window
                                  : reference_score(norms, st.grad_norm, guard_window);
        CHECK_MESSAGE(same_score(st.loss_z, loss_z), "loss_z " << st.loss_z << ", reference " << loss_z);
        if (st.result != mpopt::step_result::skipped_nonfinite)
          CHECK_MESSAGE(same_score(st.norm_z, norm_z), "norm_z " << st.norm_z << ", reference " << norm_z);
        mpopt::step_result expected = mpopt::step_result::applied;
        if (s == nan_step) expected = mpopt::step_result::skipped_nonfinite;
        else if (loss_z > guard_z) expected = mpopt::step_result::skipped_loss_spike;
        else if (norm_z > guard_z) expected = mpopt::step_result::skipped_norm_spike;
        CHECK(st.result == expected);
        // The plan's spikes are the ones the reference finds: the test is not vacuous.
        if (s == loss_spike || s == both_spikes) CHECK(expected == mpopt::step_result::skipped_loss_spike);
        if (s == norm_spike) CHECK(expected == mpopt::step_result::skipped_norm_spike);
        if (s < guard_window) CHECK(st.applied == (s != nan_step));

        if (st.skipped()) {
          ++skipped;
          const std::string diff = take(g).difference_except_scale(before);
          CHECK_MESSAGE(diff.empty(), "the skipped step changed " << diff);
        }
        if (st.result == mpopt::step_result::skipped_loss_spike || st.result == mpopt::step_result::skipped_norm_spike) {
          CHECK(g.opt.scaler().save() == scaler_before);  // the scaler saw no step
          CHECK(st.scale_after == st.scale_before);
        } else {
          const mpopt::step_status sp = guarded_boundary(plain, ds, s, a_steps);
          CHECK(sp.result == st.result);
          CHECK(std::bit_cast<std::uint64_t>(sp.grad_norm) == std::bit_cast<std::uint64_t>(st.grad_norm));
        }
        CHECK(st.skipped_steps == skipped);
      }
      CHECK(skipped == 4);  // loss, norm, NaN, both
      const std::string diff = take(g).difference(take(plain));
      CHECK_MESSAGE(diff.empty(), "the guarded run does not end where the unguarded one without its spikes does: " << diff);
      check_same_on_every_rank(g);

      // Resume at resume_at: the same verdicts, scores and bits as the uninterrupted run.
      MPI_Barrier(MPI_COMM_WORLD);
      net<D> resumed(C::lay, sh, 99, mpopt::mpi{MPI_COMM_WORLD}, guarded(a_steps), so);
      resumed.opt.load(path);
      for (int s = resume_at; s < total_steps; ++s) {
        CAPTURE(s);
        const mpopt::step_status st = guarded_boundary(resumed, ds, s, a_steps);
        const mpopt::step_status& e = statuses[std::size_t(s)];
        CHECK(st.result == e.result);
        CHECK(std::bit_cast<std::uint64_t>(st.loss_z) == std::bit_cast<std::uint64_t>(e.loss_z));
        CHECK(std::bit_cast<std::uint64_t>(st.norm_z) == std::bit_cast<std::uint64_t>(e.norm_z));
        CHECK(st.skipped_steps == e.skipped_steps);
      }
      const std::string resumed_diff = take(resumed).difference(take(g));
      CHECK_MESSAGE(resumed_diff.empty(), "the resumed run ends elsewhere: " << resumed_diff);
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }

  TEST_CASE("without a loss scaler, clipping or skipping, the norm test still holds a non-finite norm") {
    using D = cfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::flat>::dist;
    const int w = world_size();
    const shape sh = random_shape(0x0DD + w);
    const dataset ds{0x0DD, sh.all(), true};
    mpopt::optimizer_options o{.clip_grad = 0, .skip_nonfinite = false};
    o.spike_guard = {.window = 8, .norm_z = 2};
    net<D> n(layout::flat, sh, 3, mpopt::mpi{MPI_COMM_WORLD}, o);
    for (int s = 0; s < 10; ++s) {
      CAPTURE(s);
      n.write(ds.micro_batch(s, world_rank()));
      const bool poisoned = s == 9;
      if (poisoned && world_rank() == 0) n.grads[0][0] = NAN;
      const snapshot before = take(n);
      const mpopt::step_status st = n.opt.step();
      check_status_same_on_every_rank(st);
      if (!poisoned) {
        CHECK(st.result == mpopt::step_result::applied);
        continue;
      }
      CHECK(st.result == mpopt::step_result::skipped_norm_spike);
      CHECK(std::isinf(st.norm_z));
      const std::string diff = take(n).difference(before);
      CHECK_MESSAGE(diff.empty(), "the held step changed " << diff);
    }
  }

  TEST_CASE("bad guard options are refused naming the field; a guarded loss needs step(loss)") {
    using L = cfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::flat>::local;
    auto refused = [](mpopt::spike_guard_options g) {
      mpopt::optimizer_options o;
      o.spike_guard = g;
      return error_of([&] { L opt(o); });
    };
    CHECK(refused({.window = 1}).find("spike_guard.window must be in [2, 65536]") != std::string::npos);
    CHECK(refused({.window = 65537}).find("spike_guard.window") != std::string::npos);
    CHECK(refused({.loss_z = -1}).find("spike_guard.loss_z must be >= 0") != std::string::npos);
    CHECK(refused({.norm_z = NAN}).find("spike_guard.norm_z must be a finite number") != std::string::npos);
    // Of 10 values the newest scores at most 3: a z of 3 could never skip.
    CHECK(refused({.window = 10, .norm_z = 3}).find("spike_guard.norm_z = 3 never skips") != std::string::npos);
    CHECK(refused({.window = 10, .norm_z = 2.99}) == "<no exception>");

    const shape sh = random_shape(0x1055);
    const dataset ds{0x1055, sh.all(), true};
    mpopt::optimizer_options o;
    o.spike_guard = {.window = 4, .loss_z = 1.5};
    net<L> n(layout::flat, sh, 5, o);
    n.write(ds.micro_batch(0, 0));
    const snapshot before = take(n);
    CHECK(error_of([&] { n.opt.step(); }).find("spike_guard.loss_z = 1.5 needs the loss: call step(loss)") !=
          std::string::npos);
    CHECK(take(n).difference(before).empty());
    CHECK(n.opt.step(1.0).result == mpopt::step_result::applied);
  }

  TEST_CASE("a checkpoint's windows load into a shorter window (its newest values) and are checked") {
    using L = cfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::flat>::local;
    const shape sh = random_shape(0x5407);
    const dataset ds{0x5407, sh.all(), true};
    const shared_dir dir;
    const auto path = dir / ("short_" + std::to_string(world_rank()) + ".safetensors");
    mpopt::optimizer_options wide, narrow;
    wide.spike_guard = {.window = 8, .loss_z = 2};
    narrow.spike_guard = {.window = 4, .loss_z = 1.5};
    net<L> a(layout::flat, sh, 5, wide);
    std::vector<double> losses;
    for (int s = 0; s < 9; ++s) {
      a.write(ds.micro_batch(s, 0));
      losses.push_back(1.0 + 0.125 * s);  // rising evenly: the newest of 8 scores 1.53
      CHECK(a.opt.step(losses.back()).applied);
    }
    a.opt.save(path);
    net<L> b(layout::flat, sh, 6, narrow);
    b.opt.load(path);
    b.write(ds.micro_batch(9, 0));
    losses.push_back(100);
    const mpopt::step_status st = b.opt.step(losses.back());
    CHECK(same_score(st.loss_z, reference_z(losses, 4)));
    CHECK(st.result == mpopt::step_result::skipped_loss_spike);
  }
}

}  // namespace
