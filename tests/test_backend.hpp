// The backend the optimizer tests run on: the host backend, or, built with
// -DMPOPT_TEST_DEVICE_BACKEND and Thrust's OpenMP system, the device backend (cuda.hpp), so that
// the same tests hold it to what they hold the host backend to.
#pragma once

#ifdef MPOPT_TEST_DEVICE_BACKEND
#include <mpopt/cuda.hpp>
using test_backend = mpopt::cuda;
#else
#include <mpopt/host.hpp>
using test_backend = mpopt::host;
#endif

// A test's configurations that only the host build runs: TEST_CASE_TEMPLATE("...", C, a, b
// HOST_ONLY(c, d)). Each optimizer type costs a translation unit seconds of compiling, so the
// device build runs a host matrix only as far as it reaches device code that the device suites do
// not reach otherwise (tests/README.md, "The device build").
#ifdef MPOPT_TEST_DEVICE_BACKEND
#define HOST_ONLY(...)
#else
#define HOST_ONLY(...) , __VA_ARGS__
#endif
