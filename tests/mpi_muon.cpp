// The layer-wise partition (mpopt::layerwise) over MPI: each tensor whole on one rank, which holds
// its state and, under Muon, orthogonalizes it. With exact gradients (rank 0 sends them, the others
// zeros, summed) every rank's step is one process's, bit for bit, for Muon, for Adam, and for Muon's
// groups beside Adam's (mpopt::rules); checkpoints move between W ranks and one process; the ranks'
// state adds up to one process's. zero1 and zero2 keep Muon's matrices whole too (their Adam groups in
// equal shards), and give one process's bits.
#include <doctest/doctest.h>

#include "error_of.hpp"
#include "mpi_harness.hpp"

#include <mpopt/checkpoint.hpp>
#include <mpopt/muon.hpp>
#include <mpopt/rules.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace {

/// Two groups of matrices: tall, wide, square, 3-D, one row, and one larger than a bucket.
const std::vector<std::vector<mpopt::tensor_spec>> matrices = {
    {{"a", 64 * 32, {64, 32}}, {"b", 32 * 64, {32, 64}}, {"c", 48 * 48, {48, 48}}, {"d", 3 * 64, {3, 8, 8}}},
    {{"e", 9, {1, 9}}, {"f", 100 * 60, {100, 60}}, {"g", 24 * 24, {24, 24}}}};

const mpopt::optimizer_options exact{.clip_grad = 0, .combine = mpopt::accumulation::sum, .bucket_elements = 3000};

/// Muon for the first group's matrices, Adam for the second group and for vectors.
using hybrid = mpopt::rules<mpopt::muon, mpopt::adam>;
const std::vector<mpopt::tensor_spec> vectors = {{"h", 7, {7}}, {"i", 1, {1}}, {"j", 3001, {3001}}};

template <class Rule>
std::vector<std::vector<mpopt::tensor_spec>> groups_of() {
  if constexpr (!std::is_same_v<Rule, hybrid>) return matrices;
  auto adam_group = matrices[1];
  adam_group.insert(adam_group.begin() + 1, vectors.begin(), vectors.end());
  return {matrices[0], adam_group};
}

template <class Rule>
typename Rule::options rule_options(std::size_t group) {
  if constexpr (std::is_same_v<Rule, hybrid>) {
    if (group == 0) return rule_options<mpopt::muon>(group);
    return rule_options<mpopt::adam>(group);
  } else {
    typename Rule::options o;
    o.lr = 0.01;
    if constexpr (std::is_same_v<Rule, mpopt::muon>) o.ns_precision = mpopt::muon::iteration_precision::bf16;
    return o;
  }
}

/// An optimizer over `matrices`, its parameters and gradients in order.
template <class Opt>
struct model {
  using T = typename Opt::param_type;
  Opt opt;
  std::vector<std::span<T>> params, grads;
  std::vector<std::size_t> moments;  ///< per tensor: the state buffers of its rule
  std::vector<bool> whole;           ///< per tensor: whether its rule keeps it whole (Muon's)

  template <class... A>
  explicit model(A&&... a) : opt(std::forward<A>(a)...) {
    const auto groups = groups_of<typename Opt::rule>();
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      const auto& specs = groups[gi];
      const auto options = rule_options<typename Opt::rule>(gi);
      auto& g = opt.add_flat_group(options, specs);
      for (std::size_t t = 0; t < specs.size(); ++t) {
        moments.push_back(mpopt::detail::state_names<typename Opt::rule>(options).size());
        whole.push_back(mpopt::detail::update_of<typename Opt::rule>(options).whole_tensors);
        params.push_back(g.param(t));
        grads.push_back(g.grad(t));
        for (std::size_t k = 0; k < specs[t].size; ++k)
          params.back()[k] = T(float(0.1 * unit(mix((std::uint64_t(params.size()) << 32) + k))));
      }
    }
  }
  /// Step s's gradients; `sender`: whether this rank sends them (the others send zeros).
  void gradients(int s, bool sender) {
    for (std::size_t t = 0; t < grads.size(); ++t)
      for (std::size_t k = 0; k < grads[t].size(); ++k)
        grads[t][k] = sender ? T(float(0.01 * unit(mix((std::uint64_t(s) << 40) + (std::uint64_t(t) << 32) + k))))
                             : T(0.0f);
  }
  template <class Other>
  std::size_t differing(const model<Other>& other) const {
    std::size_t n = 0;
    for (std::size_t t = 0; t < params.size(); ++t)
      n += std::memcmp(params[t].data(), other.params[t].data(), params[t].size_bytes()) != 0;
    return n;
  }
};

template <class Precision, class Rule, class Partition = mpopt::layerwise>
using layerwise_t = mpopt::optimizer<Precision, mpopt::no_scaling, Partition, Rule, mpopt::host, mpopt::mpi>;
template <class Precision, class Rule>
using one_process_t = mpopt::optimizer<Precision, mpopt::no_scaling, mpopt::replicated, Rule>;

template <class Precision, class Rule, class Partition = mpopt::layerwise>
void check_one_process_bits(int steps) {
  const int w = world_size(), rank = world_rank();
  CAPTURE(w);
  model<layerwise_t<Precision, Rule, Partition>> d(mpopt::mpi{MPI_COMM_WORLD}, exact);
  model<one_process_t<Precision, Rule>> l(exact);
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    d.gradients(s, rank == 0);
    l.gradients(s, true);
    const auto ds = d.opt.step(), ls = l.opt.step();
    check_status_same_on_every_rank(ds);
    REQUIRE(ds.applied);
    REQUIRE(ls.applied);
    CHECK_MESSAGE(d.differing(l) == 0, d.differing(l) << " tensors differ from one process's");
  }
  // Each tensor the layout or its rule keeps whole is whole on one rank; the moments one process's.
  std::vector<int> holders(d.params.size(), 0);
  for (std::size_t t = 0; t < d.params.size(); ++t) {
    CAPTURE(t);
    const auto own = d.opt.owned(t);
    const bool whole = std::is_same_v<Partition, mpopt::layerwise> || d.whole[t];
    if (whole) CHECK((own.count == 0 || own.count == d.params[t].size()));
    holders[t] = whole && own.count ? 1 : 0;
    for (std::size_t k = 0; k < d.moments[t]; ++k) {
      const auto a = d.opt.moment(k, t), b = l.opt.moment(k, t);
      const auto mine = b.begin() + std::ptrdiff_t(own.first);
      CHECK(std::equal(a.begin(), a.end(), mine, mine + std::ptrdiff_t(own.count)));
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, holders.data(), int(holders.size()), MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  for (std::size_t t = 0; t < holders.size(); ++t)
    if (std::is_same_v<Partition, mpopt::layerwise> || d.whole[t]) CHECK(holders[t] == 1);
}

/// A checkpoint saved on W ranks loads into one process, whose saved state loads back on W ranks,
/// and all three go on with the same bits.
template <class Rule>
void check_checkpoint_moves() {
  const int rank = world_rank();
  model<layerwise_t<mpopt::bf16, Rule>> d(mpopt::mpi{MPI_COMM_WORLD}, exact);
  model<one_process_t<mpopt::bf16, Rule>> l(exact);
  for (int s = 0; s < 3; ++s) {
    d.gradients(s, rank == 0);
    REQUIRE(d.opt.step().applied);
  }
  std::vector<std::byte> saved;
  d.opt.save(saved);
  const std::string file = broadcast_string(std::string(reinterpret_cast<const char*>(saved.data()), saved.size()));
  l.opt.load(std::as_bytes(std::span(file)));
  CHECK(l.differing(d) == 0);
  model<layerwise_t<mpopt::bf16, Rule>> again(mpopt::mpi{MPI_COMM_WORLD}, exact);
  std::vector<std::byte> from_one;
  l.opt.save(from_one);
  again.opt.load(from_one);
  for (int s = 3; s < 6; ++s) {
    CAPTURE(s);
    d.gradients(s, rank == 0);
    again.gradients(s, rank == 0);
    l.gradients(s, true);
    REQUIRE(d.opt.step().applied);
    REQUIRE(again.opt.step().applied);
    REQUIRE(l.opt.step().applied);
    CHECK(d.differing(l) == 0);
    CHECK(again.differing(l) == 0);
  }
}

/// The memory report's buffers `names` of the layer-wise ranks add up to one process's: their sums.
template <class Rule>
std::vector<std::size_t> buffers_add_up(const std::vector<std::string>& names) {
  model<layerwise_t<mpopt::bf16, Rule>> d(mpopt::mpi{MPI_COMM_WORLD}, exact);
  model<one_process_t<mpopt::bf16, Rule>> l(exact);
  d.opt.finalize();
  l.opt.finalize();
  const auto mine = d.opt.memory_report(), one = l.opt.memory_report();
  std::vector<std::size_t> sums;
  for (const auto& name : names) sums.push_back(bytes_of(mine, name));
  MPI_Allreduce(MPI_IN_PLACE, sums.data(), int(sums.size()), MPI_UNSIGNED_LONG, MPI_SUM, MPI_COMM_WORLD);
  for (std::size_t k = 0; k < names.size(); ++k) {
    CAPTURE(names[k]);
    CHECK(sums[k] == bytes_of(one, names[k]));
  }
  return sums;
}

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE("the layer-wise partition on W ranks gives one process's bits with exact gradients: Muon in fp32 and "
            "bf16, Adam in bf16") {
    check_one_process_bits<mpopt::fp32, mpopt::muon>(5);
    check_one_process_bits<mpopt::bf16, mpopt::muon>(5);
    check_one_process_bits<mpopt::bf16, mpopt::adam>(5);
  }

  TEST_CASE("the layer-wise partition gives one process's bits for Muon's groups beside Adam's (mpopt::rules)") {
    check_one_process_bits<mpopt::bf16, hybrid>(5);
  }

  TEST_CASE("a layer-wise checkpoint loads into one process and back, and both go on with the same bits") {
    check_checkpoint_moves<mpopt::muon>();
    check_checkpoint_moves<hybrid>();
  }

  TEST_CASE("the ranks' layer-wise state adds up to one process's, and each rank's matrix buffer to its tensors") {
    buffers_add_up<mpopt::muon>({"momentum_buffer", "matrix stage"});
    // Beside Adam's group: Adam's second moment is held for Adam's tensors only.
    const auto state = buffers_add_up<hybrid>({"momentum_buffer|exp_avg", "exp_avg_sq"});
    CHECK(state[1] > 0);
    CHECK(state[1] < state[0]);
  }

  TEST_CASE("zero1 and zero2 keep Muon's matrices whole, Adam's tensors in equal shards, and give one process's bits") {
    check_one_process_bits<mpopt::fp32, mpopt::muon, mpopt::zero1>(3);
    check_one_process_bits<mpopt::bf16, hybrid, mpopt::zero1>(5);
    check_one_process_bits<mpopt::bf16, hybrid, mpopt::zero2>(3);
    // Adam's group is cut in equal shards, across its tensors: each rank holds a part of it.
    model<layerwise_t<mpopt::bf16, hybrid, mpopt::zero1>> d(mpopt::mpi{MPI_COMM_WORLD}, exact);
    d.opt.finalize();
    int splits = 0;
    for (std::size_t t = matrices[0].size(); t < d.params.size(); ++t) {
      const auto own = d.opt.owned(t);
      splits += own.count != 0 && own.count != d.params[t].size();
    }
    MPI_Allreduce(MPI_IN_PLACE, &splits, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK((world_size() == 1 ? splits == 0 : splits > 0));
  }

  TEST_CASE("ranks whose group chose different rules are refused at finalize, naming the group and the rules") {
    if (world_size() == 1) return;
    mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::layerwise, hybrid, mpopt::host, mpopt::mpi> opt(
        mpopt::mpi{MPI_COMM_WORLD}, exact);
    std::vector<float> w(16, 0.5f), g(16, 0.1f);
    if (world_rank() == 0) opt.add_group(mpopt::adam::options{}).add(w, g, "w", {4, 4});
    else opt.add_group(mpopt::muon::options{}).add(w, g, "w", {4, 4});
    const std::string e = error_of([&] { opt.finalize(); });
    CAPTURE(e);
    CHECK(e.find("the ranks disagree on group 0's rule (rank 0: adam, rank") != std::string::npos);
    CHECK(e.find(": muon)") != std::string::npos);
  }
}
