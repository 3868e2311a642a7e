// Shared by the MPI optimizer tests: deterministic data every rank can compute for every rank, a model
// (optimizer + tensors) in either layout, bit-level snapshots of its state (gathered across ranks when
// sharded), and comparisons against a single-process reference run.
//
// Every rank runs every test case and every collective in the same order, so nothing here may end a
// test case on one rank only: CHECK, never REQUIRE.
#pragma once

#include <doctest/doctest.h>

// Open MPI's deprecated C++ bindings do not compile cleanly with -Wextra; this file uses the C API.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <mpopt/mpi.hpp>
#include <mpopt/mpopt.hpp>

#include "bits.hpp"
#include "counter_hash.hpp"
#include "harness_data.hpp"
#include "test_backend.hpp"

#include "mpi_world.hpp"
#include "temp_dir.hpp"

namespace {

enum class layout { unfused, flat };

// ---------------------------------------------------------------- deterministic data (harness_data.hpp)

using harness_data::append_bits;
using harness_data::dataset;
using harness_data::fnv;
using harness_data::grads_t;

/// Two groups: sizes include 1, odd sizes and one tensor over 65536 elements (several chunks).
struct shape {
  std::vector<std::size_t> g0, g1;
  std::vector<std::size_t> all() const {
    auto a = g0;
    a.insert(a.end(), g1.begin(), g1.end());
    return a;
  }
};
[[maybe_unused]] shape random_shape(std::uint64_t seed) {
  std::mt19937_64 rng(seed);  // the same sequence on every rank
  std::uniform_int_distribution<std::size_t> small(2, 64), mid(100, 2000), big(65537, 70000), med(2000, 5000);
  return {{1, 7, mid(rng) | 1, big(rng) | 1}, {small(rng) | 1, 3, 1024, med(rng)}};
}

/// The bytes of a memory report's lines named `name`.
[[maybe_unused]] std::size_t bytes_of(const mpopt::memory_report& r, const std::string& name) {
  std::size_t n = 0;
  for (const auto& b : r.buffers)
    if (b.name == name) n += b.bytes;
  return n;
}

template <class Rule>
std::pair<typename Rule::options, typename Rule::options> group_options() {
  typename Rule::options a, b;
  a.lr = 2e-3;
  b.lr = 1e-3;
  b.beta1 = 0.85;
  if constexpr (std::is_same_v<Rule, mpopt::adam>) {
    a.weight_decay = 0.05;  // AdamW
    b.decoupled_weight_decay = false;
    b.weight_decay = 0.01;  // L2
  } else {
    a.weight_decay = 0.01;
  }
  return {a, b};
}
/// Largest lr of any group (for the absolute tolerance floor).
constexpr double max_lr = 2e-3;

template <class T>
T to(double x) {
  if constexpr (std::is_same_v<T, float>) return float(x);
  else return T(x);  // mpopt::half / mpopt::bfloat16: round to nearest even
}
/// Distance in units in the last place between two finite values of a 16-bit float type.
inline long ulp_distance16(std::uint16_t a, std::uint16_t b) {
  auto ordered = [](std::uint16_t x) { return (x & 0x8000) ? -long(x & 0x7FFF) : long(x); };
  return std::abs(ordered(a) - ordered(b));
}

// ---------------------------------------------------------------- configurations

template <class Precision, class Scaler, class Rule, layout Layout, class Partition = mpopt::replicated>
struct cfg {
  using precision = Precision;
  using scaler = Scaler;
  using rule = Rule;
  using partition = Partition;
  static constexpr layout lay = Layout;
  using dist = mpopt::optimizer<Precision, Scaler, Partition, Rule, test_backend, mpopt::mpi>;
  using local = mpopt::optimizer<Precision, Scaler, mpopt::replicated, Rule, test_backend, mpopt::single_process>;
  static std::string describe() {
    return std::string(Precision::name) + "+" + std::string(Scaler::name) + "+" + std::string(Rule::name) +
           (Layout == layout::flat ? "+flat" : "+unfused") + "+" + std::string(Partition::name);
  }
  /// fp16: dynamic scale from 1024 (no overflow from the data), doubling every `window` clean steps.
  static typename Scaler::options scaler_options(std::int64_t window) {
    if constexpr (std::is_same_v<Scaler, mpopt::dynamic_scale>) {
      mpopt::dynamic_scale_options o;
      o.init_scale = 1024;
      o.window = window;
      return o;
    } else {
      (void)window;
      return {};
    }
  }
};

// Each precision, rule and layout once: all the device build runs of ALL_CFGS and SOME_CFGS
// (tests/README.md, "The device build").
#define FEW_CFGS                                                            \
  cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::unfused>,     \
      cfg<mpopt::fp32, mpopt::no_scaling, mpopt::lamb, layout::flat>,       \
      cfg<mpopt::bf16, mpopt::no_scaling, mpopt::lamb, layout::unfused>
// Precision x rule x layout.
#define ALL_CFGS                                                                              \
  FEW_CFGS HOST_ONLY(cfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::unfused>,       \
                     cfg<mpopt::bf16, mpopt::no_scaling, mpopt::adam, layout::unfused>,       \
                     cfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::flat>,          \
                     cfg<mpopt::bf16, mpopt::no_scaling, mpopt::adam, layout::flat>,          \
                     cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::flat>,       \
                     cfg<mpopt::fp32, mpopt::no_scaling, mpopt::lamb, layout::unfused>,       \
                     cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::lamb, layout::unfused>,    \
                     cfg<mpopt::bf16, mpopt::no_scaling, mpopt::lamb, layout::flat>,          \
                     cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::lamb, layout::flat>)
// Precision x rule, the layout alternating.
#define SOME_CFGS                                                                          \
  FEW_CFGS HOST_ONLY(cfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::unfused>,    \
                     cfg<mpopt::bf16, mpopt::no_scaling, mpopt::adam, layout::flat>,       \
                     cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::lamb, layout::flat>)

// ---------------------------------------------------------------- a model: optimizer + tensors

template <class Opt>
struct net {
  using P = typename Opt::param_type;
  using G = typename Opt::grad_type;
  using rule = typename Opt::rule;

  Opt opt;
  std::vector<std::span<P>> params;  // registration order
  std::vector<std::span<G>> grads;

  /// Registers the two groups of `sh` and sets the parameters to uniform(-1, 1) from `init_seed`.
  template <class... A>
  net(layout lay, const shape& sh, std::uint64_t init_seed, A&&... args) : opt(std::forward<A>(args)...) {
    const auto [o0, o1] = group_options<rule>();
    add(lay, o0, sh.g0, "a");
    add(lay, o1, sh.g1, "b");
    for (std::size_t i = 0; i < params.size(); ++i) {
      harness_data::fill_uniform(key(init_seed, 0x1417, i, 0), params[i]);
    }
  }

  /// A backward: the true gradient times the current loss scale, rounded to the grad type.
  void write(const grads_t& g) {
    const double s = opt.loss_scale();
    for (std::size_t i = 0; i < grads.size(); ++i) harness_data::round_scaled(g[i], s, grads[i]);
  }
  /// Reports every gradient done, last tensor first, as a backward pass would (zero2 reduces buckets
  /// as they complete).
  void report_ready() {
    for (std::size_t i = grads.size(); i-- > 0;) opt.grad_ready(i);
  }

 private:
  void add(layout lay, const typename Opt::group_options& o, const std::vector<std::size_t>& sizes,
           const std::string& prefix) {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      names.push_back(prefix + "." + std::to_string(i) + "_n" + std::to_string(sizes[i]));
    if (lay == layout::flat) {
      std::vector<mpopt::tensor_spec> specs;
      for (std::size_t i = 0; i < sizes.size(); ++i) specs.push_back({names[i], sizes[i]});
      auto& g = opt.add_flat_group(o, std::span<const mpopt::tensor_spec>(specs));
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        params.push_back(g.param(i));
        grads.push_back(g.grad(i));
      }
    } else {
      auto& g = opt.add_group(o);
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        own_p_.push_back(std::make_unique<std::vector<P>>(sizes[i], P(0.0f)));
        own_g_.push_back(std::make_unique<std::vector<G>>(sizes[i], G(0.0f)));
        g.add(*own_p_.back(), *own_g_.back(), names[i]);
        params.push_back(std::span<P>(*own_p_.back()));
        grads.push_back(std::span<G>(*own_g_.back()));
      }
    }
  }
  std::vector<std::unique_ptr<std::vector<P>>> own_p_;
  std::vector<std::unique_ptr<std::vector<G>>> own_g_;
};

/// Runs one boundary of A micro-steps on each rank of `n` (micro-batch rank * A + a of the global batch).
template <class D>
[[maybe_unused]] mpopt::step_status run_boundary(net<D>& n, const dataset& ds, int step, int a_steps, int rank) {
  mpopt::step_status st;
  for (int a = 0; a < a_steps; ++a) {
    n.write(ds.micro_batch(step, rank * a_steps + a));
    n.report_ready();
    st = n.opt.step();
  }
  return st;
}

// ---------------------------------------------------------------- snapshots and digests

/// Every bit of observable optimizer state.
struct snapshot {
  std::vector<std::uint32_t> params, masters, m, v;
  std::vector<std::uint64_t> coeffs;  // LAMB trust ratios (bits of the doubles)
  std::vector<std::uint64_t> group_steps;
  double scale = 0;

  /// The first differing field and element, or "" when equal.
  std::string difference(const snapshot& o) const {
    std::ostringstream s;
    auto cmp = [&](const char* what, const auto& a, const auto& b) {
      if (!s.str().empty()) return;
      if (a.size() != b.size()) {
        s << what << ": " << a.size() << " vs " << b.size() << " elements";
        return;
      }
      std::size_t n = 0, first = 0;
      for (std::size_t k = 0; k < a.size(); ++k)
        if (a[k] != b[k] && n++ == 0) first = k;
      if (n) s << what << ": " << n << " of " << a.size() << " elements differ, first at flat index " << first;
    };
    cmp("params", params, o.params);
    cmp("masters", masters, o.masters);
    cmp("exp_avg", m, o.m);
    cmp("exp_avg_sq", v, o.v);
    cmp("lamb_coeffs", coeffs, o.coeffs);
    cmp("group steps", group_steps, o.group_steps);
    if (s.str().empty() && std::bit_cast<std::uint64_t>(scale) != std::bit_cast<std::uint64_t>(o.scale))
      s << "loss scale " << scale << " vs " << o.scale;
    return s.str();
  }
  std::string difference_except_scale(const snapshot& o) const {
    snapshot a = *this;
    a.scale = o.scale;
    return a.difference(o);
  }
};

/// The whole of tensor i's state from the pieces the ranks of `comm` hold (collective when sharded):
/// the optimizer's communicator, or the data-parallel one of the tensor's group (an expert group's).
template <class Opt>
std::vector<float> whole(const Opt& opt, std::size_t i, std::span<const float> piece, MPI_Comm comm) {
  if constexpr (!Opt::partition::sharded) {
    return {piece.begin(), piece.end()};
  } else {
    int w = 1;
    MPI_Comm_size(comm, &w);
    const auto o = opt.owned(i);
    const int mine[2] = {int(o.first), int(o.count)};
    std::vector<int> all(2 * std::size_t(w)), first(std::size_t(w), 0), count(std::size_t(w), 0);
    MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, comm);
    std::size_t n = 0;
    for (std::size_t r = 0; r < std::size_t(w); ++r) {
      first[r] = all[2 * r];
      count[r] = all[2 * r + 1];
      n += std::size_t(count[r]);
    }
    std::vector<float> out(n);
    MPI_Allgatherv(piece.data(), mine[1], MPI_FLOAT, out.data(), count.data(), first.data(), MPI_FLOAT, comm);
    return out;
  }
}
template <class Opt>
std::vector<float> whole(const Opt& opt, std::size_t i, std::span<const float> piece) {
  if constexpr (!Opt::partition::sharded) return {piece.begin(), piece.end()};  // any communicator
  else return whole(opt, i, piece, opt.communicator().native());
}
/// Tensor i's master and moments, whole on every rank of `comm`.
template <class Opt>
std::array<std::vector<float>, 3> state_of(const Opt& opt, std::size_t i, MPI_Comm comm) {
  return {whole(opt, i, opt.master(i), comm), whole(opt, i, opt.moment(0, i), comm), whole(opt, i, opt.moment(1, i), comm)};
}
template <class Opt>
std::array<std::vector<float>, 3> state_of(const Opt& opt, std::size_t i) {
  return {whole(opt, i, opt.master(i)), whole(opt, i, opt.moment(0, i)), whole(opt, i, opt.moment(1, i))};
}

template <class Opt>
snapshot take(net<Opt>& n) {
  n.opt.finalize();
  snapshot s;
  for (std::size_t i = 0; i < n.params.size(); ++i) {
    const auto [master, m, v] = state_of(n.opt, i);
    append_bits(s.params, n.params[i]);
    append_bits(s.masters, master);
    append_bits(s.m, m);
    append_bits(s.v, v);
  }
  if constexpr (std::is_same_v<typename Opt::rule, mpopt::lamb>)
    for (double c : n.opt.lamb_coeffs()) s.coeffs.push_back(std::bit_cast<std::uint64_t>(c));
  for (std::size_t g = 0; g < n.opt.group_count(); ++g) s.group_steps.push_back(n.opt.group(g).step());
  s.scale = n.opt.loss_scale();
  return s;
}

/// Every rank gathers every rank's digest of params, masters, moments, trust ratios, step counters
/// and loss scale, and checks them all against rank 0's.
template <class Opt>
void check_same_on_every_rank(net<Opt>& n) {
  const snapshot s = take(n);
  const std::uint64_t mine[] = {fnv(s.params),
                                fnv(s.masters),
                                fnv(s.m),
                                fnv(s.v),
                                fnv(s.coeffs),
                                fnv(s.group_steps),
                                std::bit_cast<std::uint64_t>(s.scale)};
  constexpr int k = int(std::size(mine));
  const int w = world_size();
  std::vector<std::uint64_t> all(std::size_t(k * w));
  MPI_Allgather(mine, k, MPI_UINT64_T, all.data(), k, MPI_UINT64_T, MPI_COMM_WORLD);
  const char* what[] = {"params", "masters", "exp_avg", "exp_avg_sq", "lamb_coeffs", "group steps", "loss scale"};
  for (int r = 1; r < w; ++r)
    for (int q = 0; q < k; ++q)
      CHECK_MESSAGE(all[std::size_t(r * k + q)] == all[std::size_t(q)],
                    what[q] << " of rank " << r << " differ from rank 0's");
}

// ---------------------------------------------------------------- comparing with the reference

/// Every rank gathers every rank's status and checks it against rank 0's: the same decision, the
/// same counters and scale, and the same norm and spike-guard scores to the bit (each rank computes
/// them over the identical reduced gradient and loss).
inline void check_status_same_on_every_rank(const mpopt::step_status& st) {
  const std::uint64_t mine[] = {std::uint64_t(st.result),
                                std::uint64_t(st.applied),
                                st.step,
                                st.skipped_steps,
                                st.consecutive_skips,
                                std::uint64_t(st.micro_step),
                                std::bit_cast<std::uint64_t>(st.scale_before),
                                std::bit_cast<std::uint64_t>(st.scale_after),
                                std::bit_cast<std::uint64_t>(st.grad_norm),
                                std::bit_cast<std::uint64_t>(st.clip_coef),
                                std::bit_cast<std::uint64_t>(st.grad_norm_clipped),
                                std::bit_cast<std::uint64_t>(st.loss_z),
                                std::bit_cast<std::uint64_t>(st.norm_z)};
  constexpr int k = int(std::size(mine));
  const int w = world_size();
  std::vector<std::uint64_t> all(std::size_t(k * w));
  MPI_Allgather(mine, k, MPI_UINT64_T, all.data(), k, MPI_UINT64_T, MPI_COMM_WORLD);
  for (int r = 1; r < w; ++r)
    CHECK_MESSAGE(std::equal(all.begin() + r * k, all.begin() + (r + 1) * k, all.begin()),
                  "the step status of rank " << r << " differs from rank 0's");
}

/// Statuses of a boundary, W ranks (d) against one process (l): the same decision and counters;
/// grad_norm and clip_coef equal when the gradients are bitwise equal, else within 1e-5 relative.
/// Also checks d agrees across ranks. Returns the relative grad_norm difference.
inline double check_status(const mpopt::step_status& d, const mpopt::step_status& l, bool bitwise) {
  check_status_same_on_every_rank(d);
  CHECK(d.result == l.result);
  CHECK(d.applied == l.applied);
  CHECK(d.step == l.step);
  CHECK(d.skipped_steps == l.skipped_steps);
  CHECK(d.consecutive_skips == l.consecutive_skips);
  CHECK(d.micro_step == l.micro_step);
  CHECK(d.scale_before == l.scale_before);
  CHECK(d.scale_after == l.scale_after);
  if (!(d.applied && l.applied)) return 0;
  if (bitwise) {
    CHECK(d.grad_norm == l.grad_norm);
    CHECK(d.clip_coef == l.clip_coef);
    CHECK(d.grad_norm_clipped == l.grad_norm_clipped);
  } else {
    CHECK(std::abs(d.grad_norm - l.grad_norm) <= 1e-5 * l.grad_norm);
    CHECK(std::abs(d.clip_coef - l.clip_coef) <= 1e-5 * l.clip_coef);
    CHECK(std::abs(d.grad_norm_clipped - l.grad_norm_clipped) <= 1e-5 * l.grad_norm_clipped);
  }
  return std::abs(d.grad_norm - l.grad_norm) / l.grad_norm;
}

/// How far the W-rank run is from the single-process run when their float gradient sums differ in
/// order (a few ulps of the summed gradient).
struct closeness {
  double master_rel = 0;      // worst |d - l| / |l|
  double master_floor = 0;    // worst |d - l| - 1e-6 |l|: the absolute floor the masters needed
  double moment_rel = 0;      // worst over m, v of ||d - l|| / ||l|| over all tensors
  double coeff_rel = 0;       // worst LAMB trust ratio relative difference
  double norm_rel = 0;        // worst grad_norm relative difference
  std::size_t param_off = 0;  // params not bitwise equal
  std::size_t elements = 0;
  void merge(const closeness& c) {
    master_rel = std::max(master_rel, c.master_rel);
    master_floor = std::max(master_floor, c.master_floor);
    moment_rel = std::max(moment_rel, c.moment_rel);
    coeff_rel = std::max(coeff_rel, c.coeff_rel);
    param_off = std::max(param_off, c.param_off);
    elements = c.elements;
  }
  /// With -s (doctest's --success), rank 0 prints how close the runs were.
  void report(const std::string& what, int w, const char* mode) const {
    if (world_rank() != 0 || !doctest::getContextOptions()->success) return;
    MESSAGE(what << " W=" << w << mode << ": worst grad_norm relative difference " << norm_rel
                 << ", master relative difference " << master_rel << " (floor needed " << master_floor
                 << "), moments (normwise) " << moment_rel << ", trust ratios " << coeff_rel
                 << ", params not equal: " << param_off << " of " << elements);
  }
};

/// Tolerances when the summation order differs (the gradient sums differ by a few float ulps):
///  - masters, element-wise: |d - l| <= 1e-6 |l| + MASTER_FLOOR;
///  - moments, normwise over all tensors: ||d - l|| <= 1e-6 ||l|| (an element whose micro-batch
///    gradients cancel has an arbitrarily large relative error in its sum; normwise it is bounded);
///  - LAMB trust ratios: 1e-5 relative, as grad_norm (a quotient of two norms over few elements for
///    the small tensors, so one cancelling element weighs more);
///  - params: each is bitwise its own master rounded to nearest even on both sides (fp32: the master
///    itself, covered by the master check); a 16-bit param may differ by 1 ulp, and only where the
///    masters differ (they straddle a rounding midpoint).
template <class D, class L>
closeness check_close(net<D>& d, net<L>& l, double floor, double moment_tol = 1e-6) {
  using P = typename net<D>::P;
  closeness c;
  std::size_t bad_master = 0, bad_param = 0, param_not_rounded = 0;
  double worst_excess = 0, dm[2] = {0, 0}, nm[2] = {0, 0};
  for (std::size_t i = 0; i < d.params.size(); ++i) {
    const auto sd = state_of(d.opt, i), sl = state_of(l.opt, i);
    const auto &md = sd[0], &ml = sl[0];
    c.elements += md.size();
    for (std::size_t k = 0; k < md.size(); ++k) {
      const double e = std::abs(double(md[k]) - double(ml[k])), ref = std::abs(double(ml[k]));
      const double allowed = 1e-6 * ref + floor;
      if (!(e <= allowed)) {
        ++bad_master;
        worst_excess = std::max(worst_excess, e / allowed);
      }
      if (e > 0) c.master_rel = std::max(c.master_rel, e / ref);
      c.master_floor = std::max(c.master_floor, e - 1e-6 * ref);
      const auto pd = bits(d.params[i][k]), pl = bits(l.params[i][k]);
      if constexpr (!std::is_same_v<P, float>) {
        param_not_rounded += pd != bits(to<P>(double(md[k]))) || pl != bits(to<P>(double(ml[k])));
        if (pd != pl)
          bad_param += ulp_distance16(std::uint16_t(pd), std::uint16_t(pl)) > 1 || bits(md[k]) == bits(ml[k]);
      }
      c.param_off += pd != pl;
    }
    for (std::size_t j = 0; j < 2; ++j) {
      const auto &a = sd[j + 1], &b = sl[j + 1];
      for (std::size_t k = 0; k < a.size(); ++k) {
        dm[j] += (double(a[k]) - double(b[k])) * (double(a[k]) - double(b[k]));
        nm[j] += double(b[k]) * double(b[k]);
      }
    }
  }
  for (std::size_t j = 0; j < 2; ++j) {
    const double rel = dm[j] == 0 ? 0 : std::sqrt(dm[j] / nm[j]);
    c.moment_rel = std::max(c.moment_rel, rel);
    CHECK_MESSAGE(rel <= moment_tol, "moment " << j << ": normwise relative difference " << rel);
  }
  if constexpr (std::is_same_v<typename net<D>::rule, mpopt::lamb>) {
    const auto cd = d.opt.lamb_coeffs(), cl = l.opt.lamb_coeffs();
    CHECK(cd.size() == cl.size());
    for (std::size_t i = 0; i < std::min(cd.size(), cl.size()); ++i)
      c.coeff_rel = std::max(c.coeff_rel, std::abs(cd[i] - cl[i]) / cl[i]);
    CHECK(c.coeff_rel <= 10 * moment_tol);  // a quotient of two norms over as few as one element
  }
  CHECK_MESSAGE(bad_master == 0, bad_master << " masters beyond 1e-6 relative + " << floor
                                            << "; worst difference / allowed = " << worst_excess);
  CHECK_MESSAGE(param_not_rounded == 0, param_not_rounded << " params are not their master rounded to nearest even");
  CHECK_MESSAGE(bad_param == 0,
                bad_param << " 16-bit params differ by more than 1 ulp, or where the masters are equal");
  return c;
}

/// The W-rank optimizer against the single-process one: bitwise or within the tolerances above.
template <class D, class L>
void check_state(net<D>& d, net<L>& l, bool bitwise, int steps, closeness* worst = nullptr, double moment_tol = 1e-6) {
  if (bitwise) {
    const std::string diff = take(d).difference(take(l));
    CHECK_MESSAGE(diff.empty(), "W-rank state differs from the single-process state: " << diff);
  } else {
    const closeness c = check_close(d, l, 1e-6 * steps * max_lr, moment_tol);
    if (worst) worst->merge(c);
  }
}

/// One boundary: rank r runs its A micro-steps on micro-batches r*A .. r*A+A-1; the reference runs
/// all W*A micro-batches in order. Returns both boundary statuses.
template <class D, class L>
std::pair<mpopt::step_status, mpopt::step_status> boundary(
    net<D>& d, net<L>& l, const std::vector<grads_t>& b, int a_steps,
    const std::vector<std::pair<int, std::function<void(net<D>&)>>>& dist_faults = {},
    const std::vector<std::pair<int, std::function<void(net<L>&)>>>& ref_faults = {}) {
  const int r = world_rank();
  mpopt::step_status sd, sl;
  for (int a = 0; a < a_steps; ++a) {
    const int j = r * a_steps + a;
    d.write(b[std::size_t(j)]);
    for (const auto& [fj, f] : dist_faults)
      if (fj == j) f(d);
    d.report_ready();
    sd = d.opt.step();
    if (a + 1 < a_steps) {
      CHECK(sd.result == mpopt::step_result::accumulating);
      CHECK(sd.micro_step == a + 1);
    }
  }
  for (int j = 0; j < int(b.size()); ++j) {
    l.write(b[std::size_t(j)]);
    for (const auto& [fj, f] : ref_faults)
      if (fj == j) f(l);
    sl = l.opt.step();
    if (j + 1 < int(b.size())) CHECK(sl.result == mpopt::step_result::accumulating);
  }
  return {sd, sl};
}

/// Forwards to MPI and counts the bytes this rank hands the all-reduces, all-to-alls and
/// all-gathers (its own piece of each gather); can throw once, at the n-th all-gather, on every
/// rank, as a broken network would be seen by all.
struct counting_mpi : mpopt::mpi {
  using mpopt::mpi::mpi;
  static constexpr std::string_view name = "counting_mpi";
  std::size_t bytes = 0;
  int gathers = 0, fail_gather_at = -1;

  using mpopt::mpi::all_gather;
  using mpopt::mpi::all_reduce;
  using mpopt::mpi::all_to_all;
  template <class T>
  void all_reduce(std::span<T> d, mpopt::reduce_op op) {
    bytes += d.size_bytes();
    mpopt::mpi::all_reduce(d, op);
  }
  template <class T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    bytes += in.size_bytes();
    mpopt::mpi::all_to_all(in, out);
  }
  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    gather_may_fail();
    bytes += in.size_bytes();
    mpopt::mpi::all_gather(in, out);
  }
  template <class T>
  void all_gather(std::span<T> data, std::span<const std::size_t> counts) {
    gather_may_fail();
    bytes += counts[std::size_t(rank())] * sizeof(T);
    mpopt::mpi::all_gather(data, counts);
  }

 private:
  void gather_may_fail() {
    if (gathers++ == fail_gather_at) throw mpopt::error("counting_mpi: all_gather failed");
  }
};
static_assert(mpopt::communicator<counting_mpi>);

}  // namespace
