// mpopt — replacing_file's definitions (replacing_file.hpp): inline header-only, else compiled once
// by <mpopt/src.hpp>.
#pragma once

#include "replacing_file.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

#include "../../error.hpp"

#if __has_include(<fcntl.h>) && __has_include(<sys/file.h>) && __has_include(<unistd.h>)
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#define MPOPT_REPLACING_FILE_POSIX 1
#else
#define MPOPT_REPLACING_FILE_POSIX 0
#endif

namespace mpopt::detail {

namespace replacing_file_parts {
inline std::atomic<unsigned long>& next_number() {
  static std::atomic<unsigned long> n{0};
  return n;
}
inline std::string writer_id() {
#if MPOPT_REPLACING_FILE_POSIX
  return std::to_string(::getpid());
#else
  return "0";
#endif
}
}  // namespace replacing_file_parts

MPOPT_DECL replacing_file::replacing_file(const std::filesystem::path& path) : path_(path) {
  using namespace replacing_file_parts;
  remove_stale();
  for (int attempt = 0; !file_; ++attempt) {
    temp_ = path_.string() + ".tmp." + writer_id() + "." + std::to_string(next_number()++);
    if (open_exclusive()) break;
    if (errno != EEXIST || attempt == 100)  // (a name taken is another writer's: left alone)
      throw error(temp_.string() + ": cannot open for writing: " + std::strerror(errno));
  }
}

MPOPT_DECL replacing_file::~replacing_file() {
  if (!file_) return;
  std::fclose(file_);
  std::error_code ec;
  std::filesystem::remove(temp_, ec);
}

MPOPT_DECL void replacing_file::commit() {
  if (std::fflush(file_) != 0) fail("flush failed");
#if MPOPT_REPLACING_FILE_POSIX
  if (::fsync(::fileno(file_)) != 0) fail("fsync failed");
#endif
  std::error_code ec;
  std::filesystem::rename(temp_, path_, ec);  // still locked: no other writer takes it for stale
  if (ec) {
    errno = ec.value();
    fail(("cannot rename into place as " + path_.string()).c_str());
  }
  const int closed = std::fclose(file_);
  file_ = nullptr;
  if (closed != 0) throw error(path_.string() + ": close failed: " + std::strerror(errno));
  sync_directory();
}

MPOPT_DECL void replacing_file::fail(const char* what) {
  const std::string message = temp_.string() + ": " + what + ": " + std::strerror(errno);
  if (file_) std::fclose(file_);
  file_ = nullptr;
  std::error_code ec;
  std::filesystem::remove(temp_, ec);
  throw error(message);
}

MPOPT_DECL std::filesystem::path replacing_file::directory() const {
  const std::filesystem::path d = path_.parent_path();
  return d.empty() ? std::filesystem::path(".") : d;
}

#if MPOPT_REPLACING_FILE_POSIX
MPOPT_DECL bool replacing_file::open_exclusive() {
  const int fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  // Another writer's cleanup may have found it unlocked in the moment before the lock: then it
  // is no longer ours under that name, and the next name is tried (errno EEXIST).
  const bool locked = ::flock(fd, LOCK_EX) == 0;
  const int lock_error = errno;
  struct stat opened {}, named {};
  const bool ours = locked && ::fstat(fd, &opened) == 0 && ::stat(temp_.c_str(), &named) == 0 &&
                    opened.st_ino == named.st_ino && opened.st_dev == named.st_dev;
  if (!ours) {
    ::close(fd);
    errno = locked ? EEXIST : lock_error;
    return false;
  }
  file_ = ::fdopen(fd, "wb");
  if (!file_) {
    const int e = errno;
    ::close(fd);
    std::error_code ec;
    std::filesystem::remove(temp_, ec);
    errno = e;
    return false;
  }
  return true;
}

MPOPT_DECL void replacing_file::remove_stale() const {
  const std::string prefix = path_.filename().string() + ".tmp";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(directory(), ec)) {
    const std::string name = entry.path().filename().string();
    if (name != prefix && !name.starts_with(prefix + ".")) continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) ::unlink(entry.path().c_str());
    ::close(fd);
  }
}

MPOPT_DECL void replacing_file::sync_directory() const {
  const int fd = ::open(directory().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  const bool synced = ::fsync(fd) == 0;
  const int e = errno;
  ::close(fd);
  if (!synced && e != EINVAL) {
    errno = e;
    throw error(path_.string() + ": the directory's fsync failed: " + std::strerror(e));
  }
}
#else
MPOPT_DECL bool replacing_file::open_exclusive() {
  file_ = std::fopen(temp_.string().c_str(), "wbx");
  if (!file_ && errno == 0) errno = EEXIST;
  return file_ != nullptr;
}
MPOPT_DECL void replacing_file::remove_stale() const {}
MPOPT_DECL void replacing_file::sync_directory() const {}
#endif

}  // namespace mpopt::detail
