// Writes the fuzzer's starting corpus into the directory named on the command line: valid
// checkpoints of the optimizers in fuzz_fixture.hpp at several points of training, and under
// regressions/ files that once exposed faults in load(), each a valid file with one field of the
// "mpopt" metadata changed (and its checksum recomputed, so load() gets past it).
#include "fuzz_fixture.hpp"

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;

// Steps a fresh model through `overflows` (true: that step gets an inf gradient) and saves it.
template <class Opt>
void save_after(const fs::path& file, const std::vector<bool>& overflows) {
  fuzz::model<Opt> m;
  for (bool overflow : overflows) m.step(overflow);
  m.opt.save(file);
}

std::vector<std::uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Writes `valid` with edit() applied to its "mpopt" metadata and the checksum to match.
void write_edited(const fs::path& valid, const fs::path& out, const std::function<void(nlohmann::json&)>& edit) {
  const std::vector<std::uint8_t> bytes = read_bytes(valid);
  const auto parts = fuzz::split(bytes);
  if (!parts) throw std::runtime_error(valid.string() + ": not a state file");
  const auto header = nlohmann::json::parse(parts->header);
  nlohmann::json mpopt = nlohmann::json::parse(header.at("__metadata__").at("mpopt").get<std::string>());
  edit(mpopt);
  const auto file = fuzz::with_metadata(bytes, mpopt.dump());
  if (!file) throw std::runtime_error(valid.string() + ": cannot rewrite its header");
  std::ofstream(out, std::ios::binary).write(reinterpret_cast<const char*>(file->data()), std::streamsize(file->size()));
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const fs::path dir = argv[1];
  fs::create_directories(dir / "regressions");

  // Valid files: first step, skipped steps (the dynamic scale halves after two in a row), a scale
  // doubled after a clean window, 1-bit LAMB before and after its compression stage starts.
  save_after<fuzz::adam_opt>(dir / "adam_1.safetensors", {false});
  save_after<fuzz::adam_opt>(dir / "adam_4_skip.safetensors", {false, true, false, false});
  save_after<fuzz::adam_opt>(dir / "adam_9_halved_doubled.safetensors",
                             {false, true, true, false, false, false, false, true, false});
  save_after<fuzz::lamb_opt>(dir / "lamb_1.safetensors", {false});
  save_after<fuzz::lamb_opt>(dir / "lamb_4_skip.safetensors", {false, false, true, false});
  save_after<fuzz::onebit_opt>(dir / "onebit_2_warmup.safetensors", {false, false});
  save_after<fuzz::onebit_opt>(dir / "onebit_5_compressed.safetensors", {false, false, true, false, false});

  // Regressions: values of the wrong kind or out of range in fields load() turns into integers,
  // doubles it must check. Each is accepted or rejected; neither may be undefined behaviour.
  using edit = std::function<void(nlohmann::json&)>;
  const std::vector<std::pair<const char*, edit>> faults{
      {"applied_steps_1e30", [](auto& j) { j["applied_steps"] = 1e30; }},
      {"group_step_1e30", [](auto& j) { j["groups"][0]["step"] = 1e30; }},
      {"scaler_iter_1e30", [](auto& j) { j["scaler"]["iter"] = 1e30; }},
      {"group_step_minus1", [](auto& j) { j["groups"][0]["step"] = -1; }},
      {"group_lr_1e300", [](auto& j) { j["groups"][0]["options"]["lr"] = 1e300; }},
      {"scaler_scale_1e300", [](auto& j) { j["scaler"]["scale"] = 1e300; }},
      {"skipped_steps_1.5", [](auto& j) { j["skipped_steps"] = 1.5; }},
      {"consecutive_skips_minus3", [](auto& j) { j["consecutive_skips"] = -3; }},
      {"hysteresis_left_1e30", [](auto& j) { j["scaler"]["hysteresis_left"] = 1e30; }},
      {"last_overflow_iter_minus1e30", [](auto& j) { j["scaler"]["last_overflow_iter"] = -1e30; }},
  };
  for (const auto& [name, f] : faults)
    write_edited(dir / "adam_4_skip.safetensors", dir / "regressions" / (std::string(name) + ".safetensors"), f);
  // The same kind of fault in 1-bit LAMB's own fields.
  const std::vector<std::pair<const char*, edit>> onebit_faults{
      {"onebit_compression_step_1e30", [](auto& j) { j["compression"]["compression_step"] = 1e30; }},
      {"onebit_world_size_1e30", [](auto& j) {  // read only where error buffers were saved
         j["compression"]["errors_saved"] = true;
         j["compression"]["world_size"] = 1e30;
       }},
      {"onebit_freeze_step_1e30", [](auto& j) { j["groups"][1]["options"]["freeze_step"] = 1e30; }},
  };
  for (const auto& [name, f] : onebit_faults)
    write_edited(dir / "onebit_5_compressed.safetensors", dir / "regressions" / (std::string(name) + ".safetensors"), f);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fuzz_seeds: %s\n", e.what());
  return 1;
}
