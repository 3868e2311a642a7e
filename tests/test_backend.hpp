// The backend the optimizer tests run on: the host backend, or, built with
// -DMPOPT_TEST_DEVICE_BACKEND and Thrust's OpenMP system, the device backend (cuda.hpp), so that
// the same tests hold it to the same float64 references.
#pragma once

#ifdef MPOPT_TEST_DEVICE_BACKEND
#include <mpopt/cuda.hpp>
using test_backend = mpopt::cuda;
#else
#include <mpopt/host.hpp>
using test_backend = mpopt::host;
#endif
