// mpopt — what an update rule is. A rule declares its options, its per-element fp32 state, the
// scalars each step derives from the options and the step count, and its element stages; the
// optimizer and every backend derive the passes from that (docs/extending.md, "Writing your own rule").
//
// A stage is a function template over an element view `e` (e.vec is float, or a SIMD or GPU
// vector of floats), written with + - * / and mpopt::math:
//   e.grad()              the true gradient: unscaled, averaged, clipped
//   e.param()             the fp32 master weight;  e.set_param(x) writes it (and the 16-bit copy)
//   e.state(k)            state buffer k;          e.set_state(k, x) writes it
//   e.norm(j, x)          adds x^2 to per-tensor sum j (j = 0, 1): a rule with a reduction
//   e.tensor_scale()      the per-tensor factor computed from those sums, or the matrix stage's
//   e.matrix()            a matrix rule's buffer: e.set_matrix(x) writes it (matrix_rule below)
// Each accessor loads or stores when called, so a stage moves exactly the bytes it names.
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

#include "detail/config.hpp"
#include "detail/lanes/lanes.hpp"
#include "detail/math/newton_schulz_settings.hpp"
#include "detail/passes/step_data.hpp"
#include "fields.hpp"
#include "tensor_spec.hpp"

namespace mpopt {

/// The most fp32 state buffers a rule may keep per element.
inline constexpr std::size_t max_rule_state = detail::max_state_buffers;

/// The element vocabulary of a stage, for float and every vector type alike. Vector types find
/// their overloads by argument-dependent lookup; these also serve plain float.
namespace math {
template <class V>
MPOPT_HOST_DEVICE V fma(V a, V b, V c) {
  using detail::fma;
  return fma(a, b, c);
}
template <class V>
MPOPT_HOST_DEVICE V sqrt(V a) {
  using detail::sqrt;
  return sqrt(a);
}
template <class V>
MPOPT_HOST_DEVICE V min(V a, V b) {
  using detail::min;
  return min(a, b);
}
template <class V>
MPOPT_HOST_DEVICE V max(V a, V b) {
  using detail::max;
  return max(a, b);
}
/// |a|.
template <class V>
MPOPT_HOST_DEVICE V abs(V a) {
  return max(a, -a);
}
/// a where x >= 0 (-0 included, NaN not), else b.
template <class V>
MPOPT_HOST_DEVICE V if_nonnegative(V x, V a, V b) {
  using detail::nonnegative;
  using detail::select;
  return select(nonnegative(x), a, b);
}
/// -1, 0 or 1 (NaN: -1).
template <class V>
MPOPT_HOST_DEVICE V sign(V x) {
  return if_nonnegative(x, if_nonnegative(-x, V(0.0f), V(1.0f)), V(-1.0f));
}
}  // namespace math

namespace detail {
/// Stands in for the element view when a rule's stages are checked (update_rule).
struct element_probe {
  using vec = float;
  float grad() const;
  float param() const;
  void set_param(float) const;
  float state(std::size_t) const;
  void set_state(std::size_t, float) const;
  void norm(std::size_t, float) const;
  float tensor_scale() const;
  float matrix() const;
  void set_matrix(float) const;
};

/// Stands in for the matrix a matrix stage is handed (matrix_rule).
struct matrix_view_probe {
  std::size_t rows() const;
  std::size_t cols() const;
  void orthogonalize(const newton_schulz_settings&);
};
}  // namespace detail

/// An update rule: what the optimizer's UpdateRule must provide.
template <class R>
concept update_rule = requires(typename R::options o, const typename R::options& co, const typename R::scalars& k,
                               detail::element_probe& e) {
  { R::name } -> std::convertible_to<std::string_view>;
  /// options: per group, a struct that declares its fields (fields.hpp), and optionally
  /// validate(std::string_view group) for what involves several; lr is what param_group::set_lr sets.
  requires described<typename R::options>;
  { o.lr } -> std::same_as<double&>;
  /// state: the names of its fp32 buffers (checkpoint keys, the memory report), zero at the start
  /// unless the rule declares initial_state (rule_initial_state).
  { R::state.size() } -> std::convertible_to<std::size_t>;
  requires R::state.size() <= max_rule_state;
  requires std::convertible_to<typename decltype(R::state)::value_type, std::string_view>;
  /// scalars: per group and step, from the options and the 1-based step count; copied per chunk.
  { R::prepare(co, std::uint64_t{1}) } -> std::same_as<typename R::scalars>;
  requires std::is_trivially_copyable_v<typename R::scalars>;
  /// The stage that writes the parameters.
  R::update(k, e);
};

namespace detail {
/// The three members of a rule with a reduction (reducing_rule), each on its own, so that a rule
/// that declares one of them malformed is named (policy_members.hpp).
template <class R>
concept rule_direction = requires(const typename R::scalars& k, element_probe& e) { R::direction(k, e); };
template <class R>
concept rule_tensor_scale = requires(const typename R::scalars& k, double& kept) {
  { R::tensor_scale(k, 0.0, 0.0, kept) } -> std::same_as<float>;
};
template <class R>
concept rule_matrix = requires(const typename R::scalars& k, matrix_view_probe& m) {
  { R::matrix(k, m) } -> std::same_as<float>;
};
template <class R>
concept rule_matrix_cost = requires(std::size_t n) {
  { R::matrix_cost(n, n) } -> std::same_as<double>;
};
template <class R>
concept rule_tensor_state = requires {
  { R::tensor_state } -> std::convertible_to<std::string_view>;
};
/// The value state buffer k starts at in a group with options o (Adagrad's
/// initial_accumulator_value): `static float initial_state(const options& o, std::size_t k)`.
template <class R>
concept rule_initial_state = requires(const typename R::options& o) {
  { R::initial_state(o, std::size_t{0}) } -> std::same_as<float>;
};
/// Which state buffers never hold a negative value (Adam's exp_avg_sq): `static constexpr
/// std::array<bool, N> nonnegative_state`, N the number of buffers. Quantized state stores those with
/// an unsigned map (state_precision.hpp), twice as fine; without the member, every buffer is signed.
template <class R>
concept rule_nonnegative_state =
    std::is_same_v<std::remove_cv_t<decltype(R::nonnegative_state)>, std::array<bool, R::state.size()>>;

/// Bit k: state buffer k of rule R is non-negative (rule_nonnegative_state).
template <class R>
constexpr std::uint32_t nonnegative_state_bits() {
  std::uint32_t bits = 0;
  if constexpr (rule_nonnegative_state<R>)
    for (std::size_t k = 0; k < R::state.size(); ++k) bits |= std::uint32_t(R::nonnegative_state[k]) << k;
  return bits;
}
}  // namespace detail

/// A rule whose update needs per-tensor sums first (LAMB's ||w|| and ||u||): `direction` runs over
/// every element and feeds norm(0) and norm(1); per tensor, tensor_scale turns the two norms into
/// the factor the `update` stage reads, and a value kept per tensor (in checkpoints, by the name
/// `tensor_state`). A rule that declares one of the three declares all three, well formed, or the
/// optimizer does not compile.
template <class R>
concept reducing_rule =
    update_rule<R> && detail::rule_direction<R> && detail::rule_tensor_scale<R> && detail::rule_tensor_state<R>;

/// A rule that works on whole matrices (Muon): `direction` runs over every element and writes each
/// element's input to the matrix stage with e.set_matrix(x); then, per tensor, on the rank that
/// holds it whole, `matrix(k, m)` receives it as a rows x cols matrix in row-major order (rows: the
/// registered shape's first dimension; cols: the product of the others) and returns the factor
/// that `update` reads as e.tensor_scale(), where e.matrix() reads what the matrix stage left.
/// The matrix m offers rows(), cols(), and the backend's operations on it in place:
///   m.orthogonalize(s)   the Newton-Schulz iteration (detail/math/newton_schulz.hpp): on the host's
///                        CBLAS, or on cuBLAS where the CUDA backend keeps it (cuda_matrix.hpp)
/// Every tensor of a matrix rule is registered with a shape of two or more dimensions. A matrix
/// rule has no reduction (reducing_rule), and needs <mpopt/matrix_rule.hpp>, which runs it. It may
/// say what its stage costs on a rows x cols matrix, `static double matrix_cost(std::size_t rows,
/// std::size_t cols)`, which a layer-wise partition balances across ranks (else: the elements).
template <class R>
concept matrix_rule = update_rule<R> && detail::rule_direction<R> && detail::rule_matrix<R>;

/// A set of rules, one chosen per group by the group's options (rules.hpp: mpopt::rules<muon, adam>):
/// what the optimizer takes as its UpdateRule besides a single rule. Its members are update rules.
template <class R>
concept rule_set = requires { typename R::member_rules; };

/// What an optimizer takes as its UpdateRule: a rule, or a set of them.
template <class R>
concept rule_policy = update_rule<R> || rule_set<R>;

namespace detail {
/// A group's rate: its options' `lr`, or, for a rule set's options, the chosen member's.
template <class O>
double& group_rate(O& o) {
  if constexpr (requires { o.rate(); }) return o.rate();
  else return o.lr;
}
template <class O>
double group_rate(const O& o) {
  return group_rate(const_cast<O&>(o));  // read only
}

/// The rule that updates a group with options `o` under rule (or rule set) R.
template <class R>
std::string_view rule_name(const typename R::options& o) {
  if constexpr (rule_set<R>) return o.rule_name();
  else return R::name;
}

/// The names of the state buffers a group with options `o` keeps under rule (or rule set) R: R's
/// state, or the chosen member's.
template <class R>
std::span<const std::string_view> state_names(const typename R::options& o) {
  if constexpr (rule_set<R>) return o.state_names();
  else return R::state;
}

/// The matrix a matrix rule sees in a tensor registered with `shape` (two or more dimensions):
/// rows x cols, the first dimension by the product of the others, as Keller Jordan's Muon views a
/// convolution's weight (torch.optim.Muon takes 2-D parameters only).
inline std::pair<std::size_t, std::size_t> matrix_shape(const tensor_shape& shape) {
  const auto dims = shape.dims();
  std::size_t cols = 1;
  for (std::size_t k = 1; k < dims.size(); ++k) cols *= std::size_t(dims[k]);
  return {std::size_t(dims[0]), cols};
}

/// What updating a tensor of `size` elements registered with `shape` costs under rule R, to balance
/// whole tensors across ranks: R's matrix_cost where it declares one, else its elements.
template <class R>
double update_cost(const tensor_shape& shape, std::size_t size) {
  if constexpr (matrix_rule<R> && rule_matrix_cost<R>) {
    if (shape.dims().size() >= 2) {
      const auto [rows, cols] = matrix_shape(shape);
      return R::matrix_cost(rows, cols);
    }
  }
  return double(size);
}

/// What a group with options `o` costs to update per tensor (update_cost), and whether its tensors
/// must stay whole on one rank (a matrix rule's: every layout then cuts its shards at tensors), under
/// rule (or rule set) R: R's, or the chosen member's.
struct group_update {
  double (*cost)(const tensor_shape& shape, std::size_t size);
  bool whole_tensors;
};
template <class R>
constexpr group_update rule_update() {
  return {&update_cost<R>, matrix_rule<R>};
}
template <class R>
group_update update_of(const typename R::options& o) {
  if constexpr (rule_set<R>) return R::update_of(o);
  else return rule_update<R>();
}
}  // namespace detail

}  // namespace mpopt
