// mpopt — checkpoints: what the optimizer's save() and load() need. Include it where a program saves
// or loads; one that never does compiles none of it (<mpopt/mpopt.hpp> includes it).
#pragma once

#include "version.hpp"  // first: C++20, or a clear error

#include "detail/checkpoint/checkpoint.hpp"  // IWYU pragma: export
