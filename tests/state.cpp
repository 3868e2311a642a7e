// Tests for save()/load(): exact resume for every valid precision x scaler x rule x layout combination,
// including a dynamic scaler with overflows before the save, and the file's safetensors layout.
#include <doctest/doctest.h>

#include "optimizer_snapshot.hpp"
#include "same_status.hpp"
#include "temp_dir.hpp"

#include <mpopt/mpopt.hpp>

#include "test_backend.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;


std::vector<unsigned char> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

enum class layout { unfused, flat };

struct tensor_def {
  const char* name;
  std::size_t size;
  std::vector<std::int64_t> shape;  // registered with add(); empty: none
};
// Two groups with their own options; sizes straddle SIMD widths. A 2-d shape, a 1-d one, none.
const std::vector<std::vector<tensor_def>> groups_def{{{"encoder.weight", 45, {9, 5}}, {"encoder.bias", 7, {7}}},
                                                      {{"head.weight", 19, {}}}};

// Steps (0-based) whose gradients hold a non-finite element; the save happens after step 6.
bool overflows_at(std::uint64_t i) { return i == 6 || i == 7 || i == 13; }
constexpr std::uint64_t steps_before_save = 7;  // N
constexpr std::uint64_t steps_after_save = 8;   // M
constexpr std::uint64_t set_lr_before_step = 3;
constexpr double changed_lr = 5e-3;

template <class Opt>
typename Opt::group_options group_options(std::size_t g) {
  typename Opt::group_options o;
  o.lr = g == 0 ? 2e-2 : 1e-2;
  o.weight_decay = g == 0 ? 0.05 : 0.0;
  o.beta2 = g == 0 ? 0.999 : 0.99;
  if constexpr (std::is_same_v<typename Opt::rule, mpopt::adam>) o.decoupled_weight_decay = g == 0;
  return o;
}

template <class Options>
Options scaler_options() {
  if constexpr (std::is_same_v<Options, mpopt::dynamic_scale_options>)
    return {.init_scale = 1024, .window = 4, .min_scale = 1, .hysteresis = 2};
  else if constexpr (std::is_same_v<Options, mpopt::static_scale_options>)
    return {.scale = 512};
  else
    return {};
}

template <class Opt>
constexpr bool is_dynamic = std::is_same_v<typename Opt::scaler_options, mpopt::dynamic_scale_options>;

// A training run: the optimizer and the model's parameters/gradients in either layout.
template <class Opt>
struct run {
  using P = typename Opt::param_type;
  using G = typename Opt::grad_type;

  std::deque<std::vector<P>> own_params;
  std::deque<std::vector<G>> own_grads;
  Opt opt;
  std::vector<std::span<P>> params;
  std::vector<std::span<G>> grads;
  std::uint64_t next_step = 0;  // index of the next step: drives the synthetic gradients

  run(layout lay, float init_seed, mpopt::optimizer_options o = {})
      : opt(o, scaler_options<typename Opt::scaler_options>()) {
    for (std::size_t gi = 0; gi < groups_def.size(); ++gi) {
      if (lay == layout::flat) {
        std::vector<mpopt::tensor_spec> specs;
        for (const auto& d : groups_def[gi]) specs.push_back({d.name, d.size, d.shape});
        auto& group = opt.add_flat_group(group_options<Opt>(gi), specs);
        for (std::size_t i = 0; i < group.size(); ++i) {
          params.push_back(group.param(i));
          grads.push_back(group.grad(i));
        }
      } else {
        auto& group = opt.add_group(group_options<Opt>(gi));
        for (const auto& d : groups_def[gi]) {
          auto& p = own_params.emplace_back(d.size, P(0.0f));
          auto& g = own_grads.emplace_back(d.size, G(0.0f));
          group.add(p, g, d.name, d.shape);
          params.emplace_back(p);
          grads.emplace_back(g);
        }
      }
    }
    for (std::size_t k = 0; k < params.size(); ++k)
      for (std::size_t i = 0; i < params[k].size(); ++i)
        params[k][i] = P(0.3f * std::sin(1.7f * float(i) + 0.9f * float(k) + init_seed) + 0.01f * init_seed);
  }
  run(const run&) = delete;
  run& operator=(const run&) = delete;

  mpopt::step_status step() {
    const std::uint64_t i = next_step++;
    if (i == set_lr_before_step) opt.group(1).set_lr(changed_lr);
    const float scale = float(opt.loss_scale());
    for (std::size_t k = 0; k < grads.size(); ++k)
      for (std::size_t e = 0; e < grads[k].size(); ++e)
        grads[k][e] = G(0.05f * std::sin(0.61f * float(e) + 1.3f * float(k) + 0.77f * float(i)) * scale);
    if (overflows_at(i)) {
      const float bad = i % 2 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
      grads[i % grads.size()][i % 5] = G(bad);
    }
    return opt.step();
  }

  optimizer_snapshot snap() const { return snapshot_of(const_cast<Opt&>(opt), params); }
};

// The safetensors header: 8-byte little-endian length, then that many bytes of JSON.
nlohmann::json read_header(const std::vector<unsigned char>& file, std::size_t& data_start) {
  REQUIRE(file.size() >= 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[std::size_t(i)];
  REQUIRE(8 + n <= file.size());
  data_start = 8 + std::size_t(n);
  REQUIRE(file[8] == '{');
  return nlohmann::json::parse(file.begin() + 8, file.begin() + std::ptrdiff_t(data_start));
}

std::size_t dtype_size(const std::string& d) {
  if (d == "F64") return 8;
  if (d == "F32") return 4;
  if (d == "F16" || d == "BF16") return 2;
  return 0;
}

// Checks the file is a valid safetensors file listing param/, master/, exp_avg/, exp_avg_sq/ tensors with the
// optimizer's current values.
template <class Opt>
void check_file_layout(const fs::path& path, const run<Opt>& r) {
  const auto file = read_file(path);
  std::size_t data_start = 0;
  const nlohmann::json h = read_header(file, data_start);
  REQUIRE(h.is_object());
  CHECK(data_start % 8 == 0);
  REQUIRE(h.contains("__metadata__"));
  const auto& meta = h["__metadata__"];
  REQUIRE(meta.is_object());
  // Not a structured binding: clang before 16 cannot capture one in CHECK_MESSAGE's lambda.
  for (const auto& item : meta.items()) CHECK_MESSAGE(item.value().is_string(), item.key());  // safetensors: str -> str

  const std::string param_dtype = std::is_same_v<typename Opt::param_type, float>            ? "F32"
                                  : std::is_same_v<typename Opt::param_type, mpopt::half>     ? "F16"
                                                                                             : "BF16";
  const bool has_master = Opt::precision::has_master;
  // Every tensor's extent; they must tile the data section exactly (safetensors forbids holes).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> extents;
  std::size_t expected_tensors = 0;
  auto check_tensor = [&](const std::string& key, const std::string& dtype, std::size_t n,
                          const std::vector<unsigned char>& expected_bytes, const std::vector<std::int64_t>& shape = {}) {
    CAPTURE(key);
    ++expected_tensors;
    REQUIRE(h.contains(key));
    const auto& e = h[key];
    CHECK(e.at("dtype") == dtype);
    // The registered shape for a parameter and each of its state tensors; [n] without one.
    CHECK(e.at("shape") == (shape.empty() ? nlohmann::json::array({n}) : nlohmann::json(shape)));
    const auto begin = e.at("data_offsets")[0].get<std::uint64_t>();
    const auto end = e.at("data_offsets")[1].get<std::uint64_t>();
    REQUIRE(end - begin == n * dtype_size(dtype));
    REQUIRE(data_start + end <= file.size());
    extents.emplace_back(begin, end);
    CHECK(std::equal(expected_bytes.begin(), expected_bytes.end(), file.begin() + std::ptrdiff_t(data_start + begin)));
  };
  std::size_t t = 0;
  for (const auto& group : groups_def)
    for (const auto& d : group) {
      const std::string name = d.name;
      check_tensor("param/" + name, param_dtype, d.size,
                   bytes_of(std::span<const typename Opt::param_type>(r.params[t])), d.shape);
      if (has_master) check_tensor("master/" + name, "F32", d.size, bytes_of(r.opt.master(t)), d.shape);
      else CHECK_FALSE(h.contains("master/" + name));
      check_tensor("exp_avg/" + name, "F32", d.size, bytes_of(r.opt.moment(0, t)), d.shape);
      check_tensor("exp_avg_sq/" + name, "F32", d.size, bytes_of(r.opt.moment(1, t)), d.shape);
      ++t;
    }
  if constexpr (std::is_same_v<typename Opt::rule, mpopt::lamb>)
    check_tensor("lamb_coeffs", "F64", r.opt.tensor_count(), bytes_of(r.opt.lamb_coeffs()));
  CHECK(h.size() == expected_tensors + 1);  // nothing else but __metadata__
  std::sort(extents.begin(), extents.end());
  std::uint64_t cursor = 0;
  for (const auto& [b, e] : extents) {
    CHECK(b == cursor);
    cursor = e;
  }
  CHECK(data_start + cursor == file.size());
}

template <class Opt>
void check_exact_resume(layout lay) {
  CAPTURE(lay == layout::flat ? "flat" : "unfused");
  temp_dir dir;
  const auto path = dir / "resume.safetensors";

  // The uninterrupted run: N + M steps. Under stochastic rounding the fresh optimizer below has
  // another seed: load() takes the saved one back.
  const mpopt::optimizer_options seeded{.rounding_seed = 0x5EED5};
  run<Opt> whole(lay, 0.0f, seeded);
  std::vector<mpopt::step_status> statuses;
  for (std::uint64_t i = 0; i < steps_before_save + steps_after_save; ++i) statuses.push_back(whole.step());

  // The interrupted run: N steps, save.
  run<Opt> first(lay, 0.0f, seeded);
  for (std::uint64_t i = 0; i < steps_before_save; ++i) check_same_status(first.step(), statuses[i]);
  first.opt.save(path);
  check_file_layout(path, first);
  const auto at_save = first.snap();

  // A fresh optimizer: same configuration and registration, different initial parameters, original lr.
  run<Opt> resumed(lay, 2.5f);
  REQUIRE(resumed.opt.group(1).lr() != changed_lr);
  REQUIRE_FALSE(resumed.snap().params == at_save.params);
  resumed.opt.load(path);
  resumed.next_step = steps_before_save;
  CHECK(resumed.snap() == at_save);
  CHECK(resumed.opt.group(1).lr() == changed_lr);  // set_lr before the save is restored
  CHECK(resumed.opt.group(0).lr() == group_options<Opt>(0).lr);
  CHECK(resumed.opt.group(0).step() == first.opt.group(0).step());
  if constexpr (std::is_same_v<mpopt::rounding_of_t<typename Opt::precision>, mpopt::stochastic_rounding>)
    CHECK(resumed.opt.config().rounding_seed == seeded.rounding_seed);
  if constexpr (std::is_same_v<typename Opt::rule, mpopt::lamb>) {
    const auto a = resumed.opt.lamb_coeffs(), b = first.opt.lamb_coeffs();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(bitwise_equal(a[i], b[i]));
    CHECK(a.size() == 3);
  }
  if constexpr (is_dynamic<Opt>) {
    // The overflow at step 6 used up one unit of hysteresis and was the last overflow.
    CHECK(resumed.opt.scaler().iteration() == 7);
    CHECK(resumed.opt.scaler().hysteresis_left() == 1);
    CHECK(resumed.opt.loss_scale() == 2048);
  }

  // Saving again right after the load writes the same bytes.
  const auto again = dir / "again.safetensors";
  resumed.opt.save(again);
  CHECK(read_file(again) == read_file(path));

  // M more steps == steps N..N+M-1 of the uninterrupted run, bitwise.
  for (std::uint64_t i = steps_before_save; i < steps_before_save + steps_after_save; ++i) {
    CAPTURE(i);
    check_same_status(resumed.step(), statuses[i]);
  }
  CHECK(resumed.snap() == whole.snap());

  if constexpr (is_dynamic<Opt>) {
    // The schedule really exercised the restored scaler state after the load (hand-derived, init 1024,
    // window 4, hysteresis 2): step 7 overflows with one unit of hysteresis left -> halves; step 12 is the
    // 4th clean step after it -> doubles and refills the hysteresis; step 13 overflows -> held, no halving.
    const std::vector<double> expected{1024, 1024, 1024, 1024, 2048, 2048, 2048,       // before the save
                                       1024, 1024, 1024, 1024, 1024, 2048, 2048, 2048};  // after
    for (std::size_t i = 0; i < expected.size(); ++i) {
      CAPTURE(i);
      CHECK(statuses[i].scale_after == expected[i]);
    }
  }
  // The counters after the load continue the saved ones.
  CHECK(statuses.back().skipped_steps == 3);
  CHECK(statuses.back().step == steps_before_save + steps_after_save - 3);
  CHECK(statuses[7].consecutive_skips == 2);
}

// Rewrites the JSON header of state file `p` with edit() applied: tensor shapes, say. The data
// section and so the checksum (over the "mpopt" string and the data) stay valid.
void edit_header(const fs::path& p, const std::function<void(nlohmann::json&)>& edit) {
  const auto file = read_file(p);
  std::size_t data_start = 0;
  read_header(file, data_start);
  auto h = nlohmann::json::parse(file.begin() + 8, file.begin() + std::ptrdiff_t(data_start));
  edit(h);
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<unsigned char> out(8);
  for (std::size_t i = 0, n = text.size(); i < 8; ++i, n >>= 8) out[i] = static_cast<unsigned char>(n & 0xff);
  out.insert(out.end(), text.begin(), text.end());
  out.insert(out.end(), file.begin() + std::ptrdiff_t(data_start), file.end());
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(out.data()), std::streamsize(out.size()));
}

template <class P, class S, class R>
struct combo {
  using opt_t = mpopt::optimizer<P, S, mpopt::replicated, R, test_backend>;
};

/// After a load: the state is the saved one, and stepping again gives the statuses and the end state
/// of the run that went on from it.
template <class Run>
void check_replay(Run& r, const optimizer_snapshot& at_save, const std::vector<mpopt::step_status>& statuses,
                  const optimizer_snapshot& at_end) {
  CHECK(r.snap() == at_save);
  r.next_step = steps_before_save;
  for (std::uint64_t i = steps_before_save; i < steps_before_save + steps_after_save; ++i) {
    CAPTURE(i);
    check_same_status(r.step(), statuses[i]);
  }
  CHECK(r.snap() == at_end);
}

}  // namespace

TEST_SUITE("state") {

TEST_CASE_TEMPLATE("N steps, save, load into a fresh optimizer, M steps == N+M uninterrupted steps, bitwise", C,
                   combo<mpopt::fp32, mpopt::no_scaling, mpopt::adam>,
                   combo<mpopt::bf16, mpopt::no_scaling, mpopt::lamb>,
                   combo<mpopt::fp16, mpopt::dynamic_scale, mpopt::adam>,
                   combo<mpopt::fp16, mpopt::dynamic_scale, mpopt::lamb>,
                   combo<mpopt::bf16_stochastic, mpopt::no_scaling, mpopt::adam>,
                   combo<mpopt::fp16_stochastic, mpopt::dynamic_scale, mpopt::lamb>
                   HOST_ONLY(combo<mpopt::fp32, mpopt::no_scaling, mpopt::lamb>,
                             combo<mpopt::bf16, mpopt::no_scaling, mpopt::adam>,
                             combo<mpopt::fp16, mpopt::no_scaling, mpopt::adam>,
                             combo<mpopt::fp16, mpopt::no_scaling, mpopt::lamb>,
                             combo<mpopt::fp16, mpopt::static_scale, mpopt::adam>,
                             combo<mpopt::fp16, mpopt::static_scale, mpopt::lamb>)) {
  check_exact_resume<typename C::opt_t>(layout::unfused);
  check_exact_resume<typename C::opt_t>(layout::flat);
}

TEST_CASE("exact resume with gradient accumulation: save at a boundary, the next window continues identically") {
  using opt_t = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::lamb, test_backend>;
  temp_dir dir;
  const auto path = dir / "accum.safetensors";
  const mpopt::optimizer_options o{.accumulation_steps = 3};
  run<opt_t> whole(layout::flat, 0.0f, o);
  std::vector<mpopt::step_status> statuses;
  for (int i = 0; i < 21; ++i) statuses.push_back(whole.step());  // 7 windows
  run<opt_t> first(layout::flat, 0.0f, o);
  for (int i = 0; i < 9; ++i) first.step();  // 3 windows
  first.opt.save(path);
  run<opt_t> resumed(layout::flat, -1.0f, o);
  resumed.opt.load(path);
  resumed.next_step = 9;
  CHECK(resumed.snap() == first.snap());
  for (std::size_t i = 9; i < 21; ++i) {
    CAPTURE(i);
    check_same_status(resumed.step(), statuses[i]);
  }
  CHECK(resumed.snap() == whole.snap());
}

TEST_CASE("load() in the middle of an accumulation window either throws or restarts the window from the file") {
  // The file holds a state at an accumulation boundary (save() refuses anything else). Loading it into an
  // optimizer that has folded some micro-steps must not mix those stale gradients into the resumed run:
  // either load() refuses (and changes nothing) or the result behaves exactly like a fresh optimizer that
  // loaded the same file.
  using opt_t = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam, test_backend>;
  temp_dir dir;
  const auto path = dir / "boundary.safetensors";
  const mpopt::optimizer_options o{.accumulation_steps = 2};
  run<opt_t> saver(layout::unfused, 0.0f, o);
  for (int i = 0; i < 4; ++i) saver.step();
  saver.opt.save(path);

  run<opt_t> busy(layout::unfused, 1.0f, o);
  busy.next_step = 100;  // different gradients from the saver's
  for (int i = 0; i < 3; ++i) busy.step();  // one boundary, then micro-step 1 of the next window
  run<opt_t> fresh(layout::unfused, 1.0f, o);
  fresh.opt.load(path);
  fresh.next_step = 4;

  const auto before = busy.snap();
  bool refused = false;
  try {
    busy.opt.load(path);
  } catch (const mpopt::error&) {
    refused = true;
  }
  if (refused) {
    CHECK(busy.snap() == before);
  } else {
    busy.next_step = 4;
    CHECK(busy.snap() == fresh.snap());
    for (int i = 0; i < 4; ++i) {
      CAPTURE(i);
      check_same_status(busy.step(), fresh.step());
    }
    CHECK(busy.snap() == fresh.snap());
  }
}

TEST_CASE("load() rewinds a running optimizer to the saved state") {
  using opt_t = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam, test_backend>;
  temp_dir dir;
  const auto path = dir / "rewind.safetensors";
  run<opt_t> r(layout::unfused, 0.0f);
  std::vector<mpopt::step_status> statuses;
  for (std::uint64_t i = 0; i < steps_before_save; ++i) statuses.push_back(r.step());
  r.opt.save(path);
  const auto at_save = r.snap();
  for (std::uint64_t i = steps_before_save; i < steps_before_save + steps_after_save; ++i) statuses.push_back(r.step());
  const auto at_end = r.snap();
  r.opt.load(path);
  check_replay(r, at_save, statuses, at_end);
}

TEST_CASE("save() into a byte buffer or a stream writes the file's bytes; load() from them rewinds bit for bit") {
  using opt_t = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam, test_backend>;
  temp_dir dir;
  const auto path = dir / "file.safetensors";
  run<opt_t> r(layout::unfused, 0.0f);
  std::vector<mpopt::step_status> statuses;
  for (std::uint64_t i = 0; i < steps_before_save; ++i) statuses.push_back(r.step());
  r.opt.save(path);
  std::vector<std::byte> bytes(3, std::byte{7});  // replaced, not appended to
  r.opt.save(bytes);
  std::ostringstream out;
  r.opt.save(out);
  const std::string streamed = out.str();
  const auto file = read_file(path);
  REQUIRE(bytes.size() == file.size());
  CHECK(std::memcmp(bytes.data(), file.data(), file.size()) == 0);
  CHECK(streamed == std::string(file.begin(), file.end()));
  const auto at_save = r.snap();
  for (std::uint64_t i = steps_before_save; i < steps_before_save + steps_after_save; ++i) statuses.push_back(r.step());
  const auto at_end = r.snap();
  for (int from = 0; from < 2; ++from) {
    CAPTURE(from);
    if (from == 0) {
      r.opt.load(bytes);
    } else {
      std::istringstream in(streamed);
      r.opt.load(in);
    }
    check_replay(r, at_save, statuses, at_end);
  }
  // A stream that cannot take the bytes fails the save, naming it; bytes that are no state file fail
  // the load, and the optimizer stays as it was.
  std::ostringstream broken;
  broken.setstate(std::ios::badbit);
  CHECK_THROWS_WITH_AS(r.opt.save(broken), doctest::Contains("the checkpoint's stream: the stream did not take"),
                       mpopt::error);
  const std::vector<std::byte> junk(5, std::byte{1});
  const auto before = r.snap();
  CHECK_THROWS_AS(r.opt.load(std::span<const std::byte>(junk)), mpopt::error);
  CHECK(r.snap() == before);
}

TEST_CASE("the resume check can fail: a fresh optimizer that does not load diverges") {
  // Guards the harness: without the load, the continuation differs from the uninterrupted run.
  using opt_t = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam, test_backend>;
  run<opt_t> whole(layout::unfused, 0.0f);
  for (std::uint64_t i = 0; i < steps_before_save + steps_after_save; ++i) whole.step();
  run<opt_t> fresh(layout::unfused, 0.0f);
  fresh.next_step = steps_before_save;
  for (std::uint64_t i = 0; i < steps_after_save; ++i) fresh.step();
  const auto a = fresh.snap(), b = whole.snap();
  CHECK_FALSE(a.params == b.params);
  CHECK_FALSE(a.group_steps == b.group_steps);
  CHECK_FALSE(a.scaler == b.scaler);
}

TEST_CASE("the state file's metadata holds the optimizer description as a JSON string") {
  using opt_t = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::adam, test_backend>;
  temp_dir dir;
  const auto path = dir / "meta.safetensors";
  run<opt_t> r(layout::flat, 0.0f);
  for (int i = 0; i < 5; ++i) r.step();
  r.opt.save(path);
  std::size_t data_start = 0;
  const auto h = read_header(read_file(path), data_start);
  const auto& meta = h.at("__metadata__");
  CHECK(meta.at("format") == "mpopt-state");
  REQUIRE(meta.at("mpopt").is_string());
  const auto desc = nlohmann::json::parse(meta.at("mpopt").get<std::string>());
  CHECK(desc.is_object());
  CHECK(desc.dump().find("encoder.weight") != std::string::npos);
}

TEST_CASE("add() and add_flat_group() take a shape whose product is the element count; another is refused, naming the tensor") {
  using opt_t = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::adam, test_backend>;
  opt_t opt;
  std::vector<mpopt::bfloat16> w(12), wg(12), b(6), bg(6), c(5), cg(5);
  auto& group = opt.add_group({.lr = 1e-2});
  CHECK_THROWS_WITH_AS(group.add(w, wg, "w", {5, 2}), doctest::Contains("tensor 'w': shape [5, 2] holds 10 elements, the tensor has 12"),
                       mpopt::error);
  CHECK_THROWS_WITH_AS(group.add(w, wg, "w", {-3, -4}), doctest::Contains("tensor 'w': shape [-3, -4] has a negative dimension"),
                       mpopt::error);
  CHECK_THROWS_WITH_AS(group.add(w, wg, "w", {0, 12}), doctest::Contains("tensor 'w': shape [0, 12] holds 0 elements"), mpopt::error);
  CHECK(group.size() == 0);  // nothing registered: the same memory and name can still be added
  group.add(w, wg, "w", {3, 4});
  group.add(b, bg, "b", std::vector<std::size_t>{2, 1, 3});  // any range of integers
  group.add(c, cg, "c");
  CHECK(group.shape(0) == mpopt::tensor_shape{3, 4});
  CHECK(group.shape(1) == mpopt::tensor_shape{2, 1, 3});
  CHECK(group.shape(2).empty());

  CHECK_THROWS_WITH_AS(opt.add_flat_group({}, {{"f", 6, {2, 2}}}), doctest::Contains("tensor 'f': shape [2, 2] holds 4 elements, the tensor has 6"),
                       mpopt::error);
  CHECK(opt.group_count() == 1);  // no group was added
  auto& flat = opt.add_flat_group({}, {{"f", 6, {2, 3}}, {"g", 4}});
  CHECK(flat.shape(0) == mpopt::tensor_shape{2, 3});
  CHECK(flat.shape(1).empty());
}

TEST_CASE("load() takes [n] (a file saved without shapes) and any shape of n elements where no 2-d or higher shape was registered") {
  using opt_t = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam, test_backend>;
  temp_dir dir;
  const auto path = dir / "shaped.safetensors";
  run<opt_t> saver(layout::unfused, 0.0f);
  for (int i = 0; i < 3; ++i) saver.step();
  saver.opt.save(path);
  const auto at_save = saver.snap();

  // Every tensor [n], as files were before shapes: loads into the shaped registration, and the
  // next save writes the registered shapes again.
  const auto flat = dir / "flat.safetensors";
  fs::copy_file(path, flat);
  edit_header(flat, [](nlohmann::json& h) {
    for (auto& [key, t] : h.items())
      if (key != "__metadata__") {
        std::int64_t n = 1;
        for (const auto& d : t["shape"]) n *= d.get<std::int64_t>();
        t["shape"] = {n};
      }
  });
  std::size_t data_start = 0;
  REQUIRE(read_header(read_file(flat), data_start).at("param/encoder.weight").at("shape") == nlohmann::json::array({45}));
  run<opt_t> from_flat(layout::flat, 1.0f);
  from_flat.opt.load(flat);
  CHECK(from_flat.snap() == at_save);
  const auto again = dir / "again.safetensors";
  from_flat.opt.save(again);
  CHECK(read_file(again) == read_file(path));

  // head.weight was registered without a shape, encoder.bias as [7]: any shape of their element
  // count loads (a file from another tool may say [19, 1] or [1, 7]).
  const auto other = dir / "other.safetensors";
  fs::copy_file(path, other);
  edit_header(other, [](nlohmann::json& h) {
    h["param/head.weight"]["shape"] = {19, 1};
    h["exp_avg/head.weight"]["shape"] = {1, 1, 19};
    h["master/encoder.bias"]["shape"] = {1, 7};
  });
  run<opt_t> from_other(layout::unfused, 1.0f);
  from_other.opt.load(other);
  CHECK(from_other.snap() == at_save);
}

TEST_CASE("load() refuses a shape other than the registered 2-d one, naming the tensor, and changes nothing") {
  using opt_t = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::lamb, test_backend>;
  temp_dir dir;
  const auto path = dir / "shaped.safetensors";
  run<opt_t> saver(layout::flat, 0.0f);
  for (int i = 0; i < 3; ++i) saver.step();
  saver.opt.save(path);

  run<opt_t> target(layout::unfused, 1.0f);
  target.step();
  const auto before = target.snap();
  auto refused = [&](const char* key, std::vector<std::int64_t> shape, const char* message) {
    CAPTURE(key);
    const auto bad = dir / "bad.safetensors";
    fs::copy_file(path, bad, fs::copy_options::overwrite_existing);
    edit_header(bad, [&](nlohmann::json& h) { h[key]["shape"] = shape; });
    CHECK_THROWS_WITH_AS(target.opt.load(bad), doctest::Contains(message), mpopt::error);
    CHECK(target.snap() == before);
  };
  refused("exp_avg_sq/encoder.weight", {5, 9},
          "tensor 'exp_avg_sq/encoder.weight' has dtype F32 and shape [5, 9], expected F32 and [9, 5] (or [45])");
  refused("param/encoder.weight", {3, 3, 5}, "tensor 'param/encoder.weight' has dtype BF16 and shape [3, 3, 5]");
  // Values kept per tensor (LAMB's coefficients) are [tensors], nothing else.
  refused("lamb_coeffs", {1, 3}, "tensor 'lamb_coeffs' has dtype F64 and shape [1, 3], expected F64 and [3]");
  // A shape whose byte count does not match its data_offsets is the container's error.
  refused("param/head.weight", {20}, "does not match data_offsets");
}

}  // TEST_SUITE
