// Checks for the standalone MPI test programs (not doctest: every rank must run every collective in
// the same order, so a failed check counts and the program carries on).
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <system_error>

#include <mpopt/error.hpp>

namespace mpi_checks {

inline const char* program = "test";
inline int world_rank = 0, world_size = 1;
inline int passed = 0, failed = 0;

/// MPI_Init, and this rank's place in MPI_COMM_WORLD.
inline void start(int& argc, char**& argv, const char* name) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  program = name;
}

inline void expect(bool ok, const std::string& what) {
  if (ok) {
    ++passed;
    return;
  }
  ++failed;
  std::fprintf(stderr, "%s: rank %d: FAILED: %s\n", program, world_rank, what.c_str());
}

template <class F>
void expect_error(const std::string& what, F&& f) {
  try {
    f();
  } catch (const mpopt::error&) {
    ++passed;
    return;
  } catch (const std::exception& e) {
    return expect(false, what + ": threw something other than mpopt::error: " + e.what());
  }
  expect(false, what + ": did not throw");
}

/// Runs one case; an exception fails it (and, if other ranks carry on, they may wait for this one).
inline void run(const std::string& name, const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    expect(false, name + ": " + e.what());
  }
}

/// A fresh directory every rank names alike, for files they all read and write: rank 0 makes it
/// and, once every rank is done with it, removes it.
struct shared_dir {
  std::filesystem::path path;
  explicit shared_dir(const std::string& prefix) {
    std::string name =
        world_rank == 0 ? (std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()))).string() : "";
    unsigned length = unsigned(name.size());
    MPI_Bcast(&length, 1, MPI_UNSIGNED, 0, MPI_COMM_WORLD);
    name.resize(length);
    MPI_Bcast(name.data(), int(length), MPI_CHAR, 0, MPI_COMM_WORLD);
    path = name;
    if (world_rank == 0) std::filesystem::create_directories(path);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  ~shared_dir() {
    MPI_Barrier(MPI_COMM_WORLD);
    std::error_code ec;
    if (world_rank == 0) std::filesystem::remove_all(path, ec);
  }
  shared_dir(const shared_dir&) = delete;
  shared_dir& operator=(const shared_dir&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
};

/// Prints this rank's count, then MPI_Finalize; the exit status: 1 if any rank failed a check,
/// else `ok` (77 for a skip), the same on every rank.
inline int finish(int ok = 0) {
  if (ok == 0 || failed != 0)
    std::printf("%s: rank %d of %d: %d passed, %d failed\n", program, world_rank, world_size, passed, failed);
  int any_failed = failed;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed ? 1 : ok;
}

}  // namespace mpi_checks
