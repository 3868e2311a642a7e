// mpopt — a file that replaces `path` whole or not at all, whoever else writes it. It is written
// under a temporary name of its own (path.tmp.<pid>.<n>, created exclusively beside path), locked
// while it is written, synced, renamed over path while still locked, and the directory synced. A
// writer that dies leaves its temporary file unlocked: the next writer of the path removes it.
// Two writers at once each replace the file with a complete one of theirs; the last rename stays.
#pragma once

#include <cstdio>
#include <filesystem>

#include "../config.hpp"

namespace mpopt::detail {

class replacing_file {
 public:
  /// Removes the path's temporary files whose writers are gone, then opens a new one of its own.
  MPOPT_DECL explicit replacing_file(const std::filesystem::path& path);
  replacing_file(const replacing_file&) = delete;
  replacing_file& operator=(const replacing_file&) = delete;
  /// Unless committed, the temporary file goes and path stays as it was.
  MPOPT_DECL ~replacing_file();

  std::FILE* stream() const { return file_; }
  const std::filesystem::path& temp() const { return temp_; }

  /// Writes the rest to disk and puts the file in place of path.
  MPOPT_DECL void commit();

  /// Throws, naming the temporary file and the system's reason; the file goes.
  [[noreturn]] MPOPT_DECL void fail(const char* what);

 private:
  MPOPT_DECL std::filesystem::path directory() const;
  /// Creates temp_ (not there before), locked; false with errno where it cannot.
  MPOPT_DECL bool open_exclusive();
  /// Temporary files of this path that no writer holds locked: left by writers that died.
  MPOPT_DECL void remove_stale() const;
  MPOPT_DECL void sync_directory() const;

  std::filesystem::path path_, temp_;
  std::FILE* file_ = nullptr;
};

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "replacing_file.ipp"
#endif
