// memory_report(): the report lists what the optimizer really allocates. A replacement operator new keeps
// the live heap bytes, and what finalize() adds must equal the report's state and bookkeeping.
#include <doctest/doctest.h>

#include <mpopt/mpopt.hpp>

#include <vector>

#include "counting_new.hpp"

namespace {


std::size_t bytes_of(const mpopt::memory_report& r, const std::string& name) {
  for (const auto& b : r.buffers)
    if (b.name == name) return b.bytes;
  return 0;
}

/// The report's owned bytes that finalize() creates: everything but the flat groups' buffers.
std::size_t finalize_bytes(const mpopt::memory_report& r) {
  std::size_t n = r.owned_bytes();
  for (const auto& b : r.buffers)
    if (b.name.starts_with("group ")) n -= b.bytes;
  return n;
}

template <class Opt>
void check_report_matches_allocations(Opt& opt, std::size_t user_elements) {
  using P = typename Opt::param_type;
  using G = typename Opt::grad_type;
  const auto before = opt.memory_report();
  CHECK(before.user_bytes() == user_elements * (sizeof(P) + sizeof(G)));
  const long long added = live_bytes_added_by([&] { opt.finalize(); });
  const auto after = opt.memory_report();
  CHECK(added > 0);
  CHECK(static_cast<std::size_t>(added) == finalize_bytes(after));
  // The fp32 state: three (or two, for fp32) buffers of at least every element.
  std::size_t elements = 0;
  for (std::size_t t = 0; t < opt.tensor_count(); ++t) elements += opt.master(t).size();
  CHECK(bytes_of(after, "exp_avg") >= elements * sizeof(float));
  CHECK(bytes_of(after, "exp_avg") == bytes_of(after, "exp_avg_sq"));
  CHECK(bytes_of(after, "master") == (std::is_same_v<P, float> ? 0 : bytes_of(after, "exp_avg")));
  // Steps allocate nothing more, so the report stays true.
  const long long stepped = live_bytes_added_by([&] {
    for (int i = 0; i < 3; ++i) opt.step();
  });
  CHECK(stepped == 0);
  CHECK(opt.memory_report().owned_bytes() == after.owned_bytes());
  MESSAGE("\n" << after.to_string());
}

}  // namespace

TEST_SUITE("memory") {
  TEST_CASE("fp16 Adam on user tensors: finalize allocates exactly the reported master, moments and work list") {
    mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam> opt;
    std::vector<mpopt::half> w(100003), gw(100003), b(17), gb(17);
    opt.add_group({}).add(w, gw, "w");
    opt.add_group({}).add(b, gb, "b");
    check_report_matches_allocations(opt, 100003 + 17);
  }

  TEST_CASE("bf16 LAMB in a flat group with accumulation: the accumulator is reported too") {
    mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::lamb> opt{{.accumulation_steps = 2}};
    auto& g = opt.add_flat_group({}, {{"a", 70000}, {"b", 3}, {"c", 129}});
    const auto r = opt.memory_report();
    CHECK(r.user_bytes() == 0);
    CHECK(bytes_of(r, "group 0 parameters") >= (70000 + 3 + 129) * sizeof(mpopt::bfloat16));
    CHECK(g.param(0).size() == 70000);
    check_report_matches_allocations(opt, 0);
    CHECK(bytes_of(opt.memory_report(), "gradient accumulator") == bytes_of(opt.memory_report(), "exp_avg"));
  }

  TEST_CASE("fp32 Adam keeps no master copy") {
    mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::adam> opt;
    std::vector<float> w(5000, 1.0f), gw(5000, 0.0f);
    opt.add_group({}).add(w, gw, "w");
    check_report_matches_allocations(opt, 5000);
  }
}
