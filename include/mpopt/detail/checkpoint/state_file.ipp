// mpopt — the state file's definitions (state_file.hpp): inline header-only, else compiled once by
// <mpopt/src.hpp>.
#pragma once

#include "state_file.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <istream>
#include <iterator>
#include <ostream>
#include <string>

#if __has_include(<unistd.h>)
#include <unistd.h>  // fseeko
#define MPOPT_STATE_FILE_HAVE_FSEEKO 1
#else
#define MPOPT_STATE_FILE_HAVE_FSEEKO 0
#endif

namespace mpopt::detail {

MPOPT_DECL std::size_t state_dtype_size(std::string_view dtype) {
  static constexpr std::array<std::pair<std::string_view, std::size_t>, 8> table{{
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"U8", 1}}};
  for (const auto& [name, size] : table)
    if (name == dtype) return size;
  return 0;
}

MPOPT_DECL bool state_tensor_bytes(const std::vector<std::int64_t>& shape, std::size_t elem, std::uint64_t& out) {
  std::uint64_t n = elem;
  for (std::int64_t d : shape) {
    if (d < 0) return false;
    const auto ud = static_cast<std::uint64_t>(d);
    if (ud != 0 && n > UINT64_MAX / ud) return false;
    n *= ud;
  }
  out = n;
  return true;
}

MPOPT_DECL std::string state_shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

MPOPT_DECL void check_state_tensor(const std::string& name, std::string_view dtype,
                                   const std::vector<std::int64_t>& shape, std::size_t bytes) {
  if (name.empty() || name.starts_with("__"))
    throw error("state file: invalid tensor name '" + name + "' (empty or starting with \"__\")");
  const std::size_t elem = state_dtype_size(dtype);
  if (elem == 0) throw error("state file: tensor '" + name + "': unknown dtype '" + std::string(dtype) + "'");
  std::uint64_t expected = 0;
  if (!state_tensor_bytes(shape, elem, expected))
    throw error("state file: tensor '" + name + "': invalid shape " + state_shape_string(shape));
  if (expected != bytes)
    throw error("state file: tensor '" + name + "': shape " + state_shape_string(shape) + " of " + std::string(dtype) +
                " needs " + std::to_string(expected) + " bytes, data has " + std::to_string(bytes));
}

MPOPT_DECL state_stream::state_stream(const state_target& target, const nlohmann::json& meta,
                                      std::vector<tensor> tensors)
    : target_(target), tensors_(std::move(tensors)) {
  std::string meta_text;
  try {
    meta_text = meta.dump();
  } catch (const nlohmann::json::exception& e) {
    throw error(target_.path + ": cannot serialize metadata: " + e.what());
  }
  std::uint64_t data_size = 0;
  std::set<std::string_view> names;
  for (const auto& t : tensors_) {
    check_state_tensor(t.name, t.dtype, t.shape, bytes_of(t));
    if (!names.insert(t.name).second) throw error("state file: duplicate tensor name '" + t.name + "'");
    data_size += bytes_of(t);
  }
  sum_.emplace(meta_text.size() + data_size);
  sum_->update(std::as_bytes(std::span(meta_text)));

  // Key order is the map's: readers place tensors by data_offsets, not by key order. (One JSON
  // type throughout, so a translation unit instantiates nlohmann's templates once.)
  const std::string placeholder(16, '0');
  nlohmann::json header;
  header["__metadata__"] = {{"format", state_file_format},
                            {"format_version", state_format_version},
                            {"mpopt", meta_text},
                            {"checksum", placeholder}};
  std::uint64_t offset = 0;
  for (const auto& t : tensors_) {
    const std::uint64_t end = offset + bytes_of(t);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // 8 + N stays a multiple of 8
  // The first occurrence is the field itself: inside the "mpopt" string quotes are escaped.
  checksum_at_ = 8 + text.find("\"checksum\":\"" + placeholder + "\"") + 12;

  std::array<std::byte, 8> prefix{};
  for (std::size_t i = 0, n = text.size(); i < 8; ++i, n >>= 8) prefix[i] = static_cast<std::byte>(n & 0xff);
  if (!target_.in_memory()) file_.emplace(target_.path);
  put(prefix.data(), prefix.size());
  put(text.data(), text.size());
}

MPOPT_DECL void state_stream::append(std::span<const std::byte> data) {
  if (next_ == tensors_.size()) throw error(target_.path + ": more tensors than the header lists");
  const tensor& t = tensors_[next_++];
  if (data.size() != bytes_of(t))
    throw error(target_.path + ": tensor '" + t.name + "' has " + std::to_string(data.size()) + " bytes, its header " +
                std::to_string(bytes_of(t)));
  sum_->update(data);
  put(data.data(), data.size());
}

MPOPT_DECL void state_stream::finish() {
  if (next_ != tensors_.size())
    throw error(target_.path + ": " + std::to_string(tensors_.size() - next_) + " tensors were not written");
  const std::string sum = checksum64::hex(sum_->finish());
  if (target_.in_memory()) {
    std::memcpy(memory_.data() + checksum_at_, sum.data(), sum.size());
    if (target_.stream) {
      target_.stream->write(reinterpret_cast<const char*>(memory_.data()), std::streamsize(memory_.size()));
      target_.stream->flush();
      if (!*target_.stream) throw error(target_.path + ": the stream did not take the checkpoint's bytes");
    }
    if (target_.bytes) target_.bytes->swap(memory_);
    return;
  }
  if (std::fseek(file_->stream(), long(checksum_at_), SEEK_SET) != 0) file_->fail("seek failed");
  put(sum.data(), sum.size());
  file_->commit();
}

MPOPT_DECL std::uint64_t state_stream::bytes_of(const tensor& t) {
  std::uint64_t n = 0;
  state_tensor_bytes(t.shape, state_dtype_size(t.dtype), n);
  return n;
}

MPOPT_DECL void state_stream::put(const void* p, std::size_t n) {
  if (target_.in_memory()) {
    const auto* b = static_cast<const std::byte*>(p);
    memory_.insert(memory_.end(), b, b + n);
  } else if (n != 0 && std::fwrite(p, 1, n, file_->stream()) != n) {
    file_->fail("write failed");
  }
}

MPOPT_DECL void state_writer::add(std::string name, std::string_view dtype, std::vector<std::int64_t> shape,
                                  std::span<const std::byte> data) {
  check_state_tensor(name, dtype, shape, data.size());
  if (names_.contains(name)) throw error("state file: duplicate tensor name '" + name + "'");
  names_.insert(name);
  tensors_.push_back({std::move(name), std::string(dtype), std::move(shape)});
  data_.push_back(data);
}

MPOPT_DECL void state_writer::write(const state_target& target) const {
  state_stream out(target, meta_, tensors_);
  for (const auto& d : data_) out.append(d);
  out.finish();
}

MPOPT_DECL state_reader::state_reader(const state_source& source) : path_(source.path) {
  if (source.stream) {
    const std::string text((std::istreambuf_iterator<char>(*source.stream)), std::istreambuf_iterator<char>());
    if (source.stream->bad()) fail("the stream failed while it was read");
    const auto* first = reinterpret_cast<const std::byte*>(text.data());
    read_in_.assign(first, first + text.size());
  }
  if (source.bytes || source.stream) {
    memory_ = source.bytes ? *source.bytes : std::span<const std::byte>(read_in_);
    size_ = memory_.size();
  } else {
    open(source.path);
  }
  parse();
}

MPOPT_DECL std::vector<std::string> state_reader::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

MPOPT_DECL std::vector<std::byte> state_reader::bytes(std::string_view name) const {
  const entry& e = find(name);
  std::vector<std::byte> out(static_cast<std::size_t>(e.end - e.begin));
  read_at(e.begin, out);
  return out;
}

MPOPT_DECL void state_reader::read(std::string_view name, std::string_view dtype, std::size_t element_bytes,
                                   std::size_t first, std::span<std::byte> out) const {
  const entry& e = find(name);
  if (e.dtype != dtype)
    throw error(path_ + ": tensor '" + e.name + "': dtype mismatch: expected " + std::string(dtype) + ", found " +
                e.dtype);
  const std::uint64_t count = (e.end - e.begin) / element_bytes, wanted = out.size() / element_bytes;
  if (first > count || wanted > count - first)
    throw error(path_ + ": tensor '" + e.name + "': elements [" + std::to_string(first) + ", " +
                std::to_string(first + wanted) + ") are beyond its " + std::to_string(count));
  read_at(e.begin + first * element_bytes, out);
}

MPOPT_DECL const state_reader::entry& state_reader::find(std::string_view name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) fail("no tensor named '" + std::string(name) + "'");
  return entries_[it->second];
}

MPOPT_DECL void state_reader::open(const std::filesystem::path& path) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) fail("cannot read: " + ec.message());
  file_.reset(std::fopen(path.c_str(), "rb"));
  if (!file_) fail(std::string("cannot open: ") + std::strerror(errno));
  size_ = static_cast<std::uint64_t>(size);
}

MPOPT_DECL void state_reader::read_at(std::uint64_t at, std::span<std::byte> out) const {
  if (out.empty()) return;
  if (!file_) {  // in memory: parse() has checked every tensor lies within it
    if (data_start_ + at > size_ || out.size() > size_ - data_start_ - at) fail("read beyond the end");
    std::memcpy(out.data(), memory_.data() + data_start_ + at, out.size());
    return;
  }
  errno = 0;
#if MPOPT_STATE_FILE_HAVE_FSEEKO
  const bool moved = fseeko(file_.get(), off_t(data_start_ + at), SEEK_SET) == 0;  // 64-bit offsets
#else
  const bool moved = std::fseek(file_.get(), long(data_start_ + at), SEEK_SET) == 0;
#endif
  if (!moved ||
      std::fread(out.data(), 1, out.size(), file_.get()) != out.size())
    fail(std::string("read failed: ") + (errno ? std::strerror(errno) : "short read (the file shrank)"));
}

MPOPT_DECL const state_reader::header_json* state_reader::member(const header_json& obj, const char* key) {
  const auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

MPOPT_DECL bool state_reader::is_string(const header_json* v, std::string_view s) {
  return v && v->is_string() && v->get_ref<const std::string&>() == s;
}

MPOPT_DECL void state_reader::parse() {
  if (size_ == 0) fail("empty file (truncated, not an mpopt state file)");
  if (size_ < 8) fail("truncated: " + std::to_string(size_) + " bytes, less than the 8-byte header length");
  std::array<std::byte, 8> prefix{};
  read_at(0, prefix);
  std::uint64_t n = 0;
  for (std::size_t i = 8; i-- > 0;) n = (n << 8) | std::to_integer<std::uint64_t>(prefix[i]);
  if (n > 100'000'000) fail("header length " + std::to_string(n) + " exceeds 100 MB: not an mpopt state file");
  if (n > size_ - 8)
    fail("truncated: header length " + std::to_string(n) + " but only " + std::to_string(size_ - 8) +
         " bytes follow");
  std::string text(static_cast<std::size_t>(n), '\0');
  read_at(8, std::as_writable_bytes(std::span(text)));
  data_start_ = 8 + n;
  const std::uint64_t data_size = size_ - 8 - n;

  header_json header;
  try {
    header = header_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail("header is not a JSON object: not an mpopt state file");

  const header_json* meta = member(header, "__metadata__");
  if (!meta || !meta->is_object()) fail("no __metadata__: not an mpopt state file");
  for (const auto& [k, v] : meta->items())
    if (!v.is_string()) fail("__metadata__ value '" + k + "' is not a string");
  if (!is_string(member(*meta, "format"), state_file_format)) fail("format is not \"mpopt-state\": not an mpopt state file");
  const header_json* version = member(*meta, "format_version");
  if (!version) fail("missing __metadata__.format_version");
  if (!is_string(version, state_format_version))
    fail("unsupported format_version \"" + version->get<std::string>() + "\" (supported: \"" +
         std::string(state_format_version) + "\")");
  const header_json* mpopt_text = member(*meta, "mpopt");
  const header_json* stored_sum = member(*meta, "checksum");
  if (!mpopt_text) fail("missing __metadata__.mpopt");
  if (!stored_sum) fail("missing __metadata__.checksum");

  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    entries_.push_back(parse_entry(name, t, data_size));
  }

  // Tensors must tile the data section exactly, as safetensors requires. The stable sort keeps
  // zero-size tensors that share an offset in name order.
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const entry& a, const entry& b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
  std::uint64_t cursor = 0;
  for (const auto& e : entries_) {
    if (e.begin > cursor)
      fail("hole in data section: bytes [" + std::to_string(cursor) + ", " + std::to_string(e.begin) +
           ") belong to no tensor (before '" + e.name + "')");
    if (e.begin < cursor) fail("tensor '" + e.name + "' overlaps the previous tensor");
    cursor = e.end;
  }
  if (cursor != data_size)
    fail("hole in data section: " + std::to_string(data_size - cursor) + " trailing bytes belong to no tensor");
  for (std::size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].name, i);

  const std::string& mpopt = mpopt_text->get_ref<const std::string&>();
  checksum64 sum(mpopt.size() + data_size);
  sum.update(std::as_bytes(std::span(mpopt)));
  std::vector<std::byte> block(std::size_t(std::min<std::uint64_t>(data_size, 1 << 20)));
  for (std::uint64_t at = 0; at < data_size; at += block.size()) {
    const std::span<std::byte> piece(block.data(), std::size_t(std::min<std::uint64_t>(block.size(), data_size - at)));
    read_at(at, piece);
    sum.update(piece);
  }
  const std::string actual = checksum64::hex(sum.finish());
  if (actual != stored_sum->get_ref<const std::string&>())
    fail("checksum mismatch: header says " + stored_sum->get<std::string>() + ", contents hash to " + actual +
         " (the file is corrupt)");

  try {
    meta_ = nlohmann::json::parse(mpopt);
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("__metadata__.mpopt is not valid JSON: ") + e.what());
  }
}

MPOPT_DECL state_reader::entry state_reader::parse_entry(const std::string& name, const header_json& t,
                                                         std::uint64_t data_size) const {
  const std::string where = "tensor '" + name + "': ";
  if (!t.is_object()) fail(where + "entry is not an object");
  const header_json* dtype = member(t, "dtype");
  const header_json* shape = member(t, "shape");
  const header_json* offsets = member(t, "data_offsets");
  if (!dtype || !shape || !offsets) fail(where + "needs dtype, shape and data_offsets");
  if (!dtype->is_string() || state_dtype_size(dtype->get_ref<const std::string&>()) == 0)
    fail(where + "unknown dtype " + dtype->dump());

  entry e{name, dtype->get<std::string>(), {}, 0, 0};
  if (!shape->is_array()) fail(where + "shape is not an array");
  for (const auto& d : *shape) {
    // Non-negative JSON integers parse as number_unsigned; negatives and fractions do not.
    if (!d.is_number_unsigned() || d.get<std::uint64_t>() > INT64_MAX)
      fail(where + "shape " + shape->dump() + " must hold non-negative integers");
    e.shape.push_back(static_cast<std::int64_t>(d.get<std::uint64_t>()));
  }
  if (!offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned())
    fail(where + "data_offsets " + offsets->dump() + " must be two non-negative integers");
  e.begin = (*offsets)[0].get<std::uint64_t>();
  e.end = (*offsets)[1].get<std::uint64_t>();
  if (e.begin > e.end) fail(where + "data_offsets " + offsets->dump() + " end before they begin");
  if (e.end > data_size)
    fail("truncated or corrupt: " + where + "data_offsets " + offsets->dump() +
         " run past the end of the data section (" + std::to_string(data_size) + " bytes)");
  std::uint64_t expected = 0;
  if (!state_tensor_bytes(e.shape, state_dtype_size(e.dtype), expected) || expected != e.end - e.begin)
    fail(where + "shape " + shape->dump() + " of " + e.dtype + " does not match data_offsets " +
         offsets->dump() + " (" + std::to_string(e.end - e.begin) + " bytes)");
  return e;
}

}  // namespace mpopt::detail
