// This process's place in MPI_COMM_WORLD, for the doctest MPI suites, and what ranks share.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>

#include "temp_dir.hpp"

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int w = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}

/// Broadcasts a string from rank 0.
inline std::string broadcast_string(std::string s) {
  int n = int(s.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  s.resize(std::size_t(n));
  MPI_Bcast(s.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  return s;
}

/// A directory rank 0 creates (and removes at the end); every rank knows its name.
struct shared_dir {
  std::optional<temp_dir> owner;
  std::filesystem::path path;
  shared_dir() {
    if (world_rank() == 0) owner.emplace("mpopt_mpi_");
    path = broadcast_string(owner ? owner->path.string() : std::string());
  }
  ~shared_dir() { MPI_Barrier(MPI_COMM_WORLD); }  // nobody still reads when rank 0 removes it
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
};
