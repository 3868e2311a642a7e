// Communication overlapped with backward (optimizer_options::overlap_comm) over MPI: grad_ready
// starts each completed bucket's reduction and returns, step() waits for what is still running and
// returns with the parameters updated; under zero1/zero2 with leave_param_gather_in_flight their
// all-gather is left in flight until wait_params, and a step begun before every tensor was waited
// for is refused. Against the same run without overlap: the same bits, step by step and tensor by
// tensor, under every partition, with and without accumulation, with one to three buckets in
// flight; with a communicator that counts what is in flight, so that the overlap is shown to
// happen; and with collectives that fail in flight, on every rank.
#include <doctest/doctest.h>

#include "blocking_communicator.hpp"
#include "error_of.hpp"
#include "mpi_harness.hpp"

namespace {

/// mpopt::mpi, counting its collectives in flight. test() says a collective is still running until
/// it is waited for (as MPI may), so that what overlaps is the same on every run. The n-th reduce-scatter or
/// all-gather started can fail, on every rank, once it has completed (as a broken network would be
/// seen by all).
struct tracking_mpi : mpopt::mpi {
  using mpopt::mpi::mpi;
  static constexpr std::string_view name = "tracking_mpi";
  int running = 0, most_running = 0, reduces = 0, gathers = 0;
  int fail_reduce_at = -1, fail_gather_at = -1;

  class request {
   public:
    request() = default;
    request(mpopt::mpi::request r, tracking_mpi* owner, bool fails)
        : inner_(std::move(r)), owner_(owner), fails_(fails) {}
    request(request&& o) noexcept
        : inner_(std::move(o.inner_)), owner_(std::exchange(o.owner_, nullptr)), fails_(o.fails_) {}
    request& operator=(request&& o) noexcept {
      inner_ = std::move(o.inner_);
      owner_ = std::exchange(o.owner_, nullptr);
      fails_ = o.fails_;
      return *this;
    }
    bool test() {
      if (!owner_) return true;  // complete (or default-constructed)
      (void)inner_.test();  // moves it along
      return false;
    }
    void wait() {
      inner_.wait();
      done();
      if (std::exchange(fails_, false)) throw mpopt::error("tracking_mpi: a collective failed in flight");
    }

   private:
    void done() {
      if (owner_) std::exchange(owner_, nullptr)->running--;
    }
    mpopt::mpi::request inner_;
    tracking_mpi* owner_ = nullptr;
    bool fails_ = false;
  };

  template <class T>
  request start_all_reduce(std::span<T> data, mpopt::reduce_op op) {
    return track(mpopt::mpi::start_all_reduce(data, op), false);
  }
  template <class T>
  request start_reduce_scatter(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts,
                               mpopt::reduce_op op) {
    return track(mpopt::mpi::start_reduce_scatter(in, out, counts, op), reduces++ == fail_reduce_at);
  }
  template <class T>
  request start_all_gather(std::span<T> data, std::span<const std::size_t> counts) {
    return track(mpopt::mpi::start_all_gather(data, counts), gathers++ == fail_gather_at);
  }

 private:
  request track(mpopt::mpi::request r, bool fails) {
    most_running = std::max(most_running, ++running);
    return {std::move(r), this, fails};
  }
};
static_assert(mpopt::nonblocking_communicator<tracking_mpi>);

template <class C>
using overlapped = mpopt::optimizer<typename C::precision, typename C::scaler, typename C::partition, typename C::rule,
                                    test_backend, tracking_mpi>;

/// Small buckets (many per step), tensors several buckets wide; deterministic sums, so that the
/// nonblocking collectives' algorithms cannot differ from the blocking ones' at any world size.
/// `leave`: leave_param_gather_in_flight.
mpopt::optimizer_options overlap_options(bool overlap, int in_flight, int accumulation, bool leave = false) {
  return {.accumulation_steps = accumulation, .bucket_elements = 3000, .overlap_comm = overlap,
          .buckets_in_flight = in_flight, .leave_param_gather_in_flight = leave};
}
tracking_mpi world() { return tracking_mpi{MPI_COMM_WORLD, mpopt::mpi_options{.deterministic = true}}; }

// Each precision, rule and layout under every partition; the device build runs each once, a partition
// each (tests/README.md, "The device build").
template <class Z>
using overlap_fp16 = cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::unfused, Z>;
template <class Z>
using overlap_bf16 = cfg<mpopt::bf16, mpopt::no_scaling, mpopt::lamb, layout::flat, Z>;
template <class Z>
using overlap_fp32 = cfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::flat, Z>;

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE_TEMPLATE("overlap_comm gives the same bits as without, step by step and tensor by tensor, with "
                     "collectives left in flight across grad_ready and step, and the parameters' gathers with "
                     "leave_param_gather_in_flight",
                     C, overlap_fp16<mpopt::zero2>, overlap_bf16<mpopt::zero1>, overlap_fp32<mpopt::replicated>,
                     overlap_bf16<mpopt::zero2>, overlap_fp32<mpopt::zero2>, overlap_fp16<mpopt::zero1>,
                     overlap_fp32<mpopt::zero1>, overlap_fp16<mpopt::replicated>, overlap_bf16<mpopt::replicated>) {
    using D = overlapped<C>;
    constexpr bool sharded = !std::is_same_v<typename C::partition, mpopt::replicated>;
    const int w = world_size(), rank = world_rank();
    const std::string what = C::describe();
    CAPTURE(what);
    CAPTURE(w);
    for (const auto& [in_flight, accumulation] : {std::pair{2, 1}, std::pair{1, 3}, std::pair{3, 2}}) {
      CAPTURE(in_flight);
      CAPTURE(accumulation);
      const shape sh = random_shape(0x0C + std::uint64_t(w) * 16 + std::uint64_t(in_flight));
      const dataset ds{0x0C, sh.all(), true};
      const auto so = C::scaler_options(2);
      net<D> on(C::lay, sh, 3, world(), overlap_options(true, in_flight, accumulation, true), so);
      net<D> ready(C::lay, sh, 3, world(), overlap_options(true, in_flight, accumulation), so);
      net<D> off(C::lay, sh, 3, world(), overlap_options(false, in_flight, accumulation), so);
      for (int s = 0; s < 4; ++s) {
        CAPTURE(s);
        const auto st_on = run_boundary(on, ds, s, accumulation, rank);
        const auto st_ready = run_boundary(ready, ds, s, accumulation, rank);
        const auto st_off = run_boundary(off, ds, s, accumulation, rank);
        CHECK(st_on.result == st_off.result);
        CHECK(st_on.grad_norm == st_off.grad_norm);
        CHECK(st_on.comm_bytes == st_off.comm_bytes);
        CHECK(st_ready.comm_bytes == st_off.comm_bytes);
        // By default step() returns with nothing in flight and every tensor the other run's.
        CHECK(ready.opt.communicator().running == 0);
        std::size_t stale = 0;
        for (std::size_t i = 0; i < ready.params.size(); ++i)
          stale += std::memcmp(ready.params[i].data(), off.params[i].data(), ready.params[i].size_bytes()) != 0;
        CHECK_MESSAGE(stale == 0, stale << " tensors differ when step() returned");
        const std::string ready_diff = take(ready).difference(take(off));
        CHECK_MESSAGE(ready_diff.empty(), "overlap_comm differs from a run without: " << ready_diff);
        auto& comm = on.opt.communicator();
        // Nothing but the gathers may still run: those of the last buckets, which the forward reads last.
        if (sharded && st_on.applied) CHECK(comm.running > 0);
        if (!sharded) CHECK(comm.running == 0);
        // The forward waits for each tensor as it reaches it: then that tensor is the other run's.
        std::size_t differ = 0;
        for (std::size_t i = 0; i < on.params.size(); ++i) {
          on.opt.wait_params(i);
          differ += std::memcmp(on.params[i].data(), off.params[i].data(), on.params[i].size_bytes()) != 0;
        }
        CHECK_MESSAGE(differ == 0, differ << " tensors differ after wait_params(i)");
        if (s % 2) on.opt.wait_params();  // each tensor was waited for: nothing needs waiting
        else CHECK(comm.running <= in_flight);
        on.opt.wait_params();
        CHECK(comm.running == 0);
        const std::string diff = take(on).difference(take(off));
        CHECK_MESSAGE(diff.empty(), "overlap_comm differs from a run without: " << diff);
      }
      // As many collectives ran at once as there are slots (replicated on one rank sends nothing).
      if (sharded || w > 1) CHECK(on.opt.communicator().most_running == in_flight);
      check_same_on_every_rank(on);
    }
  }

  TEST_CASE_TEMPLATE("overlap_comm: buckets start in grad_ready, before step(), and a tensor's gradient is free once "
                     "its buckets went out", P, mpopt::zero2, mpopt::zero1, mpopt::replicated) {
    using D = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, P, mpopt::adam, test_backend, tracking_mpi>;
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    const shape sh{{5000, 1, 7001}, {3, 9000}};
    const dataset ds{0x5EE, sh.all(), true};
    net<D> n(layout::unfused, sh, 1, world(), overlap_options(true, 2, 2, !std::is_same_v<P, mpopt::replicated>));
    auto& comm = n.opt.communicator();
    for (int a = 0; a < 2; ++a) {
      n.write(ds.micro_batch(0, rank * 2 + a));
      const int before = comm.reduces;
      for (std::size_t i = n.grads.size(); i-- > 0;) {
        n.opt.grad_ready(i);
        // The last tensor's buckets are complete as soon as it is reported.
        if (i + 1 == n.grads.size()) {
          const bool starts = std::is_same_v<P, mpopt::zero2> || (std::is_same_v<P, mpopt::zero1> && a == 1);
          CHECK((comm.reduces > before) == starts);
          CHECK(n.opt.grad_consumed(i) == starts);
        }
      }
      CHECK(n.opt.step().micro_step == (a == 0 ? 1 : 0));
    }
    CHECK_THROWS_AS(n.opt.wait_params(n.params.size()), mpopt::error);  // no such tensor
    // Destroyed with its gathers in flight, the optimizer waits for them before its memory goes.
  }

  TEST_CASE_TEMPLATE("a collective failing in flight throws on every rank: a reduction leaves the state as it was, a "
                     "gather leaves the step for finish_step(); the run then equals one that never failed",
                     P, mpopt::zero2, mpopt::zero1) {
    using D = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, P, mpopt::adam, test_backend, tracking_mpi>;
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    const shape sh = random_shape(0xFA11 + w);
    const dataset ds{0xFA11, sh.all(), true};
    const auto so = mpopt::dynamic_scale_options{.init_scale = 1024};
    net<D> n(layout::unfused, sh, 2, world(), overlap_options(true, 2, 1, true), so);
    net<D> clean(layout::unfused, sh, 2, world(), overlap_options(true, 2, 1), so);
    auto step = [&](net<D>& x, int s) { return run_boundary(x, ds, s, 1, rank); };
    CHECK(step(n, 0).applied);
    CHECK(step(clean, 0).applied);
    n.opt.wait_params();

    // A reduce-scatter fails in flight: the step throws, everywhere, and nothing changed.
    const snapshot before = take(n);
    auto& comm = n.opt.communicator();
    comm.fail_reduce_at = comm.reduces + 1;
    std::string message;
    try {
      step(n, 1);
    } catch (const mpopt::error& e) {
      message = e.what();
    }
    CHECK_MESSAGE(message.find("failed in flight") != std::string::npos, message);
    CHECK(comm.running == 0);
    CHECK(take(n).difference(before).empty());
    const int gathers = comm.gathers;
    CHECK(step(n, 1).applied);  // the window again
    CHECK(step(clean, 1).applied);
    const int buckets = comm.gathers - gathers;
    CHECK(buckets > 2);
    n.opt.wait_params();

    // The last bucket's all-gather fails in flight: the step is committed; wait_params() throws,
    // finish_step() completes it.
    comm.fail_gather_at = comm.gathers + buckets - 1;
    CHECK(step(n, 2).applied);
    CHECK(step(clean, 2).applied);
    message.clear();
    try {
      n.opt.wait_params();
    } catch (const mpopt::error& e) {
      message = e.what();
    }
    CHECK_MESSAGE(message.find("committed on every rank but unfinished") != std::string::npos, message);
    CHECK_MESSAGE(message.find("failed in flight") != std::string::npos, message);
    n.opt.finish_step();
    clean.opt.wait_params();
    CHECK(comm.running == 0);
    std::string diff = take(n).difference(take(clean));
    CHECK_MESSAGE(diff.empty(), "finish_step() differs from a step that never failed: " << diff);

    // Once more, not waited for: the next step() refuses to begin (its forward read old values),
    // waiting throws the failure, and finish_step() gathers again; the run goes on.
    comm.fail_gather_at = comm.gathers + buckets - 1;
    CHECK(step(n, 3).applied);
    CHECK(step(clean, 3).applied);
    CHECK_THROWS_WITH_AS(step(n, 4), doctest::Contains("was not waited for"), mpopt::error);
    CHECK_THROWS_WITH_AS(n.opt.wait_params(), doctest::Contains("failed in flight"), mpopt::error);
    n.opt.finish_step();
    for (int s = 4; s < 6; ++s) {
      CAPTURE(s);
      CHECK(step(n, s).applied);
      CHECK(step(clean, s).applied);
      n.opt.wait_params();
    }
    diff = take(n).difference(take(clean));
    CHECK_MESSAGE(diff.empty(), "a run with failed collectives in flight differs from a clean one: " << diff);
    check_same_on_every_rank(n);

    // By default step() waits for the gathers itself: one failing throws from step(), with the step
    // committed, and the next step() finishes it first.
    net<D> m(layout::unfused, sh, 2, world(), overlap_options(true, 2, 1), so);
    net<D> m_clean(layout::unfused, sh, 2, world(), overlap_options(true, 2, 1), so);
    auto& m_comm = m.opt.communicator();
    CHECK(step(m, 0).applied);
    CHECK(step(m_clean, 0).applied);
    m_comm.fail_gather_at = m_comm.gathers + buckets - 1;
    CHECK_THROWS_WITH_AS(step(m, 1), doctest::Contains("committed on every rank but unfinished"), mpopt::error);
    CHECK(step(m_clean, 1).applied);
    for (int s = 2; s < 4; ++s) {
      CHECK(step(m, s).applied);
      CHECK(step(m_clean, s).applied);
    }
    CHECK(m_comm.running == 0);
    diff = take(m).difference(take(m_clean));
    CHECK_MESSAGE(diff.empty(), "a step whose gather failed, finished by the next, differs from a clean one: " << diff);
  }

  TEST_CASE_TEMPLATE("leave_param_gather_in_flight: grad_ready(), step() and save() refuse to begin a step before "
                     "every tensor was waited for, naming one, and change nothing", P, mpopt::zero2, mpopt::zero1) {
    using D = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, P, mpopt::adam, test_backend, tracking_mpi>;
    const int w = world_size(), rank = world_rank();
    CAPTURE(w);
    const shape sh = random_shape(0x3A17 + w);
    const dataset ds{0x3A17, sh.all(), true};
    const auto so = mpopt::dynamic_scale_options{.init_scale = 1024};
    net<D> n(layout::unfused, sh, 2, world(), overlap_options(true, 2, 1, true), so);
    net<D> ready(layout::unfused, sh, 2, world(), overlap_options(true, 2, 1), so);
    CHECK(run_boundary(n, ds, 0, 1, rank).applied);
    CHECK(run_boundary(ready, ds, 0, 1, rank).applied);
    const std::size_t last = n.params.size() - 1;  // every tensor but the last waited for
    for (std::size_t i = 0; i < last; ++i) n.opt.wait_params(i);
    const std::string named = "' (" + std::to_string(last) + ") was not waited for";
    auto refused = [&](const char* call, auto&& f) {
      const std::string message = error_of(f);
      CHECK_MESSAGE(message.starts_with("mpopt: " + std::string(call) + ": tensor '"), message);
      CHECK_MESSAGE(message.find(named) != std::string::npos, message);
    };
    n.write(ds.micro_batch(1, rank));
    refused("grad_ready()", [&] { n.opt.grad_ready(last); });
    refused("step()", [&] { n.opt.step(); });
    const shared_dir dir;
    const auto file = dir / "unwaited.safetensors";
    refused("save()", [&] { n.opt.save(file); });
    CHECK_FALSE(std::filesystem::exists(file));
    // Once waited for, the run goes on as one that was never refused.
    n.opt.wait_params(last);
    for (int s = 1; s < 3; ++s) {
      CHECK(run_boundary(n, ds, s, 1, rank).applied);
      CHECK(run_boundary(ready, ds, s, 1, rank).applied);
      n.opt.wait_params();
    }
    const std::string diff = take(n).difference(take(ready));
    CHECK_MESSAGE(diff.empty(), "a refused step changed something: " << diff);
  }

  TEST_CASE("overlap_comm needs a communicator with nonblocking collectives, leave_param_gather_in_flight needs "
            "overlap_comm; buckets_in_flight is checked") {
    using B = mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::zero2, mpopt::adam, mpopt::host, blocking_communicator>;
    using M = mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::zero2, mpopt::adam, mpopt::host, mpopt::mpi>;
    std::string message;
    try {
      B b(mpopt::optimizer_options{.overlap_comm = true});
    } catch (const mpopt::error& e) {
      message = e.what();
    }
    CHECK_MESSAGE(message.find("overlap_comm needs a communicator with nonblocking collectives") != std::string::npos,
                  message);
    B fine(mpopt::optimizer_options{.overlap_comm = false});
    CHECK_THROWS_WITH_AS(M(mpopt::mpi{MPI_COMM_WORLD}, mpopt::optimizer_options{.leave_param_gather_in_flight = true}),
                         doctest::Contains("leave_param_gather_in_flight needs overlap_comm"), mpopt::error);
    for (int bad : {0, -1, 65})
      CHECK_THROWS_WITH_AS(M(mpopt::mpi{MPI_COMM_WORLD}, mpopt::optimizer_options{.overlap_comm = true,
                                                                                 .buckets_in_flight = bad}),
                           doctest::Contains("buckets_in_flight must be in [1, 64]"), mpopt::error);
  }
}
