// What every multi-rank suite reads before its own code (mpi_harness.hpp): precompiled once for
// each executable of them (tests/meson.build), which loads in about a third of the time it takes
// to read. Nothing of the tests' own.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <mpopt/mpi.hpp>
#include <mpopt/mpopt.hpp>
#ifdef MPOPT_TEST_DEVICE_BACKEND
#include <mpopt/cuda.hpp>
#endif
