// libFuzzer target for optimizer::load(). Each input is written to a file and loaded into one of
// the optimizers of fuzz_fixture.hpp, which hold state from a few steps. load() must either accept
// the file (then the state must take a step, and loading the optimizer's own file back must restore
// every bit) or throw mpopt::error leaving every bit of the optimizer as it was. Any other
// exception aborts, and so do the sanitizers it is built with (tests/meson.build) on any report.
//
// Seeds are valid files (fuzz_seeds.cpp). Byte mutations would almost all end at the checksum, so
// the checksum of an input that parses that far is recomputed first; a checksum that is not written
// as save() writes it (16 lowercase hex digits) stays as it is, which keeps the mismatch covered.
// Half the mutations (LLVMFuzzerCustomMutator) put awkward values into the "mpopt" metadata.
#include "fuzz_fixture.hpp"
#include "optimizer_snapshot.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;

[[noreturn]] void bug(const std::string& what) {
  std::fprintf(stderr, "fuzz_load: BUG: %s\n", what.c_str());
  std::abort();
}

std::vector<unsigned char> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& p, const std::vector<std::uint8_t>& bytes) {
  std::FILE* f = std::fopen(p.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0)
    bug("cannot write " + p.string());
}

bool lowercase_hex(const std::string& s) {
  return s.size() == 16 && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// __metadata__'s "mpopt" and "checksum" strings, when the input has the 8-byte length and a JSON
// header holding them.
struct metadata {
  std::string mpopt, checksum;
  std::span<const std::uint8_t> data;
  std::size_t checksum_at = 0;  // where the stored checksum's digits are, if save() could have put them there
};
std::optional<metadata> read_metadata(std::span<const std::uint8_t> file) {
  const auto parts = fuzz::split(file);
  if (!parts) return std::nullopt;
  // nlohmann::json, as the reader parses it: both see the same values if a key is duplicated.
  const auto header = nlohmann::json::parse(parts->header.begin(), parts->header.end(), nullptr, false);
  const auto meta = header.find("__metadata__");  // end() for anything but an object
  if (meta == header.end()) return std::nullopt;
  const auto text = meta->find("mpopt"), stored = meta->find("checksum");
  if (text == meta->end() || stored == meta->end() || !text->is_string() || !stored->is_string()) return std::nullopt;
  metadata m{text->get<std::string>(), stored->get<std::string>(), parts->data};
  const std::size_t at = parts->header.find("\"checksum\":\"" + m.checksum + "\"");
  if (at != std::string_view::npos) m.checksum_at = 8 + at + 12;
  return m;
}

// Patches in the checksum the reader will compute (same length: no offset moves).
void fix_checksum(std::vector<std::uint8_t>& file, const metadata& m) {
  if (!lowercase_hex(m.checksum) || m.checksum_at == 0) return;
  const std::string sum = fuzz::checksum(m.mpopt, m.data);
  std::copy(sum.begin(), sum.end(), file.begin() + std::ptrdiff_t(m.checksum_at));
}

// The update rule the metadata names, if it parses that far.
std::string rule_of(const metadata& m) {
  const auto j = nlohmann::json::parse(m.mpopt, nullptr, false);
  const auto rule = j.find("rule");
  return rule != j.end() && rule->is_string() ? rule->get<std::string>() : "";
}

// One optimizer with state from a few steps, saved to `good` to come back to.
template <class Opt>
class target {
 public:
  target(const fs::path& dir, const std::string& name) : name_(name), good_(dir / (name + ".safetensors")), after_(dir / "after.safetensors") {
    for (bool overflow : {false, true, false, false, false}) m_.step(overflow);
    m_.opt.save(good_);
    good_bytes_ = read_file(good_);
    before_ = snap();
    steps_ = m_.steps;
  }

  void load(const fs::path& input) {
    try {
      m_.opt.load(input);
    } catch (const mpopt::error&) {
      check_unchanged("after a failed load()");
      return;
    }
    // Accepted: the state must be one a step can start from (the sanitizers watch its arithmetic);
    // then the saved file must bring back every bit.
    try {
      m_.step();
    } catch (const mpopt::error&) {
    }
    m_.steps = steps_;  // the next input sees the same gradients
    m_.opt.load(good_);
    check_unchanged("after loading " + good_.string() + " back");
  }

 private:
  optimizer_snapshot snap() { return snapshot_of(m_.opt, m_.params); }

  // The snapshot names the part that changed; save() covers what it cannot see (the step counters,
  // 1-bit LAMB's bookkeeping).
  void check_unchanged(const std::string& when) {
    const optimizer_snapshot now = snap();
    const auto differs = [&](bool same, const char* what) {
      if (!same) bug(name_ + ": " + what + " changed " + when);
    };
    differs(now.params == before_.params, "parameters");
    differs(now.masters == before_.masters, "master weights");
    differs(now.state == before_.state, "the rule's state");
    differs(now.tensor_state == before_.tensor_state, "the rule's per-tensor state (lamb_coeffs)");
    differs(now.group_steps == before_.group_steps, "group steps");
    differs(now.group_options == before_.group_options, "group options");
    differs(now.scale_bits == before_.scale_bits, "loss_scale()");
    differs(now.scaler == before_.scaler, "scaler().save()");
    m_.opt.save(after_);
    differs(read_file(after_) == good_bytes_, "the saved state (counters or other state save() writes)");
  }

  fuzz::model<Opt> m_;
  std::string name_;
  fs::path good_, after_;
  std::vector<unsigned char> good_bytes_;
  optimizer_snapshot before_;
  std::uint64_t steps_ = 0;
};

// The optimizers and a scratch directory in memory (/dev/shm where there is one), removed at exit.
struct fuzzer {
  fs::path dir;
  std::optional<target<fuzz::adam_opt>> adam;
  std::optional<target<fuzz::lamb_opt>> lamb;
  std::optional<target<fuzz::onebit_opt>> onebit;

  fuzzer() {
    std::string tmpl = (fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path()) / "mpopt_fuzz_XXXXXX";
    if (!::mkdtemp(tmpl.data())) bug("mkdtemp failed");
    dir = tmpl;
    adam.emplace(dir, "adam");
    lamb.emplace(dir, "lamb");
    onebit.emplace(dir, "onebit");
  }
  ~fuzzer() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  void run(const std::uint8_t* data, std::size_t size) {
    std::vector<std::uint8_t> file(data, data + size);
    const auto meta = read_metadata(file);
    if (meta) fix_checksum(file, *meta);
    const fs::path input = dir / "input.safetensors";
    write_file(input, file);
    // To the optimizer the file names: any other rejects it at the same check. Without a rule
    // (the reader, shared by all, rejects the file first), to the Adam one.
    const std::string rule = meta ? rule_of(*meta) : "";
    if (rule == mpopt::lamb::name) lamb->load(input);
    else if (rule == mpopt::onebit_lamb::name) onebit->load(input);
    else adam->load(input);
  }
};

// Values that do not fit the fields load() reads: floats where it wants integers, numbers out of
// every range, other JSON kinds.
const std::vector<nlohmann::json>& awkward_values() {
  static const std::vector<nlohmann::json> values{
      1e30, -1e30, 1e300, -1e300, -1, -1.0, 1.5, 0, 0.0, std::uint64_t{9007199254740993}, INT64_MAX,
      std::uint64_t{INT64_MAX} + 1, UINT64_MAX, INT64_MIN, std::int64_t{INT32_MAX} + 1, true, nullptr, "1",
      nlohmann::json::array(), nlohmann::json::object()};
  return values;
}

void collect(nlohmann::json& j, std::vector<nlohmann::json*>& nodes) {
  nodes.push_back(&j);
  if (j.is_structured())
    for (auto& child : j) collect(child, nodes);
}

// One value anywhere in the "mpopt" metadata (a member, an element, a whole object) made awkward,
// the file rebuilt around it with a valid checksum; nothing if the input has no such metadata.
std::optional<std::vector<std::uint8_t>> mutate_metadata(std::span<const std::uint8_t> file, std::minstd_rand& rng) {
  const auto meta = read_metadata(file);
  if (!meta) return std::nullopt;
  auto j = nlohmann::json::parse(meta->mpopt, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  std::vector<nlohmann::json*> nodes;
  collect(j, nodes);
  *nodes[rng() % nodes.size()] = awkward_values()[rng() % awkward_values().size()];
  return fuzz::with_metadata(file, j.dump());
}

}  // namespace

extern "C" std::size_t LLVMFuzzerMutate(std::uint8_t* data, std::size_t size, std::size_t max_size);

// Half the mutations are libFuzzer's own, on bytes: they reach the reader's checks (lengths,
// offsets, dtypes, the checksum). The other half change the metadata as a whole value, which byte
// edits would hardly ever do while keeping it valid JSON inside a JSON string.
extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size, std::size_t max_size, unsigned seed) {
  std::minstd_rand rng(seed);
  if (rng() % 2 == 0) {
    try {
      const auto file = mutate_metadata({data, size}, rng);
      if (file && file->size() <= max_size) {
        std::copy(file->begin(), file->end(), data);
        return file->size();
      }
    } catch (const std::exception&) {  // nlohmann's dump() of odd strings: mutate the bytes instead
    }
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fuzzer f;
  try {
    f.run(data, size);
  } catch (const mpopt::error& e) {  // target::load() catches the input's: this is from its own files
    bug(std::string("saving, or loading the saved state back, failed: ") + e.what());
  } catch (const std::exception& e) {
    bug(std::string("an exception other than mpopt::error escaped: ") + e.what());
  } catch (...) {
    bug("an exception other than mpopt::error escaped");
  }
  return 0;
}
