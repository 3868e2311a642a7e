// mpopt — where save() writes a state file and load() reads one: a file by its path, or memory (a
// byte buffer or a stream). Light, so that the optimizer's side of a checkpoint names them without
// the state file's code.
#pragma once

#include <cstddef>
#include <iosfwd>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace mpopt::detail {

/// Where a state file goes: a file in place of `path`, or memory (`bytes`, whose contents it
/// replaces, or `stream`, which it is written to whole). For memory, `path` is what messages call it.
struct state_target {
  std::string path;
  std::vector<std::byte>* bytes = nullptr;
  std::ostream* stream = nullptr;
  bool in_memory() const { return bytes || stream; }
};

/// Where a state file comes from: a file at `path`, or memory (`bytes`, or `stream`, read to its
/// end first); for memory, `path` is what messages call it.
struct state_source {
  std::string path;
  std::optional<std::span<const std::byte>> bytes = std::nullopt;
  std::istream* stream = nullptr;
};

}  // namespace mpopt::detail
