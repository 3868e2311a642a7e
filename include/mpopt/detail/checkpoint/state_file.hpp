// mpopt — the optimizer's checkpoint container: a safetensors-compatible file.
//
// Layout (all of it readable by the Python `safetensors` package):
//   [8 bytes]  N, little-endian uint64: length of the JSON header
//   [N bytes]  UTF-8 JSON object, starting with '{', padded with trailing spaces so (8 + N) % 8 == 0
//   [rest]     data section: tensors back to back in the order they were added, no padding
//              (safetensors forbids holes), so readers memcpy instead of casting pointers.
// Header:
//   {"__metadata__": {"format": "mpopt-state", "format_version": "1",
//                     "mpopt": "<the optimizer's JSON, serialized>", "checksum": "<16 hex digits>"},
//    "<tensor>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
// data_offsets are relative to the start of the data section. The checksum is MurmurHash64A (see
// checksum64) over the bytes of the "mpopt" string followed by the whole data section.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../error.hpp"
#include "checksum.hpp"
#include "../config.hpp"
#include "replacing_file.hpp"
#include "state_dtype.hpp"
#include "state_place.hpp"

namespace mpopt::detail {

/// Bytes per element of a safetensors dtype we support; 0 for anything else.
MPOPT_DECL std::size_t state_dtype_size(std::string_view dtype);

/// out = product(shape) * elem; false on a negative dimension or on overflow.
MPOPT_DECL bool state_tensor_bytes(const std::vector<std::int64_t>& shape, std::size_t elem, std::uint64_t& out);

MPOPT_DECL std::string state_shape_string(const std::vector<std::int64_t>& shape);

inline constexpr std::string_view state_file_format = "mpopt-state";
inline constexpr std::string_view state_format_version = "1";

/// Rejects a tensor a state file cannot hold: a reserved or empty name, an unknown dtype, a shape
/// that does not match its byte count.
MPOPT_DECL void check_state_tensor(const std::string& name, std::string_view dtype,
                                   const std::vector<std::int64_t>& shape, std::size_t bytes);

/// Writes a state file tensor by tensor, holding none of them: the header (every tensor's name, dtype
/// and shape) goes first, then each tensor's bytes in order, the checksum filled in at the end.
/// finish() puts a file in place of `path` (replacing_file.hpp): a crash, a failure or another
/// writer leaves a complete checkpoint under the real name, never a partial or mixed file;
/// destroyed unfinished, it removes its temporary file. Into memory, the bytes collect aside and
/// finish() hands them over, so an unfinished save leaves the target as it was.
class state_stream {
 public:
  struct tensor {
    std::string name;
    std::string dtype;
    std::vector<std::int64_t> shape;
  };

  MPOPT_DECL state_stream(const state_target& target, const nlohmann::json& meta, std::vector<tensor> tensors);

  state_stream(const state_stream&) = delete;
  state_stream& operator=(const state_stream&) = delete;

  /// The next tensor's bytes, whole.
  MPOPT_DECL void append(std::span<const std::byte> data);

  MPOPT_DECL void finish();

 private:
  MPOPT_DECL static std::uint64_t bytes_of(const tensor& t);
  MPOPT_DECL void put(const void* p, std::size_t n);

  state_target target_;
  std::vector<tensor> tensors_;
  std::size_t next_ = 0;
  std::optional<checksum64> sum_;
  std::size_t checksum_at_ = 0;
  std::optional<replacing_file> file_;
  std::vector<std::byte> memory_;  ///< the bytes of a target in memory, until finish()
};

/// Collects tensors held elsewhere and writes them as one state file.
class state_writer {
 public:
  /// The optimizer's own metadata; stored serialized as __metadata__["mpopt"].
  void set_metadata(nlohmann::json meta) { meta_ = std::move(meta); }

  /// Records a tensor without copying: `data` must stay alive until write().
  MPOPT_DECL void add(std::string name, std::string_view dtype, std::vector<std::int64_t> shape,
                      std::span<const std::byte> data);

  template <state_element T>
  void add(std::string name, std::vector<std::int64_t> shape, std::span<const T> data) {
    add(std::move(name), state_dtype<T>::value, std::move(shape), std::as_bytes(data));
  }

  /// Writes every tensor (see state_stream).
  MPOPT_DECL void write(const state_target& target) const;
  void write(const std::filesystem::path& path) const { write(state_target{path.string()}); }

 private:
  nlohmann::json meta_ = nlohmann::json::object();
  std::vector<state_stream::tensor> tensors_;
  std::vector<std::span<const std::byte>> data_;
  std::set<std::string, std::less<>> names_;
};

class state_reader {
 public:
  /// Reads the header and validates structure and checksum (streaming through the data) before
  /// returning. Tensors are read from the open file on demand: a rank reads only its part.
  MPOPT_DECL explicit state_reader(const state_source& source);
  explicit state_reader(const std::filesystem::path& path) : state_reader(state_source{path.string()}) {}

  const nlohmann::json& metadata() const { return meta_; }
  bool contains(std::string_view name) const { return index_.contains(name); }

  MPOPT_DECL std::vector<std::string> names() const;

  std::string_view dtype(std::string_view name) const { return find(name).dtype; }
  const std::vector<std::int64_t>& shape(std::string_view name) const { return find(name).shape; }

  MPOPT_DECL std::vector<std::byte> bytes(std::string_view name) const;

  /// Copies tensor `name` into `out` after checking its dtype and element count.
  template <state_element T>
  void read(std::string_view name, std::span<T> out) const {
    const entry& e = find(name);
    const std::uint64_t count = (e.end - e.begin) / sizeof(T);
    if (e.dtype == state_dtype<T>::value && count != out.size())
      throw error(path_ + ": tensor '" + e.name + "': size mismatch: expected " + std::to_string(out.size()) +
                  " elements, found " + std::to_string(count) + " (shape " + state_shape_string(e.shape) + ")");
    read(name, 0, out);
  }

  /// Copies elements [first, first + out.size()) of tensor `name` (a shard's part of it).
  template <state_element T>
  void read(std::string_view name, std::size_t first, std::span<T> out) const {
    read(name, state_dtype<T>::value, sizeof(T), first, std::as_writable_bytes(out));
  }
  /// The same for elements of `dtype`, `element_bytes` each: out holds whole elements.
  MPOPT_DECL void read(std::string_view name, std::string_view dtype, std::size_t element_bytes, std::size_t first,
                       std::span<std::byte> out) const;

 private:
  struct entry {
    std::string name;
    std::string dtype;
    std::vector<std::int64_t> shape;
    std::uint64_t begin, end;  // relative to the data section
  };

  [[noreturn]] void fail(const std::string& what) const { throw error(path_ + ": " + what); }

  MPOPT_DECL const entry& find(std::string_view name) const;

  MPOPT_DECL void open(const std::filesystem::path& path);

  /// Reads out.size() bytes at `at` past the start of the data section (of the file until parse()
  /// has found it).
  MPOPT_DECL void read_at(std::uint64_t at, std::span<std::byte> out) const;

  using header_json = nlohmann::json;

  MPOPT_DECL static const header_json* member(const header_json& obj, const char* key);
  MPOPT_DECL static bool is_string(const header_json* v, std::string_view s);

  MPOPT_DECL void parse();

  MPOPT_DECL entry parse_entry(const std::string& name, const header_json& t, std::uint64_t data_size) const;

  struct closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::string path_;
  std::unique_ptr<std::FILE, closer> file_;
  std::span<const std::byte> memory_;  ///< the file's bytes, where it is in memory
  std::vector<std::byte> read_in_;     ///< what a stream held, which memory_ views
  std::uint64_t size_ = 0;
  std::uint64_t data_start_ = 0;  // where the data section begins (8 + header length)
  std::vector<entry> entries_;
  std::map<std::string, std::size_t, std::less<>> index_;
  nlohmann::json meta_;
};

}  // namespace mpopt::detail

#if !defined(MPOPT_SEPARATE_COMPILATION)
#include "state_file.ipp"
#endif
