// A fresh directory under the system temp folder (or `root`), removed with everything in it.
#pragma once

#include <filesystem>
#include <random>
#include <string>
#include <system_error>

struct temp_dir {
  std::filesystem::path path;
  explicit temp_dir(const std::string& prefix = "mpopt_test_",
                    const std::filesystem::path& root = std::filesystem::temp_directory_path()) {
    std::random_device rd;
    path = root / (prefix + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
};
