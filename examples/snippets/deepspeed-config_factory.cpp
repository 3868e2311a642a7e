// The first snippet of docs/deepspeed-config.md, "Configuration from a DeepSpeed JSON" (the factory),
// made a translation unit; it needs no stand-ins.
#include <filesystem>
#include <utility>

// factory.cpp, the one translation unit that includes make_optimizer.hpp:
#include <mpopt/make_optimizer.hpp>
#include <mpopt/mpi.hpp>

mpopt::any_optimizer make_from(const std::filesystem::path& file) {
  mpopt::mpi comm{MPI_COMM_WORLD};
  const auto config = mpopt::deepspeed_config::read(file, comm.size());  // throws mpopt::error naming the key
  return mpopt::make_optimizer(config, std::move(comm));                 // or single_process, the default
}
