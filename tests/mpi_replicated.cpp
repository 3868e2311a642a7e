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

// Open MPI's deprecated C++ bindings do not compile cleanly with -Wextra; this file uses the C API.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
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
#include <type_traits>
#include <utility>
#include <vector>

#include <mpopt/mpi.hpp>
#include <mpopt/mpopt.hpp>

#include "temp_dir.hpp"

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int w = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}

enum class layout { unfused, flat };

// ---------------------------------------------------------------- deterministic data

/// splitmix64's finalizer: a counter-based generator, the same on every rank.
constexpr std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
constexpr std::uint64_t key(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  return mix(mix(mix(mix(a) ^ b) ^ c) ^ d);
}
/// Uniform in [-1, 1).
constexpr double unit(std::uint64_t h) { return double(h >> 11) * 0x1p-52 - 1.0; }

using grads_t = std::vector<std::vector<double>>;  // true gradient, per tensor

/// The global batch of every step, as micro-batches: micro-batch j = rank * A + a is the a-th
/// micro-step of rank `rank` (A micro-steps per rank and boundary).
///  - smooth: g_j = tensor_factor * (common + 0.5 * noise_j), rescaled so that the mean over the
///    micro-batches has global L2 norm 3 (steps 1, 4, 7, ...: clipping at 1 binds) or 0.4.
///  - exact: g_j = (common + noise_j) * 2^-e with integers common in [-127, 127], noise_j in
///    [-64, 64] and e in 14..21 fixed per step and tensor: 8 significant bits, exact in bf16, and in
///    fp16 times any power-of-two loss scale from 1 to 2^13 (fp16's subnormal grid is 2^-24); every
///    float sum of up to 8 of them is exact (below 2^-3 on a grid of 2^-21: 18 bits), so the
///    summation order across ranks cannot matter.
struct dataset {
  std::uint64_t seed;
  std::vector<std::size_t> sizes;
  bool exact = false;

  std::vector<grads_t> batch(int step, int micro) const {
    const grads_t c = common(step);
    std::vector<grads_t> b;
    for (int j = 0; j < micro; ++j) b.push_back(with_noise(c, step, j));
    if (!exact) {
      double ss = 0;
      for (std::size_t i = 0; i < sizes.size(); ++i)
        for (std::size_t k = 0; k < sizes[i]; ++k) {
          double mean = 0;
          for (const auto& mb : b) mean += mb[i][k];
          mean /= micro;
          ss += mean * mean;
        }
      const double f = (step % 3 == 1 ? 3.0 : 0.4) / std::sqrt(ss);
      for (auto& mb : b)
        for (auto& t : mb)
          for (double& x : t) x *= f;
    }
    return b;
  }
  /// Micro-batch j alone (exact data only: smooth data is normalized over the whole batch).
  grads_t micro_batch(int step, int j) const {
    CHECK(exact);
    return with_noise(common(step), step, j);
  }

 private:
  /// The part every micro-batch shares (exact: integers in [-127, 127]).
  grads_t common(int step) const {
    grads_t g(sizes.size());
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::uint64_t h = key(seed, std::uint64_t(step), 0xC0FFEE, i);
      g[i].resize(sizes[i]);
      for (std::size_t k = 0; k < sizes[i]; ++k)
        g[i][k] = exact ? double(int(mix(h + k) % 255) - 127) : unit(mix(h + k));
    }
    return g;
  }
  grads_t with_noise(grads_t g, int step, int j) const {
    const double grid = std::ldexp(1.0, step % 3 == 1 ? -14 : -17);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::uint64_t h = key(seed, std::uint64_t(step), std::uint64_t(j) + 1, i);
      if (exact) {
        const double f = grid * std::ldexp(1.0, -2 * int(i % 3));
        for (std::size_t k = 0; k < sizes[i]; ++k) g[i][k] = (g[i][k] + double(int(mix(h + k) % 129) - 64)) * f;
      } else {
        const double f = (i % 3 == 0) ? 1.0 : (i % 3 == 1) ? 0.3 : 0.1;
        for (std::size_t k = 0; k < sizes[i]; ++k) g[i][k] = f * (g[i][k] + 0.5 * unit(mix(h + k)));
      }
    }
    return g;
  }
};

/// Two groups: sizes include 1, odd sizes and one tensor over 65536 elements (several chunks).
struct shape {
  std::vector<std::size_t> g0, g1;
  std::vector<std::size_t> all() const {
    auto a = g0;
    a.insert(a.end(), g1.begin(), g1.end());
    return a;
  }
};
shape random_shape(std::uint64_t seed) {
  std::mt19937_64 rng(seed);  // the same sequence on every rank
  std::uniform_int_distribution<std::size_t> small(2, 64), mid(100, 2000), big(65537, 70000), med(2000, 5000);
  return {{1, 7, mid(rng) | 1, big(rng) | 1}, {small(rng) | 1, 3, 1024, med(rng)}};
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
template <class T>
std::uint32_t bits(T x) {
  if constexpr (std::is_same_v<T, float>) return std::bit_cast<std::uint32_t>(x);
  else return x.bits;
}
/// Distance in units in the last place between two finite values of a 16-bit float type.
inline long ulp_distance16(std::uint16_t a, std::uint16_t b) {
  auto ordered = [](std::uint16_t x) { return (x & 0x8000) ? -long(x & 0x7FFF) : long(x); };
  return std::abs(ordered(a) - ordered(b));
}

// ---------------------------------------------------------------- configurations

template <class Precision, class Scaler, class Rule, layout Layout>
struct cfg {
  using precision = Precision;
  using scaler = Scaler;
  using rule = Rule;
  static constexpr layout lay = Layout;
  using dist = mpopt::optimizer<Precision, Scaler, mpopt::replicated, Rule, mpopt::host, mpopt::mpi>;
  using local = mpopt::optimizer<Precision, Scaler, mpopt::replicated, Rule, mpopt::host, mpopt::single_process>;
  static std::string describe() {
    return std::string(Precision::name) + "+" + std::string(Scaler::name) + "+" + std::string(Rule::name) +
           (Layout == layout::flat ? "+flat" : "+unfused");
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

#define CFGS_OF(R, L)                                                                   \
  cfg<mpopt::fp32, mpopt::no_scaling, R, L>, cfg<mpopt::bf16, mpopt::no_scaling, R, L>, \
      cfg<mpopt::fp16, mpopt::dynamic_scale, R, L>
#define ALL_CFGS                                                                                                    \
  CFGS_OF(mpopt::adam, layout::unfused), CFGS_OF(mpopt::adam, layout::flat), CFGS_OF(mpopt::lamb, layout::unfused), \
      CFGS_OF(mpopt::lamb, layout::flat)
// Precision x rule, the layout alternating.
#define SOME_CFGS                                                           \
  cfg<mpopt::fp32, mpopt::no_scaling, mpopt::adam, layout::unfused>,        \
      cfg<mpopt::bf16, mpopt::no_scaling, mpopt::adam, layout::flat>,       \
      cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam, layout::unfused>, \
      cfg<mpopt::fp32, mpopt::no_scaling, mpopt::lamb, layout::flat>,       \
      cfg<mpopt::bf16, mpopt::no_scaling, mpopt::lamb, layout::unfused>,    \
      cfg<mpopt::fp16, mpopt::dynamic_scale, mpopt::lamb, layout::flat>

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
      const std::uint64_t h = key(init_seed, 0x1417, i, 0);
      for (std::size_t k = 0; k < params[i].size(); ++k) params[i][k] = to<P>(unit(mix(h + k)));
    }
  }

  /// A backward: the true gradient times the current loss scale, rounded to the grad type.
  void write(const grads_t& g) {
    const double s = opt.loss_scale();
    for (std::size_t i = 0; i < grads.size(); ++i)
      for (std::size_t k = 0; k < grads[i].size(); ++k) grads[i][k] = to<G>(g[i][k] * s);
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

template <class Opt>
snapshot take(net<Opt>& n) {
  n.opt.finalize();
  snapshot s;
  for (std::size_t i = 0; i < n.params.size(); ++i) {
    for (auto x : n.params[i]) s.params.push_back(bits(x));
    for (float x : n.opt.master(i)) s.masters.push_back(bits(x));
    for (float x : n.opt.moment(0, i)) s.m.push_back(bits(x));
    for (float x : n.opt.moment(1, i)) s.v.push_back(bits(x));
  }
  if constexpr (std::is_same_v<typename Opt::rule, mpopt::lamb>)
    for (double c : n.opt.lamb_coeffs()) s.coeffs.push_back(std::bit_cast<std::uint64_t>(c));
  for (std::size_t g = 0; g < n.opt.group_count(); ++g) s.group_steps.push_back(n.opt.group(g).step());
  s.scale = n.opt.loss_scale();
  return s;
}

/// FNV-1a over 32-bit words.
template <class V>
std::uint64_t fnv(const V& words) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (auto w : words) {
    h ^= std::uint64_t(w);
    h *= 0x100000001B3ull;
  }
  return h;
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
/// same counters and scale, and the same norm to the bit (each rank computes it over the identical
/// reduced gradient).
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
                                std::bit_cast<std::uint64_t>(st.grad_norm_clipped)};
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
closeness check_close(net<D>& d, net<L>& l, double floor) {
  using P = typename net<D>::P;
  closeness c;
  std::size_t bad_master = 0, bad_param = 0, param_not_rounded = 0;
  double worst_excess = 0, dm[2] = {0, 0}, nm[2] = {0, 0};
  for (std::size_t i = 0; i < d.params.size(); ++i) {
    const auto md = d.opt.master(i), ml = l.opt.master(i);
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
      const auto a = d.opt.moment(j, i), b = l.opt.moment(j, i);
      for (std::size_t k = 0; k < a.size(); ++k) {
        dm[j] += (double(a[k]) - double(b[k])) * (double(a[k]) - double(b[k]));
        nm[j] += double(b[k]) * double(b[k]);
      }
    }
  }
  for (std::size_t j = 0; j < 2; ++j) {
    const double rel = dm[j] == 0 ? 0 : std::sqrt(dm[j] / nm[j]);
    c.moment_rel = std::max(c.moment_rel, rel);
    CHECK_MESSAGE(rel <= 1e-6, "moment " << j << ": normwise relative difference " << rel);
  }
  if constexpr (std::is_same_v<typename net<D>::rule, mpopt::lamb>) {
    const auto cd = d.opt.lamb_coeffs(), cl = l.opt.lamb_coeffs();
    CHECK(cd.size() == cl.size());
    for (std::size_t i = 0; i < std::min(cd.size(), cl.size()); ++i)
      c.coeff_rel = std::max(c.coeff_rel, std::abs(cd[i] - cl[i]) / cl[i]);
    CHECK(c.coeff_rel <= 1e-5);
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
void check_state(net<D>& d, net<L>& l, bool bitwise, int steps, closeness* worst = nullptr) {
  if (bitwise) {
    const std::string diff = take(d).difference(take(l));
    CHECK_MESSAGE(diff.empty(), "W-rank state differs from the single-process state: " << diff);
  } else {
    const closeness c = check_close(d, l, 1e-6 * steps * max_lr);
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

/// Broadcasts a string from rank 0.
std::string broadcast_string(std::string s) {
  int n = int(s.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  s.resize(std::size_t(n));
  MPI_Bcast(s.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  return s;
}

/// A directory rank 0 creates (and removes at the end); every rank knows its name.
struct shared_dir {
  std::optional<temp_dir> owner;
  std::filesystem::path path;
  shared_dir() {
    if (world_rank() == 0) owner.emplace("mpopt_mpi_replicated_");
    path = broadcast_string(owner ? owner->path.string() : std::string());
  }
  ~shared_dir() { MPI_Barrier(MPI_COMM_WORLD); }  // nobody still reads when rank 0 removes it
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
};

}  // namespace

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
        mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam, mpopt::host, mpopt::mpi>;
    using L = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam>;
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
    using D = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::lamb, mpopt::host, mpopt::mpi>;
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
}
