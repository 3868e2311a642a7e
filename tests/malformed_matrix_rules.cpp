// Matrix rules (rule.hpp, matrix_rule) that declare their members in the wrong form, as
// malformed_policies.cpp's policies: each must stop compilation on the message after its `expect:`,
// raised from its own line; built with MALFORMED_FIXED, each is mended and the file must compile.
// Apart from that file because a matrix rule's driver brings in the CBLAS. Nothing here is run.
#include <mpopt/muon.hpp>
#include <mpopt/optimizer.hpp>

#include "either.hpp"

namespace {

template <class Rule>
using optimizer = mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, Rule>;

/// Its matrix stage returns a double, which the update could not read as a float factor.
struct matrix_returns_double : mpopt::muon {
  template <class M>
  static EITHER(double, float) matrix(const scalars& k, M& m) {
    return mpopt::muon::matrix(k, m);
  }
};
/// A reduction beside the matrix stage: both would set the factor the update reads.
struct matrix_with_reduction : mpopt::muon {
#ifndef MALFORMED_FIXED
  static constexpr std::string_view tensor_state = "ratio";
  static float tensor_scale(const scalars&, double, double, double&) { return 1.0f; }
#endif
};
/// A matrix stage with nothing to write its input.
struct matrix_without_direction {
  using options = mpopt::muon_options;
  using scalars = mpopt::muon::scalars;
  static constexpr std::string_view name = "matrix_without_direction";
  static constexpr std::array<std::string_view, 0> state = {};
  static scalars prepare(const options& o, std::uint64_t t) { return mpopt::muon::prepare(o, t); }
#ifdef MALFORMED_FIXED
  template <class E>
  static void direction(const scalars&, E& e) {
    e.set_matrix(e.grad());
  }
#endif
  template <class M>
  static float matrix(const scalars& k, M& m) {
    return mpopt::muon::matrix(k, m);
  }
  template <class E>
  static void update(const scalars&, E& e) {
    e.set_param(e.param() - e.tensor_scale() * e.matrix());
  }
};

}  // namespace

static_assert(sizeof(optimizer<matrix_returns_double>));  // expect: the rule's member `matrix` must be
static_assert(sizeof(optimizer<matrix_with_reduction>));  // expect: a matrix rule declares `direction`
static_assert(sizeof(optimizer<matrix_without_direction>));  // expect: a matrix rule declares `direction`
