// The separately compiled mode compiles the host passes of mpopt's rules in fp32, fp16 and bf16
// once; an optimizer with any other rule or precision compiles its own where it is used, from
// <mpopt/host_passes.hpp>. Without that header, such an optimizer must stop compilation on a
// message that names it, raised from its own line; a standard optimizer needs no such header. Built
// with MALFORMED_FIXED, the header is included and the file must compile cleanly.
// tests/compile_fail.py checks both; nothing here is run.
#define MPOPT_SEPARATE_COMPILATION

#include <mpopt/adam.hpp>
#include <mpopt/optimizer.hpp>
#ifdef MALFORMED_FIXED
#include <mpopt/host_passes.hpp>
#endif

#include "../examples/user_rules.hpp"

using standard = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::zero1, mpopt::adam>;
using own_rule = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::zero1, user_rules::lion>;
using own_precision = mpopt::optimizer<mpopt::bf16_stochastic, mpopt::no_scaling, mpopt::replicated, mpopt::adam>;

void make_them() {
  standard a;
  own_rule b;  // expect: include <mpopt/host_passes.hpp>
  own_precision c;  // expect: include <mpopt/host_passes.hpp>
}
