// Tests for the checkpoint container (include/mpopt/detail/checkpoint/state_file.hpp).
#include <doctest/doctest.h>

#include "error_of.hpp"
#include "temp_dir.hpp"

#include <mpopt/detail/checkpoint/state_file.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;
using mpopt::detail::checksum64;
using mpopt::detail::state_reader;
using mpopt::detail::state_writer;
using ojson = nlohmann::ordered_json;
using bytes = std::vector<std::byte>;


bytes file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bytes b(c.size());
  if (!c.empty()) std::memcpy(b.data(), c.data(), c.size());
  return b;
}

void write_bytes(const fs::path& p, std::span<const std::byte> b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::uint64_t le64(const bytes& b) {
  std::uint64_t n = 0;
  for (std::size_t i = 8; i-- > 0;) n = (n << 8) | std::to_integer<std::uint64_t>(b[i]);
  return n;
}

std::string reject(const fs::path& p) {
  return error_of([&] { state_reader r(p); });
}

template <class C>
bytes to_bytes(const C& c) {
  const auto b = std::as_bytes(std::span(c));
  return bytes(b.begin(), b.end());
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// The temporary files of `name` in `dir` (replacing_file.hpp: name.tmp.<writer>.<n>).
std::vector<std::string> temporaries(const fs::path& dir, const std::string& name) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with(name + ".tmp")) found.push_back(e.path().filename().string());
  return found;
}

/// A resource limit of this process lowered for the scope (a write past RLIMIT_FSIZE then fails
/// with EFBIG instead of a signal).
struct limit {
  int resource;
  rlimit was{};
  limit(int r, rlim_t value) : resource(r) {
    std::signal(SIGXFSZ, SIG_IGN);
    getrlimit(resource, &was);
    rlimit lowered = was;
    lowered.rlim_cur = value;
    setrlimit(resource, &lowered);
  }
  ~limit() { setrlimit(resource, &was); }
  limit(const limit&) = delete;
  limit& operator=(const limit&) = delete;
};

/// A checkpoint of one writer: its letter in the metadata and in every byte of its tensors, many
/// small ones, so that writing it takes many writes that another writer could come between.
constexpr std::size_t writer_tensors = 64, writer_tensor_bytes = 4096;
void write_as(char writer, const fs::path& p) {
  state_writer w;
  w.set_metadata({{"writer", std::string(1, writer)}});
  const std::vector<std::uint8_t> data(writer_tensor_bytes, std::uint8_t(writer));
  for (std::size_t t = 0; t < writer_tensors; ++t)
    w.add<std::uint8_t>("t" + std::to_string(t), {std::int64_t(writer_tensor_bytes)}, data);
  w.write(p);
}
/// Whether p holds one writer's whole checkpoint (the checksum checked on reading).
bool whole(const fs::path& p) {
  try {
    const state_reader r(p);
    const std::string writer = r.metadata().at("writer").get<std::string>();
    std::vector<std::uint8_t> data(writer_tensor_bytes);
    for (std::size_t t = 0; t < writer_tensors; ++t) {
      r.read<std::uint8_t>("t" + std::to_string(t), std::span<std::uint8_t>(data));
      if (writer.size() != 1 || !std::ranges::all_of(data, [&](std::uint8_t b) { return b == std::uint8_t(writer[0]); }))
        return false;
    }
    return true;
  } catch (const mpopt::error& e) {
    MESSAGE(e.what());
    return false;
  }
}
/// A child process running f, which exits 0 if f returns.
template <class F>
pid_t child(F&& f) {
  const pid_t pid = fork();
  if (pid == 0) {
    try {
      f();
    } catch (...) {
      _exit(1);
    }
    _exit(0);
  }
  return pid;
}
int exit_status(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Checks the message starts with "mpopt: <path>: " and contains `part`.
void check_rejected(const fs::path& p, const std::string& part) {
  const std::string msg = reject(p);
  INFO(msg);
  CHECK(msg.starts_with("mpopt: " + p.string() + ": "));
  CHECK(has(msg, part));
}

// The sample checkpoint: every dtype, a scalar, a zero-element tensor and odd byte counts, so most
// tensors start at unaligned offsets.
struct sample {
  std::vector<float> f32{1.5f, -2.25f, 3.0f, 1e-30f, -0.0f, 6.5f, 7.0f};
  std::vector<std::uint8_t> u8{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
  std::vector<double> f64 = [] {
    std::vector<double> v(15);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.1 * static_cast<double>(i) - 0.7;
    return v;
  }();
  std::vector<float> empty;
  std::vector<std::int64_t> step{-1234567890123LL};
  std::vector<std::int32_t> i32{-1, 2, -3, 4, -5, 6};
  bytes f16 = bytes(6, std::byte{0x3c});
  bytes bf16 = bytes(10, std::byte{0x7f});
  nlohmann::json meta = {{"optimizer", "adam"},
                         {"step", 12345},
                         {"lr", 0.001},
                         {"groups", {{{"name", "decay"}, {"ids", {1, 2, 3}}}}},
                         {"note", "h\xc3\xa9llo \"quoted\""}};

  void write(const fs::path& p) const {
    state_writer w;
    w.set_metadata(meta);
    w.add<float>("layer.0.weight", {7}, f32);
    w.add<std::uint8_t>("mask", {13}, u8);
    w.add<double>("master", {3, 5}, f64);
    w.add<float>("empty", {0, 4}, empty);
    w.add<std::int64_t>("step", {}, step);
    w.add<std::int32_t>("ids", {2, 3}, i32);
    w.add("half", "F16", {3}, f16);
    w.add("bhalf", "BF16", {1, 5}, bf16);
    w.write(p);
  }
  static std::vector<std::string> names() {
    return {"layer.0.weight", "mask", "master", "empty", "step", "ids", "half", "bhalf"};
  }
};

// Writes a hand-made file: `tensors` (a header without __metadata__) and `data`, with valid mpopt
// metadata and checksum, which `edit` may then alter. Lets each rejection test break one thing.
void craft(const fs::path& p, const ojson& tensors, const bytes& data, const std::function<void(ojson&)>& edit = {}) {
  const std::string mpopt = R"({"step":1})";
  checksum64 sum(mpopt.size() + data.size());
  sum.update(std::as_bytes(std::span(mpopt)));
  sum.update(data);
  ojson header;
  header["__metadata__"] = {{"format", "mpopt-state"},
                            {"format_version", "1"},
                            {"mpopt", mpopt},
                            {"checksum", checksum64::hex(sum.finish())}};
  for (const auto& [k, v] : tensors.items()) header[k] = v;
  if (edit) edit(header);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  bytes file(8);
  for (std::size_t i = 0, n = text.size(); i < 8; ++i, n >>= 8) file[i] = std::byte(n & 0xff);
  for (char c : text) file.push_back(std::byte(static_cast<unsigned char>(c)));
  file.insert(file.end(), data.begin(), data.end());
  write_bytes(p, file);
}

// Raw header text (not necessarily JSON) with a correct length prefix.
void craft_raw(const fs::path& p, const std::string& text) {
  bytes file(8);
  for (std::size_t i = 0, n = text.size(); i < 8; ++i, n >>= 8) file[i] = std::byte(n & 0xff);
  for (char c : text) file.push_back(std::byte(static_cast<unsigned char>(c)));
  write_bytes(p, file);
}

// Two tensors, a: F32 [2] at [0, 8) and b: U8 [3] at [8, 11).
const ojson two_tensors = {{"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
                           {"b", {{"dtype", "U8"}, {"shape", {3}}, {"data_offsets", {8, 11}}}}};
const bytes eleven(11, std::byte{0x42});

// Reference one-shot MurmurHash64A (seed 0), written in its classic form.
std::uint64_t murmur64a(const std::byte* p, std::size_t len) {
  const std::uint64_t m = 0xc6a4a7935bd1e995ULL;
  std::uint64_t h = len * m;
  std::size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    std::uint64_t k;
    std::memcpy(&k, p + i, 8);
    k *= m;
    k ^= k >> 47;
    k *= m;
    h ^= k;
    h *= m;
  }
  if (len - i) {
    for (std::size_t j = len - i; j-- > 0;) h ^= std::to_integer<std::uint64_t>(p[i + j]) << (8 * j);
    h *= m;
  }
  h ^= h >> 47;
  h *= m;
  h ^= h >> 47;
  return h;
}

}  // namespace

TEST_SUITE("state_file") {

TEST_CASE("round trip restores every tensor's dtype, shape, bytes and the metadata, in insertion order") {
  temp_dir dir;
  const fs::path p = dir / "ckpt.mpopt";
  const sample s;
  s.write(p);

  const state_reader r(p);
  CHECK(r.metadata() == s.meta);
  CHECK(r.names() == sample::names());
  CHECK(r.contains("mask"));
  CHECK_FALSE(r.contains("nope"));

  CHECK(r.dtype("layer.0.weight") == "F32");
  CHECK(r.dtype("mask") == "U8");
  CHECK(r.dtype("master") == "F64");
  CHECK(r.dtype("step") == "I64");
  CHECK(r.dtype("ids") == "I32");
  CHECK(r.dtype("half") == "F16");
  CHECK(r.dtype("bhalf") == "BF16");
  CHECK(r.shape("master") == std::vector<std::int64_t>{3, 5});
  CHECK(r.shape("empty") == std::vector<std::int64_t>{0, 4});
  CHECK(r.shape("step").empty());

  std::vector<float> f32(7);
  r.read<float>("layer.0.weight", f32);
  CHECK(std::memcmp(f32.data(), s.f32.data(), 7 * sizeof(float)) == 0);  // bitwise, keeps -0.0
  std::vector<std::uint8_t> u8(13);
  r.read<std::uint8_t>("mask", u8);
  CHECK(u8 == s.u8);
  std::vector<double> f64(15);
  r.read<double>("master", f64);
  CHECK(f64 == s.f64);
  std::vector<float> empty;
  r.read<float>("empty", empty);
  CHECK(r.bytes("empty").empty());
  std::vector<std::int64_t> step(1);
  r.read<std::int64_t>("step", step);
  CHECK(step == s.step);
  std::vector<std::int32_t> i32(6);
  r.read<std::int32_t>("ids", i32);
  CHECK(i32 == s.i32);
  const auto f16 = r.bytes("half"), bf16 = r.bytes("bhalf");
  CHECK(bytes(f16.begin(), f16.end()) == s.f16);
  CHECK(bytes(bf16.begin(), bf16.end()) == s.bf16);
}

TEST_CASE("a checkpoint without tensors or metadata round trips to an empty object") {
  temp_dir dir;
  const fs::path p = dir / "empty.mpopt";
  state_writer().write(p);
  const state_reader r(p);
  CHECK(r.metadata() == nlohmann::json::object());
  CHECK(r.names().empty());
  CHECK(file_bytes(p).size() % 8 == 0);
}

TEST_CASE("header length is little-endian and 8 + header length is a multiple of 8, padded with spaces") {
  temp_dir dir;
  // Metadata strings of 16 consecutive lengths hit every padding amount.
  for (int extra = 0; extra < 16; ++extra) {
    const fs::path p = dir / ("pad" + std::to_string(extra));
    state_writer w;
    w.set_metadata({{"pad", std::string(static_cast<std::size_t>(extra), 'x')}});
    const std::vector<std::uint8_t> one{7};
    w.add<std::uint8_t>("t", {1}, one);
    w.write(p);

    const bytes b = file_bytes(p);
    const std::uint64_t n = le64(b);
    INFO("extra = " << extra << ", header length = " << n);
    CHECK((8 + n) % 8 == 0);
    REQUIRE(8 + n + 1 == b.size());
    CHECK(b[8] == std::byte{'{'});
    const std::string text(reinterpret_cast<const char*>(b.data() + 8), n);
    const std::size_t last = text.find_last_not_of(' ');
    CHECK(text[last] == '}');
    CHECK(n - (last + 1) < 8);
    CHECK(state_reader(p).metadata()["pad"].get<std::string>().size() == static_cast<std::size_t>(extra));
  }
}

TEST_CASE("layout is what safetensors expects: back-to-back tensors tiling the data section exactly") {
  temp_dir dir;
  const fs::path p = dir / "layout.mpopt";
  const sample s;
  s.write(p);

  const bytes b = file_bytes(p);
  const std::uint64_t n = le64(b);
  const auto header = nlohmann::json::parse(reinterpret_cast<const char*>(b.data() + 8),
                                            reinterpret_cast<const char*>(b.data() + 8 + n));
  const std::byte* data = b.data() + 8 + n;
  const std::uint64_t data_size = b.size() - 8 - n;

  const auto& meta = header.at("__metadata__");
  REQUIRE(meta.is_object());
  for (const auto& [k, v] : meta.items()) CHECK(v.is_string());  // safetensors wants string -> string
  CHECK(meta.at("format") == "mpopt-state");
  CHECK(meta.at("format_version") == "1");
  CHECK(meta.at("mpopt") == s.meta.dump());
  const std::string sum = meta.at("checksum");
  CHECK(sum.size() == 16);
  CHECK(sum.find_first_not_of("0123456789abcdef") == std::string::npos);

  // Offsets follow insertion order with no gaps, and end exactly at the end of the file.
  const std::vector<bytes> contents = {to_bytes(s.f32),  to_bytes(s.u8),  to_bytes(s.f64), bytes{},
                                       to_bytes(s.step), to_bytes(s.i32), s.f16,           s.bf16};
  std::uint64_t cursor = 0;
  const auto names = sample::names();
  CHECK(header.size() == names.size() + 1);
  for (std::size_t i = 0; i < names.size(); ++i) {
    INFO(names[i]);
    const auto& t = header.at(names[i]);
    CHECK(t.size() == 3);
    const auto begin = t.at("data_offsets").at(0).get<std::uint64_t>();
    const auto end = t.at("data_offsets").at(1).get<std::uint64_t>();
    CHECK(begin == cursor);
    REQUIRE(end - begin == contents[i].size());
    CHECK(bytes(data + begin, data + end) == contents[i]);
    cursor = end;
  }
  CHECK(cursor == data_size);
  CHECK(header.at("master").at("shape") == nlohmann::json{3, 5});
  CHECK(header.at("bhalf").at("dtype") == "BF16");

  // The checksum is MurmurHash64A of the mpopt string followed by the data section.
  bytes hashed = to_bytes(s.meta.dump());
  hashed.insert(hashed.end(), data, data + data_size);
  CHECK(sum == checksum64::hex(murmur64a(hashed.data(), hashed.size())));
}

TEST_CASE("checksum64 fed in arbitrary pieces equals one-shot MurmurHash64A") {
  std::mt19937_64 rng(42);
  for (std::size_t len : {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 1000, 4099}) {
    bytes b(len);
    for (auto& x : b) x = std::byte(rng() & 0xff);
    const std::uint64_t want = murmur64a(b.data(), b.size());
    for (int trial = 0; trial < 20; ++trial) {
      checksum64 h(len);
      std::size_t i = 0;
      while (i < len) {
        const std::size_t piece = std::min<std::size_t>(len - i, rng() % 13);
        h.update(std::span(b).subspan(i, piece));
        i += piece;
      }
      CHECK(h.finish() == want);
    }
  }
  CHECK(checksum64::hex(0x0123456789abcdefULL) == "0123456789abcdef");
}

TEST_CASE("rejects an empty file and files shorter than the 8-byte length prefix as truncated") {
  temp_dir dir;
  const fs::path p = dir / "short";
  write_bytes(p, {});
  check_rejected(p, "empty file");
  for (std::size_t n = 1; n < 8; ++n) {
    write_bytes(p, bytes(n, std::byte{0}));
    check_rejected(p, "truncated");
  }
}

TEST_CASE("rejects a header length larger than the file or over 100 MB") {
  temp_dir dir;
  const fs::path p = dir / "len";
  bytes b(8 + 20, std::byte{' '});
  std::fill_n(b.begin(), 8, std::byte{0});
  b[0] = std::byte{21};  // one byte more than follows
  write_bytes(p, b);
  check_rejected(p, "truncated: header length 21");
  b[0] = std::byte{0};
  b[4] = std::byte{1};  // 2^32
  write_bytes(p, b);
  check_rejected(p, "exceeds 100 MB");
}

TEST_CASE("rejects a header that is not JSON or not a JSON object") {
  temp_dir dir;
  const fs::path p = dir / "json";
  craft_raw(p, R"({"__metadata__": {"format": )");
  check_rejected(p, "header is not valid JSON");
  craft_raw(p, "[1, 2, 3]");
  check_rejected(p, "not a JSON object");
  craft_raw(p, "");
  check_rejected(p, "not valid JSON");
}

TEST_CASE("rejects files without mpopt-state metadata as not an mpopt state file") {
  temp_dir dir;
  const fs::path p = dir / "foreign";
  craft_raw(p, R"({"a": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}})");
  check_rejected(p, "not an mpopt state file");
  craft(p, two_tensors, eleven, [](ojson& h) { h["__metadata__"] = {{"format", "pt"}}; });  // plain torch
  check_rejected(p, "not an mpopt state file");
  craft(p, two_tensors, eleven, [](ojson& h) { h["__metadata__"].erase("format"); });
  check_rejected(p, "not an mpopt state file");
  craft(p, two_tensors, eleven, [](ojson& h) { h["__metadata__"]["extra"] = 3; });
  check_rejected(p, "is not a string");
  craft(p, two_tensors, eleven, [](ojson& h) { h["__metadata__"].erase("checksum"); });
  check_rejected(p, "missing __metadata__.checksum");
}

TEST_CASE("rejects an unsupported format_version") {
  temp_dir dir;
  const fs::path p = dir / "version";
  craft(p, two_tensors, eleven, [](ojson& h) { h["__metadata__"]["format_version"] = "2"; });
  check_rejected(p, "unsupported format_version \"2\"");
  craft(p, two_tensors, eleven, [](ojson& h) { h["__metadata__"].erase("format_version"); });
  check_rejected(p, "format_version");
}

TEST_CASE("accepts the crafted baseline, so each rejection below is caused by its one change") {
  temp_dir dir;
  const fs::path p = dir / "baseline";
  craft(p, two_tensors, eleven);
  const state_reader r(p);
  CHECK(r.names() == std::vector<std::string>{"a", "b"});
}

TEST_CASE("rejects an unknown dtype and malformed shapes or entries") {
  temp_dir dir;
  const fs::path p = dir / "dtype";
  craft(p, two_tensors, eleven, [](ojson& h) { h["b"]["dtype"] = "Q8"; });
  check_rejected(p, "tensor 'b': unknown dtype \"Q8\"");
  craft(p, two_tensors, eleven, [](ojson& h) { h["b"]["shape"] = {-3}; });
  check_rejected(p, "non-negative");
  craft(p, two_tensors, eleven, [](ojson& h) { h["b"]["shape"] = {1.5}; });
  check_rejected(p, "non-negative");
  craft(p, two_tensors, eleven, [](ojson& h) { h["b"].erase("shape"); });
  check_rejected(p, "needs dtype, shape and data_offsets");
  craft(p, two_tensors, eleven, [](ojson& h) { h["b"] = 5; });
  check_rejected(p, "tensor 'b': entry is not an object");
}

TEST_CASE("rejects data_offsets that are out of range, reversed, overlapping or leave holes") {
  temp_dir dir;
  const fs::path p = dir / "offsets";
  craft(p, two_tensors, eleven, [](ojson& h) { h["b"] = {{"dtype", "U8"}, {"shape", {4}}, {"data_offsets", {8, 12}}}; });
  check_rejected(p, "run past the end of the data section");
  craft(p, two_tensors, eleven, [](ojson& h) { h["b"]["data_offsets"] = {11, 8}; });
  check_rejected(p, "end before they begin");
  craft(p, two_tensors, eleven, [](ojson& h) { h["b"]["data_offsets"] = {-1, 2}; });
  check_rejected(p, "two non-negative integers");
  craft(p, two_tensors, eleven, [](ojson& h) { h["b"]["data_offsets"] = {6, 9}; });
  check_rejected(p, "tensor 'b' overlaps");
  craft(p, two_tensors, bytes(12), [](ojson& h) { h["b"]["data_offsets"] = {9, 12}; });
  check_rejected(p, "hole in data section: bytes [8, 9)");
  craft(p, two_tensors, bytes(12));  // one trailing byte no tensor owns
  check_rejected(p, "1 trailing bytes belong to no tensor");
}

TEST_CASE("rejects a shape that does not match the size given by data_offsets") {
  temp_dir dir;
  const fs::path p = dir / "shape";
  craft(p, two_tensors, eleven, [](ojson& h) { h["a"]["shape"] = {3}; });
  check_rejected(p, "tensor 'a': shape [3] of F32 does not match data_offsets [0,8]");
  craft(p, two_tensors, eleven, [](ojson& h) { h["a"]["shape"] = {1ULL << 62, 1ULL << 62}; });  // overflows
  check_rejected(p, "does not match");
}

TEST_CASE("rejects a file cut short at any point as truncated") {
  temp_dir dir;
  const fs::path full = dir / "full";
  sample().write(full);
  const bytes b = file_bytes(full);
  const fs::path p = dir / "cut";
  for (std::size_t len = 0; len < b.size(); ++len) {
    write_bytes(p, std::span(b).first(len));
    INFO("cut at " << len << " of " << b.size());
    check_rejected(p, "truncated");
  }
}

TEST_CASE("a single flipped bit anywhere in the data section is a checksum mismatch") {
  temp_dir dir;
  const fs::path full = dir / "full";
  sample().write(full);
  const bytes b = file_bytes(full);
  const std::size_t data_begin = 8 + le64(b);
  const fs::path p = dir / "flipped";
  for (std::size_t i = data_begin; i < b.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      bytes c = b;
      c[i] ^= std::byte(1u << bit);
      write_bytes(p, c);
      INFO("byte " << i << " bit " << bit);
      check_rejected(p, "checksum mismatch");
    }
  }
}

TEST_CASE("a flipped bit in the mpopt metadata string or the stored checksum is a checksum mismatch") {
  temp_dir dir;
  const fs::path full = dir / "full";
  const sample s;
  s.write(full);
  const bytes b = file_bytes(full);
  const std::string header(reinterpret_cast<const char*>(b.data() + 8), le64(b));
  const fs::path p = dir / "flipped";
  // Low bits of letters and digits keep the JSON well-formed, so only the checksum can notice.
  for (const std::string needle : {"12345", "adam", "decay", "optimizer", "\"checksum\":\""}) {
    std::size_t at = header.find(needle);
    REQUIRE(at != std::string::npos);
    std::size_t len = needle.size();
    if (needle.starts_with("\"checksum")) at += std::exchange(len, 16);  // flip the stored hex digits
    for (std::size_t i = at; i < at + len; ++i) {
      for (int bit = 0; bit < 3; ++bit) {
        bytes c = b;
        c[8 + i] ^= std::byte(1u << bit);
        write_bytes(p, c);
        INFO("header char " << i << " ('" << header[i] << "') bit " << bit);
        check_rejected(p, "checksum mismatch");
      }
    }
  }
}

TEST_CASE("reading with the wrong dtype, wrong size or a missing name names the tensor and expected vs found") {
  temp_dir dir;
  const fs::path p = dir / "ckpt";
  sample().write(p);
  const state_reader r(p);

  std::vector<double> d(7);
  std::string msg = error_of([&] { r.read<double>("layer.0.weight", d); });
  INFO(msg);
  CHECK(has(msg, "tensor 'layer.0.weight': dtype mismatch: expected F64, found F32"));

  std::vector<float> f(6);
  msg = error_of([&] { r.read<float>("layer.0.weight", f); });
  CHECK(has(msg, "tensor 'layer.0.weight': size mismatch: expected 6 elements, found 7"));
  std::vector<float> none;
  msg = error_of([&] { r.read<float>("layer.0.weight", none); });
  CHECK(has(msg, "expected 0 elements, found 7"));

  msg = error_of([&] { r.read<float>("missing", f); });
  CHECK(has(msg, "no tensor named 'missing'"));
  CHECK(has(error_of([&] { (void)r.shape("missing"); }), "no tensor named 'missing'"));
  CHECK(has(error_of([&] { (void)r.bytes("missing"); }), "no tensor named 'missing'"));
  CHECK(has(error_of([&] { (void)r.dtype("missing"); }), "no tensor named 'missing'"));
}

TEST_CASE("add rejects duplicate or reserved names, unknown dtypes and data that does not match the shape") {
  state_writer w;
  const std::vector<float> six(6);
  w.add<float>("x", {2, 3}, six);
  CHECK(has(error_of([&] { w.add<float>("x", {6}, six); }), "duplicate tensor name 'x'"));
  CHECK(has(error_of([&] { w.add<float>("__metadata__", {6}, six); }), "invalid tensor name"));
  CHECK(has(error_of([&] { w.add<float>("__x", {6}, six); }), "invalid tensor name"));
  CHECK(has(error_of([&] { w.add<float>("", {6}, six); }), "invalid tensor name"));
  CHECK(has(error_of([&] { w.add("y", "F8", {6}, std::as_bytes(std::span(six))); }), "unknown dtype 'F8'"));
  CHECK(has(error_of([&] { w.add<float>("y", {5}, six); }), "needs 20 bytes, data has 24"));
  CHECK(has(error_of([&] { w.add<float>("y", {-2, -3}, six); }), "invalid shape [-2, -3]"));
  CHECK(has(error_of([&] { w.add("y", "F16", {6}, std::as_bytes(std::span(six))); }), "needs 12 bytes"));
  w.add("y", "F16", {12}, std::as_bytes(std::span(six)));  // the failed adds left no trace
}

TEST_CASE("a nonexistent file is reported with its path") {
  temp_dir dir;
  const fs::path p = dir / "does-not-exist";
  check_rejected(p, "No such file or directory");
}

TEST_CASE("writing to an unwritable path throws with the path and the system error, leaving no temporary file") {
  temp_dir dir;
  const fs::path missing_dir = dir / "no-such-dir" / "ckpt";
  std::string msg = error_of([&] { sample().write(missing_dir); });
  INFO(msg);
  CHECK(has(msg, missing_dir.string()));
  CHECK(has(msg, "No such file or directory"));

  // The final rename fails when the target is a directory; the temporary file is cleaned up.
  const fs::path is_dir = dir / "a-directory";
  fs::create_directory(is_dir);
  msg = error_of([&] { sample().write(is_dir); });
  CHECK(has(msg, is_dir.string()));
  CHECK(has(msg, "cannot rename"));
  CHECK(temporaries(dir.path, "a-directory").empty());
  CHECK(fs::is_directory(is_dir));
}

TEST_CASE("a failed write leaves the existing checkpoint intact") {
  temp_dir dir;
  const fs::path p = dir / "ckpt";
  sample().write(p);
  const bytes before = file_bytes(p);

  // No file descriptor left to create the temporary file with; then a full disk.
  state_writer w;
  const std::vector<float> one{1.0f};
  w.add<float>("other", {1}, one);
  {
    const limit no_files(RLIMIT_NOFILE, 3);
    CHECK(has(error_of([&] { w.write(p); }), "cannot open for writing"));
  }
  CHECK(file_bytes(p) == before);
  {
    const limit full_disk(RLIMIT_FSIZE, 16);
    CHECK(has(error_of([&] { w.write(p); }), "File too large"));
  }
  CHECK(file_bytes(p) == before);
  CHECK(temporaries(dir.path, "ckpt").empty());

  // The metadata cannot be serialized (invalid UTF-8).
  w.set_metadata({{"bad", "\xff\xfe"}});
  CHECK(has(error_of([&] { w.write(p); }), "cannot serialize metadata"));
  CHECK(file_bytes(p) == before);
  CHECK(state_reader(p).names() == sample::names());
}

TEST_CASE("a successful write replaces an existing checkpoint and leaves no .tmp behind") {
  temp_dir dir;
  const fs::path p = dir / "ckpt";
  sample().write(p);
  state_writer w;
  w.set_metadata({{"step", 2}});
  const std::vector<std::int32_t> v{1, 2, 3};
  w.add<std::int32_t>("v", {3}, v);
  w.write(p);
  CHECK(temporaries(dir.path, "ckpt").empty());
  const state_reader r(p);
  CHECK(r.metadata() == nlohmann::json{{"step", 2}});
  CHECK(r.names() == std::vector<std::string>{"v"});
}

// Two processes saving to one path at once: each rename puts a whole file of one of them in place.
// /dev/shm where there is one: what is tested is the naming, locking and renaming, not the disk.
TEST_CASE("two writers of one path, 1,000 saves each: every read in between finds one writer's whole file, and "
          "none is left behind") {
  const fs::path root = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  temp_dir dir("mpopt_writers_", root);
  const fs::path p = dir / "ckpt";
  write_as('A', p);
  const pid_t a = child([&] {
    for (int i = 0; i < 1000; ++i) write_as('A', p);
  });
  const pid_t b = child([&] {
    for (int i = 0; i < 1000; ++i) write_as('B', p);
  });
  int reads = 0, bad = 0;
  std::map<pid_t, int> status;  // each writer's exit status: 0 if every save() of it succeeded
  while (status.size() < 2) {   // read while they write
    bad += !whole(p);
    ++reads;
    for (const pid_t pid : {a, b}) {
      int st = 0;
      if (!status.contains(pid) && waitpid(pid, &st, WNOHANG) == pid)
        status[pid] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
  }
  CHECK(status[a] == 0);
  CHECK(status[b] == 0);
  CHECK(bad == 0);
  CHECK(reads > 0);
  CHECK(whole(p));
  CHECK(temporaries(dir.path, "ckpt").empty());
}

TEST_CASE("writers of one path killed at any moment: the path always holds a whole file, and the next save "
          "removes the temporary files they left") {
  const fs::path root = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  temp_dir dir("mpopt_killed_", root);
  const fs::path p = dir / "ckpt";
  std::mt19937 rng(7);
  int left_behind = 0;
  for (int round = 0; round < 200; ++round) {
    const pid_t writer = child([&] {
      for (;;) write_as('K', p);
    });
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 3000)(rng)));
    kill(writer, SIGKILL);
    CHECK(exit_status(writer) == 128 + SIGKILL);
    if (fs::exists(p)) CHECK(whole(p));
    left_behind += !temporaries(dir.path, "ckpt").empty();
    write_as('P', p);
    CHECK(temporaries(dir.path, "ckpt").empty());
    CHECK(whole(p));
  }
  CHECK(left_behind > 0);  // the kills did land while a temporary file was open
}

}  // TEST_SUITE
