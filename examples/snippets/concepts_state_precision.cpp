// The snippet of docs/concepts.md, "State precision", made a translation unit.
#include <mpopt/mpopt.hpp>

void state_precision() {
  using compact = mpopt::with_state<mpopt::bf16, mpopt::bf16_state<>, mpopt::remainder16>;
  mpopt::optimizer<compact, mpopt::no_scaling, mpopt::zero2, mpopt::adam> opt;  // 6 bytes of state a parameter
}
