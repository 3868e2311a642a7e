// Thread counts in tests: the host backend's passes (and, in the device build, Thrust's OpenMP
// system) on n threads, splitting work down to a single element each, so that every size a test
// uses runs on all n; and the defaults back on leaving a scope.
#pragma once

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <mpopt/host.hpp>

inline void force_threads(int n) {
  mpopt::host::use_threads(n, 1);
#if defined(_OPENMP)
  omp_set_num_threads(n);
#endif
}

struct threads_restored {
#if defined(_OPENMP)
  int saved = omp_get_max_threads();
  ~threads_restored() {
    mpopt::host::use_threads(0);
    omp_set_num_threads(saved);
  }
#else
  ~threads_restored() { mpopt::host::use_threads(0); }
#endif
};
