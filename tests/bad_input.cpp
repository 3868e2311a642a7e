// Tests that every invalid input throws mpopt::error naming the problem, and leaves the optimizer as it
// was: same parameters, masters, moments, counters, scale and options (bitwise), and the same future (a
// twin that never saw the bad input continues identically).
#include <doctest/doctest.h>

#include "optimizer_snapshot.hpp"
#include "same_status.hpp"
#include "error_of.hpp"
#include "temp_dir.hpp"
#include "threads.hpp"

#include <mpopt/mpopt.hpp>
#include <mpopt/detail/checkpoint/state_file.hpp>

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
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;
constexpr double d_inf = std::numeric_limits<double>::infinity();
constexpr double d_nan = std::numeric_limits<double>::quiet_NaN();

// Checks that `expr` throws mpopt::error whose message contains `needle`.
#define CHECK_ERROR(expr, needle)                                       \
  do {                                                                  \
    const std::string msg_ = error_of([&] { (void)(expr); });           \
    INFO("expression: " #expr);                                         \
    INFO("message: ", msg_);                                            \
    CHECK(msg_.rfind("mpopt: ", 0) == 0);                               \
    CHECK(msg_.find(needle) != std::string::npos);                      \
  } while (0)


std::vector<char> file_chars(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_chars(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

struct named_size {
  std::string name;
  std::size_t size;
};
using layout_def = std::vector<std::vector<named_size>>;  // tensors per group

const layout_def default_layout{{{"embed.weight", 33}, {"proj.weight", 17}}, {{"proj.bias", 5}}};

// An optimizer over user-owned tensors, with deterministic gradients (already multiplied by the loss scale).
template <class Opt>
struct rig {
  using P = typename Opt::param_type;
  using G = typename Opt::grad_type;

  std::deque<std::vector<P>> params;
  std::deque<std::vector<G>> grads;
  Opt opt;
  std::uint64_t t = 0;

  explicit rig(const layout_def& layout = default_layout, mpopt::optimizer_options o = {},
               typename Opt::scaler_options s = {}, float seed = 0)
      : opt(o, s) {
    std::size_t k = 0;
    for (std::size_t gi = 0; gi < layout.size(); ++gi) {
      typename Opt::group_options go;
      go.lr = 1e-2 / double(gi + 1);
      go.weight_decay = 0.01 * double(gi);
      auto& group = opt.add_group(go);
      for (const auto& def : layout[gi]) {
        auto& p = params.emplace_back();
        for (std::size_t i = 0; i < def.size; ++i) p.push_back(P(0.5f * std::sin(0.37f * float(i) + float(k) + seed)));
        auto& g = grads.emplace_back(def.size, G(0.0f));
        group.add(p, g, def.name);
        ++k;
      }
    }
  }
  rig(const rig&) = delete;
  rig& operator=(const rig&) = delete;

  void write_grads(bool overflow) {
    ++t;
    const float s = float(opt.loss_scale());
    std::size_t k = 0;
    for (auto& g : grads) {
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = G(0.1f * std::cos(float(t * 13 + i * 7 + k)) * s);
      ++k;
    }
    if (overflow) grads[t % grads.size()][t % 3] = G(std::numeric_limits<float>::infinity());
  }
  mpopt::step_status step(bool overflow = false) {
    write_grads(overflow);
    return opt.step();
  }

  optimizer_snapshot snap() { return snapshot_of(opt, params); }
};

// `a` saw a bad input, `b` did not: they must be identical now and after `n` more steps.
template <class Opt>
void check_twins(rig<Opt>& a, rig<Opt>& b, int n = 4) {
  REQUIRE(a.t == b.t);
  CHECK(a.snap() == b.snap());
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    const bool ov = i == 1;
    const auto sa = a.step(ov);
    const auto sb = b.step(ov);
    check_same_status(sa, sb);
  }
  CHECK(a.snap() == b.snap());
}

using fp32_adam = mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::adam>;
using fp32_lamb = mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::lamb>;
using fp16_dyn_adam = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam>;
using fp16_dyn_lamb = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::lamb>;
using fp16_static_adam = mpopt::optimizer<mpopt::fp16, mpopt::static_scale, mpopt::replicated, mpopt::adam>;
using fp16_plain_adam = mpopt::optimizer<mpopt::fp16, mpopt::no_scaling, mpopt::replicated, mpopt::adam>;
using bf16_adam = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::adam>;

const mpopt::dynamic_scale_options scaler_opts{.init_scale = 1024, .window = 3, .hysteresis = 2};

// ---------------------------------------------------------------------------------------------------
// Compile-time rejections, checked with concepts and requires-expressions (nothing here fails to compile).
struct not_a_tensor {};
static_assert(!mpopt::tensor<int>);
static_assert(!mpopt::tensor<float*>);
static_assert(!mpopt::tensor<not_a_tensor>);
static_assert(!mpopt::tensor<std::span<const float>>);  // read-only memory cannot be a parameter
static_assert(mpopt::tensor<std::vector<float>>);
static_assert(mpopt::tensor<std::span<mpopt::half>>);
static_assert(!mpopt::tensor_of<std::vector<float>, mpopt::half>);
static_assert(!mpopt::tensor_of<std::vector<mpopt::bfloat16>, mpopt::half>);
static_assert(!mpopt::precision_policy<int>);
static_assert(!mpopt::loss_scaler_policy<int>);
static_assert(!mpopt::loss_scaler_policy<mpopt::fp16>);
static_assert(mpopt::loss_scaler_policy<mpopt::dynamic_scale>);
static_assert(mpopt::precision_policy<mpopt::bf16>);
// lamb_coeffs() exists only for LAMB.
template <class O>
constexpr bool has_lamb_coeffs = requires(O& o) { o.lamb_coeffs(); };
static_assert(!has_lamb_coeffs<fp32_adam>);
static_assert(has_lamb_coeffs<fp32_lamb>);
// Options are typed: an Adam optimizer takes Adam group options, not LAMB's.
static_assert(!std::is_convertible_v<mpopt::lamb::options, fp32_adam::group_options>);
template <class O, class GroupOptions>
constexpr bool takes_group_options = requires(O& o, GroupOptions g) { o.add_group(g); };
static_assert(!takes_group_options<fp32_adam, mpopt::lamb::options>);
static_assert(takes_group_options<fp32_adam, mpopt::adam::options>);
// A static scale takes static options, not dynamic ones.
static_assert(!std::is_constructible_v<fp16_static_adam, mpopt::optimizer_options, mpopt::dynamic_scale_options>);

// The host backend models mpopt::backend_policy for every precision; every driver models
// detail::rule_driver over the optimizer's context, for every partition it serves (the device
// backend and offload: device_passes.cpp and offload.cpp).
static_assert(mpopt::backend_policy<mpopt::host, mpopt::fp32> && mpopt::backend_policy<mpopt::host, mpopt::fp16> &&
              mpopt::backend_policy<mpopt::host, mpopt::bf16_stochastic> &&
              mpopt::backend_policy<mpopt::host, mpopt::mixed_precision<mpopt::half, mpopt::half, mpopt::half>>);
static_assert(mpopt::detail::compression_passes<mpopt::host, mpopt::fp16>);
static_assert(!mpopt::backend_policy<int, mpopt::fp32>);
static_assert(!mpopt::backend_policy<mpopt::single_process, mpopt::fp32>);  // a communicator
/// The host backend with one hook taken away: params_out(), which hands the model its parameters.
struct host_without_params_out : mpopt::host {
 private:
  using mpopt::host::params_out;
};
static_assert(!mpopt::backend_policy<host_without_params_out, mpopt::fp32>);
/// State in std::vector: no zeroed(n).
struct host_with_vectors : mpopt::host {
  template <class T>
  using buffer = std::vector<T>;
};
static_assert(!mpopt::backend_policy<host_with_vectors, mpopt::fp32>);

template <class Precision, class Partition, class Rule>
using pipeline_of =
    mpopt::detail::step_pipeline<Precision, mpopt::no_scaling, Partition, Rule, mpopt::host, mpopt::single_process>;
template <class Pipeline, class Driver = typename Pipeline::driver_type>
constexpr bool drives = mpopt::detail::rule_driver<Driver, typename Pipeline::rule_context_type>;
template <class Precision, class Rule>
constexpr bool drives_every_partition = drives<pipeline_of<Precision, mpopt::replicated, Rule>> &&
                                        drives<pipeline_of<Precision, mpopt::zero1, Rule>> &&
                                        drives<pipeline_of<Precision, mpopt::zero2, Rule>>;
static_assert(drives_every_partition<mpopt::fp32, mpopt::adam> && drives_every_partition<mpopt::fp16, mpopt::lamb> &&
              drives_every_partition<mpopt::bf16, mpopt::lamb>);
static_assert(drives<pipeline_of<mpopt::fp16, mpopt::replicated, mpopt::onebit_lamb>> &&
              drives<pipeline_of<mpopt::fp32, mpopt::replicated, mpopt::onebit_adam>> &&
              drives<pipeline_of<mpopt::bf16, mpopt::replicated, mpopt::zero_one_adam>>);
/// LAMB's driver with one hook taken away: finish(), the stages after the per-tensor norms.
using lamb_pipeline = pipeline_of<mpopt::fp16, mpopt::zero1, mpopt::lamb>;
struct staged_without_finish : lamb_pipeline::driver_type {
 private:
  using lamb_pipeline::driver_type::finish;
};
static_assert(!drives<lamb_pipeline, staged_without_finish>);

// A foreign type whose traits say it lives on a device.
struct device_buffer {
  float* ptr;
  std::size_t n;
};

// ---------------------------------------------------------------------------------------------------
// load(): every bad file throws and leaves the optimizer exactly as it was.

struct load_fixture {
  temp_dir dir;
  fs::path good;
  std::vector<char> good_bytes;
  rig<fp16_dyn_adam> target{default_layout, {}, scaler_opts, 0.25f};
  rig<fp16_dyn_adam> twin{default_layout, {}, scaler_opts, 0.25f};

  load_fixture() {
    good = dir / "good.safetensors";
    rig<fp16_dyn_adam> source(default_layout, {}, scaler_opts);
    for (int i = 0; i < 5; ++i) source.step(i == 2);
    source.opt.save(good);
    good_bytes = file_chars(good);
    for (int i = 0; i < 6; ++i) {  // a different history from the source's
      target.step(i == 4);
      twin.step(i == 4);
    }
    REQUIRE(target.snap() == twin.snap());
  }

  // `needle` must be in the message of the load error; the target must be untouched.
  void reject(const fs::path& path, const std::string& needle) {
    CHECK_ERROR(target.opt.load(path), needle);
    CHECK(target.snap() == twin.snap());
  }
};

// Re-writes `good` with metadata and tensors passed through the given edits (valid container, checksum ok).
void rewrite(const fs::path& from, const fs::path& to, const std::function<void(nlohmann::json&)>& edit_meta,
             const std::function<bool(const std::string&, std::string&, std::vector<std::int64_t>&,
                                      std::vector<std::byte>&)>& edit_tensor = {}) {
  const mpopt::detail::state_reader r(from);
  nlohmann::json meta = r.metadata();
  edit_meta(meta);
  mpopt::detail::state_writer w;
  w.set_metadata(meta);
  std::deque<std::vector<std::byte>> keep;
  for (const auto& name : r.names()) {
    std::string dtype(r.dtype(name));
    std::vector<std::int64_t> shape = r.shape(name);
    const auto b = r.bytes(name);
    auto& data = keep.emplace_back(b.begin(), b.end());
    if (edit_tensor && !edit_tensor(name, dtype, shape, data)) continue;  // dropped
    w.add(name, dtype, shape, std::span<const std::byte>(data));
  }
  w.write(to);
}

template <class Opt>
fs::path save_from(const temp_dir& dir, const std::string& file, const layout_def& layout,
                   typename Opt::scaler_options s = {}) {
  rig<Opt> r(layout, {}, s);
  for (int i = 0; i < 3; ++i) r.step();
  const auto path = dir / file;
  r.opt.save(path);
  return path;
}

}  // namespace

template <>
struct mpopt::tensor_traits<device_buffer> {
  using element_type = float;
  static float* data(const device_buffer& b) { return b.ptr; }
  static std::size_t size(const device_buffer& b) { return b.n; }
  static constexpr memory_space space = memory_space::device;
};

TEST_SUITE("bad_input") {

TEST_CASE("mismatched parameter and gradient sizes throw, naming the tensor, and register nothing") {
  std::vector<float> p(4, 1.0f), g(5, 0.0f);
  fp32_adam opt;
  auto& group = opt.add_group({});
  CHECK_ERROR(group.add(p, g, "mismatched_weight"), "mismatched_weight");
  CHECK(group.size() == 0);

  std::vector<mpopt::half> hp(7, mpopt::half(1.0f)), hg(6, mpopt::half(0.0f));
  fp16_dyn_adam opt16;
  auto& g16 = opt16.add_group({});
  CHECK_ERROR(g16.add(hp, hg, "half_mismatch"), "half_mismatch");
  CHECK(g16.size() == 0);

  // The group still works with a valid tensor.
  std::vector<float> g4(4, 0.5f);
  group.add(p, g4, "ok");
  CHECK(opt.step().applied);
}

TEST_CASE("a group without tensors throws at the first step, naming the group") {
  {
    fp32_adam opt;
    std::vector<float> p(3, 1.0f), g(3, 0.1f);
    opt.add_group({}).add(p, g, "w");
    opt.add_group({});  // group 1 stays empty
    const auto before = p;
    CHECK_ERROR(opt.step(), "group 1");
    CHECK_ERROR(opt.finalize(), "group 1");
    CHECK(p == before);
    CHECK(opt.tensor_count() == 0);
  }
  {
    fp32_adam opt;
    CHECK_ERROR(opt.step(), "group");  // no groups at all
  }
  {
    fp32_adam opt;
    opt.add_flat_group({}, std::span<const mpopt::tensor_spec>{});
    CHECK_ERROR(opt.step(), "group 0");
  }
}

TEST_CASE("a zero-size tensor throws, naming it") {
  std::vector<float> p, g;
  fp32_adam opt;
  auto& group = opt.add_group({});
  CHECK_ERROR(group.add(p, g, "empty_tensor"), "empty_tensor");
  CHECK(group.size() == 0);
  CHECK_ERROR(opt.add_flat_group({}, {{"flat_ok", 3}, {"flat_empty", 0}}), "flat_empty");
  CHECK(opt.group_count() == 1);  // the flat group was not created
}

TEST_CASE("duplicate tensor names throw, naming the tensor") {
  std::vector<float> a(3), ga(3), b(4), gb(4), c(5), gc(5);
  fp32_adam opt;
  auto& g0 = opt.add_group({});
  g0.add(a, ga, "shared_name");
  CHECK_ERROR(g0.add(b, gb, "shared_name"), "shared_name");  // same group
  CHECK(g0.size() == 1);
  auto& g1 = opt.add_group({});
  CHECK_ERROR(g1.add(c, gc, "shared_name"), "shared_name");  // another group
  CHECK(g1.size() == 0);
  CHECK_ERROR(opt.add_flat_group({}, {{"shared_name", 2}}), "shared_name");  // a flat group
  CHECK(opt.group_count() == 2);
  opt.add_flat_group({}, {{"flat_name", 2}});
  CHECK_ERROR(g1.add(c, gc, "flat_name"), "flat_name");  // a flat group's tensor, registered before
  CHECK(g1.size() == 0);
}

TEST_CASE("duplicate tensor names inside one flat group throw, naming the tensor") {
  fp32_adam opt;
  CHECK_ERROR(opt.add_flat_group({}, {{"twice", 2}, {"other", 3}, {"twice", 4}}), "twice");
  CHECK(opt.group_count() == 0);
}

TEST_CASE("adding tensors or groups after the first step throws and leaves the run as it was") {
  rig<fp16_dyn_adam> a(default_layout, {}, scaler_opts), b(default_layout, {}, scaler_opts);
  a.step();
  b.step();
  std::vector<mpopt::half> p(4, mpopt::half(1.0f)), g(4, mpopt::half(0.0f));
  CHECK_ERROR(a.opt.group(0).add(p, g, "late_tensor"), "late_tensor");
  CHECK_ERROR(a.opt.group(0).add(p, g, "late_tensor"), "after the first step");
  CHECK_ERROR(a.opt.add_group({}), "after the first step");
  CHECK_ERROR(a.opt.add_flat_group({}, {{"late_flat", 4}}), "late_flat");
  CHECK_ERROR(a.opt.add_flat_group({}, std::span<const mpopt::tensor_spec>{}), "group");
  check_twins(a, b);

  // finalize() fixes the tensor set too.
  fp32_adam opt;
  std::vector<float> x(3), gx(3), y(3), gy(3);
  opt.add_group({}).add(x, gx, "x");
  opt.finalize();
  CHECK_ERROR(opt.group(0).add(y, gy, "after_finalize"), "after_finalize");
  CHECK(opt.group(0).size() == 1);
}

TEST_CASE("negative or non-finite lr throws naming lr, at add_group and at set_lr on a running optimizer") {
  fp32_adam opt;
  CHECK_ERROR(opt.add_group({.lr = -1e-3}), "lr");
  CHECK_ERROR(opt.add_group({.lr = d_nan}), "lr");
  CHECK_ERROR(opt.add_group({.lr = d_inf}), "lr");
  CHECK_ERROR(opt.add_group({.lr = -d_inf}), "lr");
  CHECK(opt.group_count() == 0);

  rig<fp16_dyn_lamb> a(default_layout, {}, scaler_opts), b(default_layout, {}, scaler_opts);
  for (int i = 0; i < 3; ++i) {
    a.step(i == 1);
    b.step(i == 1);
  }
  const double lr = a.opt.group(1).lr();
  CHECK_ERROR(a.opt.group(1).set_lr(-0.5), "lr");
  CHECK_ERROR(a.opt.group(1).set_lr(d_nan), "lr");
  CHECK_ERROR(a.opt.group(1).set_lr(d_inf), "lr");
  CHECK(a.opt.group(1).lr() == lr);
  check_twins(a, b);
  a.opt.group(1).set_lr(0.0);  // zero is valid
  CHECK(a.opt.group(1).lr() == 0.0);
}

TEST_CASE("beta1 and beta2 outside [0, 1) throw naming the field (Adam and LAMB, add_group and set_options)") {
  fp32_adam adam_opt;
  fp32_lamb lamb_opt;
  for (double bad : {1.0, -0.1, d_nan, 1.5, d_inf}) {
    CAPTURE(bad);
    CHECK_ERROR(adam_opt.add_group({.beta1 = bad}), "beta1");
    CHECK_ERROR(adam_opt.add_group({.beta2 = bad}), "beta2");
    CHECK_ERROR(lamb_opt.add_group({.beta1 = bad}), "beta1");
    CHECK_ERROR(lamb_opt.add_group({.beta2 = bad}), "beta2");
  }
  CHECK(adam_opt.group_count() == 0);
  CHECK(lamb_opt.group_count() == 0);
  adam_opt.add_group({.beta1 = 0.0, .beta2 = 0.0});  // 0 is inside [0, 1)

  rig<fp32_adam> a, b;
  a.step();
  b.step();
  auto o = a.opt.group(0).options();
  o.beta2 = 1.0;
  CHECK_ERROR(a.opt.group(0).set_options(o), "beta2");
  o = a.opt.group(0).options();
  o.beta1 = -0.1;
  CHECK_ERROR(a.opt.group(0).set_options(o), "beta1");
  check_twins(a, b);
}

TEST_CASE("eps <= 0 and negative weight decay throw naming the field") {
  fp32_adam adam_opt;
  fp32_lamb lamb_opt;
  for (double bad : {0.0, -1e-8, d_nan}) {
    CAPTURE(bad);
    CHECK_ERROR(adam_opt.add_group({.eps = bad}), "eps");
    CHECK_ERROR(lamb_opt.add_group({.eps = bad}), "eps");
  }
  for (double bad : {-0.01, d_nan, d_inf}) {
    CAPTURE(bad);
    CHECK_ERROR(adam_opt.add_group({.weight_decay = bad}), "weight_decay");
    CHECK_ERROR(lamb_opt.add_group({.weight_decay = bad}), "weight_decay");
  }
  CHECK(adam_opt.group_count() == 0);
  CHECK(lamb_opt.group_count() == 0);
}

TEST_CASE("LAMB min_coeff > max_coeff, negative min_coeff, max_coeff <= 0 throw naming the field") {
  fp32_lamb opt;
  CHECK_ERROR(opt.add_group({.min_coeff = 2.0, .max_coeff = 1.0}), "min_coeff");
  CHECK_ERROR(opt.add_group({.min_coeff = -0.01}), "min_coeff");
  CHECK_ERROR(opt.add_group({.max_coeff = 0.0}), "max_coeff");
  CHECK_ERROR(opt.add_group({.max_coeff = d_nan}), "max_coeff");
  CHECK(opt.group_count() == 0);
  opt.add_group({.min_coeff = 1.0, .max_coeff = 1.0});  // equal is fine
}

TEST_CASE("invalid optimizer options throw naming the field: clip_grad, accumulation_steps, bucket_elements, "
          "gradient_predivide") {
  for (double bad : {-1.0, d_nan, d_inf}) {
    CAPTURE(bad);
    CHECK_ERROR(fp32_adam({.clip_grad = bad}), "clip_grad");
  }
  for (double bad : {0.0, -2.0, d_nan, d_inf}) {
    CAPTURE(bad);
    CHECK_ERROR(fp32_adam({.gradient_predivide = bad}), "gradient_predivide");
  }
  for (std::size_t bad : {std::size_t{0}, (std::size_t{1} << 30) + 1}) {
    CAPTURE(bad);
    CHECK_ERROR(fp32_adam({.bucket_elements = bad}), "bucket_elements");
  }
  for (int bad : {0, -1}) {
    CAPTURE(bad);
    CHECK_ERROR(fp32_adam({.accumulation_steps = bad}), "accumulation_steps");
  }
  CHECK_NOTHROW(fp32_adam({.clip_grad = 0.0}));  // 0 disables clipping
}

TEST_CASE("invalid dynamic scaler options throw naming the field") {
  const mpopt::optimizer_options o;
  for (double bad : {d_nan, d_inf, 0.0, -4.0}) {
    CAPTURE(bad);
    CHECK_ERROR(fp16_dyn_adam(o, {.init_scale = bad}), "init_scale");
    CHECK_ERROR(mpopt::dynamic_scale({.init_scale = bad}), "init_scale");
    CHECK_ERROR(fp16_dyn_adam(o, {.min_scale = bad}), "min_scale");
  }
  CHECK_ERROR(fp16_dyn_adam(o, {.init_scale = 4, .min_scale = 8}), "min_scale");
  CHECK_ERROR(mpopt::dynamic_scale({.init_scale = 4, .min_scale = 8}), "min_scale");
  for (std::int64_t bad : {0, -1}) {
    CAPTURE(bad);
    CHECK_ERROR(fp16_dyn_adam(o, {.window = bad}), "window");
    CHECK_ERROR(fp16_dyn_adam(o, {.hysteresis = bad}), "hysteresis");
  }
  CHECK_NOTHROW(fp16_dyn_adam(o, {.init_scale = 8, .window = 1, .min_scale = 8, .hysteresis = 1}));
}

TEST_CASE("a static scale <= 0 or non-finite throws naming scale") {
  for (double bad : {0.0, -1.0, d_nan, d_inf}) {
    CAPTURE(bad);
    CHECK_ERROR(fp16_static_adam({}, {.scale = bad}), "scale");
    CHECK_ERROR(mpopt::static_scale({.scale = bad}), "scale");
  }
}

TEST_CASE("skip_nonfinite = false with a loss scaler throws naming skip_nonfinite") {
  CHECK_ERROR(fp16_dyn_adam({.skip_nonfinite = false}), "skip_nonfinite");
  CHECK_ERROR(fp16_static_adam({.skip_nonfinite = false}, {.scale = 128}), "skip_nonfinite");
  CHECK_NOTHROW(fp16_plain_adam({.skip_nonfinite = false}));
  CHECK_NOTHROW(bf16_adam({.skip_nonfinite = false}));
}

TEST_CASE("a tensor in device memory is rejected by the host backend (mpopt::view with space = device)") {
  std::vector<float> p(4, 1.0f), g(4, 0.0f);
  fp32_adam opt;
  auto& group = opt.add_group({});
  CHECK_ERROR(group.add(mpopt::view<float>{p.data(), p.size(), mpopt::memory_space::device},
                        mpopt::view<float>{g.data(), g.size(), mpopt::memory_space::device}, "device_param"),
              "device_param");
  CHECK_ERROR(group.add(mpopt::view<float>{p.data(), p.size(), mpopt::memory_space::host},
                        mpopt::view<float>{g.data(), g.size(), mpopt::memory_space::device}, "device_grad"),
              "device");
  CHECK(group.size() == 0);
}

TEST_CASE("a custom tensor type whose traits say device memory is rejected by the host backend") {
  static_assert(mpopt::tensor<device_buffer>);
  std::vector<float> p(4, 1.0f), g(4, 0.0f);
  fp32_adam opt;
  auto& group = opt.add_group({});
  CHECK_ERROR(group.add(device_buffer{p.data(), 4}, device_buffer{g.data(), 4}, "gpu_weight"), "gpu_weight");
  CHECK_ERROR(group.add(device_buffer{p.data(), 4}, g, "gpu_weight"), "device");
  CHECK(group.size() == 0);
}

TEST_CASE("parameter and gradient overlapping in memory are rejected, naming the tensor") {
  std::vector<float> buf(10, 0.0f);
  fp32_adam opt;
  auto& group = opt.add_group({});
  CHECK_ERROR(group.add(std::span<float>(buf.data(), 6), std::span<float>(buf.data() + 4, 6), "overlapping"),
              "overlapping");
  CHECK_ERROR(group.add(std::span<float>(buf.data() + 4, 6), std::span<float>(buf.data(), 6), "overlapping_back"),
              "overlap");
  CHECK_ERROR(group.add(buf, buf, "same_buffer"), "same_buffer");
  CHECK(group.size() == 0);
  // Adjacent but disjoint is fine.
  group.add(std::span<float>(buf.data(), 5), std::span<float>(buf.data() + 5, 5), "adjacent");
  CHECK(group.size() == 1);

  std::vector<mpopt::half> hbuf(8, mpopt::half(0.0f));
  fp16_dyn_adam opt16;
  auto& g16 = opt16.add_group({});
  CHECK_ERROR(g16.add(std::span<mpopt::half>(hbuf.data(), 4), std::span<mpopt::half>(hbuf.data() + 3, 4), "half_overlap"),
              "half_overlap");
  CHECK(g16.size() == 0);
}

TEST_CASE("master(), moment() and owned() before the state exists say to call finalize(), and answer after it") {
  fp32_adam opt;
  std::vector<float> p(5, 1.0f), g(5), q(2), h(2);
  auto& group = opt.add_group({});
  group.add(p, g, "w");
  group.add(q, h, "b");
  CHECK_ERROR(opt.master(0), "master(0): the optimizer state is made by finalize() or the first step(); call "
                             "finalize() first (2 tensors are registered)");
  CHECK_ERROR(opt.moment(0, 1), "moment(1): the optimizer state is made by finalize()");
  CHECK_ERROR(opt.owned(1), "owned(1): the optimizer state is made by finalize()");
  opt.finalize();
  CHECK(opt.master(0).size() == 5);
  CHECK(opt.moment(1, 1).size() == 2);
  CHECK(opt.owned(1).first == 0);
  CHECK(opt.owned(1).count == 2);
  CHECK_ERROR(opt.master(2), "there are 2 tensors");
}

TEST_CASE("save() before the first step or in the middle of gradient accumulation throws and writes nothing") {
  temp_dir dir;
  {
    fp32_adam opt;
    std::vector<float> p(3), g(3);
    opt.add_group({}).add(p, g, "w");
    CHECK_ERROR(opt.save(dir / "early.safetensors"), "save");
    CHECK_FALSE(fs::exists(dir / "early.safetensors"));
  }
  rig<fp16_dyn_adam> a(default_layout, {.accumulation_steps = 3}, scaler_opts);
  rig<fp16_dyn_adam> b(default_layout, {.accumulation_steps = 3}, scaler_opts);
  for (int i = 0; i < 4; ++i) {  // one boundary, then micro-step 1 of the next window
    a.step();
    b.step();
  }
  CHECK_ERROR(a.opt.save(dir / "mid.safetensors"), "micro-step");
  CHECK_FALSE(fs::exists(dir / "mid.safetensors"));
  CHECK(a.step().micro_step == 2);
  CHECK(b.step().micro_step == 2);
  CHECK_ERROR(a.opt.save(dir / "mid.safetensors"), "accumulation");
  CHECK_FALSE(fs::exists(dir / "mid.safetensors"));
  check_twins(a, b, 6);
  // At a boundary it works.
  mpopt::step_status st;
  do st = a.step();
  while (st.result == mpopt::step_result::accumulating);
  CHECK_NOTHROW(a.opt.save(dir / "boundary.safetensors"));
}

TEST_CASE("the load fixture's good file loads (so the rejections below are about the defects)") {
  load_fixture f;
  CHECK_NOTHROW(f.target.opt.load(f.good));
  CHECK_FALSE(f.target.snap() == f.twin.snap());
  const fs::path copy = f.dir / "rewritten.safetensors";
  rewrite(f.good, copy, [](nlohmann::json&) {});
  CHECK_NOTHROW(f.twin.opt.load(copy));
  CHECK(f.target.snap() == f.twin.snap());
}

TEST_CASE("load() of a nonexistent file throws naming the path and changes nothing") {
  load_fixture f;
  f.reject(f.dir / "no_such_checkpoint.safetensors", "no_such_checkpoint");
  f.reject(f.dir.path, f.dir.path.filename().string());  // a directory
  check_twins(f.target, f.twin);
}

TEST_CASE("load() of files that are not state files throws and changes nothing") {
  load_fixture f;
  const auto text = f.dir / "notes.txt";
  write_chars(text, {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', ',', ' ', 'n', 'o', 't', ' ', 'a', ' ', 's',
              't', 'a', 't', 'e', ' ', 'f', 'i', 'l', 'e', '\n'});
  f.reject(text, "notes.txt");
  const auto empty = f.dir / "empty.safetensors";
  write_chars(empty, {});
  f.reject(empty, "empty.safetensors");
  // A valid safetensors file that is not an mpopt state file.
  const auto foreign = f.dir / "foreign.safetensors";
  {
    std::string header = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
    while ((8 + header.size()) % 8) header += ' ';
    std::vector<char> bytes(8);
    std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) bytes[i] = char((n >> (8 * i)) & 0xff);
    bytes.insert(bytes.end(), header.begin(), header.end());
    bytes.insert(bytes.end(), {0, 0, char(0x80), 0x3f});
    write_chars(foreign, bytes);
  }
  f.reject(foreign, "foreign.safetensors");
  check_twins(f.target, f.twin);
}

TEST_CASE("load() of a truncated file throws at every truncation length and changes nothing") {
  load_fixture f;
  const auto cut = f.dir / "cut.safetensors";
  const std::size_t n = f.good_bytes.size();
  std::size_t tried = 0;
  for (std::size_t len = 0; len < n; len += (len < 64 || len + 64 > n) ? 1 : 7) {
    CAPTURE(len);
    write_chars(cut, std::vector<char>(f.good_bytes.begin(), f.good_bytes.begin() + std::ptrdiff_t(len)));
    const std::string msg = error_of([&] { f.target.opt.load(cut); });
    INFO("message: ", msg);
    REQUIRE(msg.rfind("mpopt: ", 0) == 0);
    REQUIRE(msg.find("cut.safetensors") != std::string::npos);
    ++tried;
  }
  CHECK(tried > 200);
  CHECK(f.target.snap() == f.twin.snap());
  check_twins(f.target, f.twin);
}

TEST_CASE("load() from memory refuses what it refuses from a file: every truncation, every flipped low bit") {
  load_fixture f;
  const auto* good = reinterpret_cast<const std::byte*>(f.good_bytes.data());
  const std::size_t n = f.good_bytes.size();
  std::size_t tried = 0;
  for (std::size_t len = 0; len < n; ++len) {
    CAPTURE(len);
    const std::string msg = error_of([&] { f.target.opt.load(std::span<const std::byte>(good, len)); });
    REQUIRE(msg.rfind("mpopt: the checkpoint in memory: ", 0) == 0);
    ++tried;
  }
  std::vector<std::byte> bytes(good, good + n);
  for (std::size_t pos = 0; pos < n; ++pos) {
    CAPTURE(pos);
    bytes[pos] ^= std::byte{1};
    std::istringstream in(std::string(reinterpret_cast<const char*>(bytes.data()), n));
    const std::string msg = error_of([&] { f.target.opt.load(in); });
    REQUIRE(msg.rfind("mpopt: the checkpoint's stream: ", 0) == 0);
    bytes[pos] ^= std::byte{1};
    ++tried;
  }
  CHECK(tried == 2 * n);
  CHECK(f.target.snap() == f.twin.snap());
  check_twins(f.target, f.twin);
  f.target.opt.load(bytes);  // the bytes as saved load
  CHECK_FALSE(f.target.snap() == f.twin.snap());
}

TEST_CASE("load() of a file with one flipped byte throws, wherever the byte is, and changes nothing") {
  load_fixture f;
  const auto bad = f.dir / "flipped.safetensors";
  std::mt19937 rng(5);
  std::size_t tried = 0;
  // Every position with its lowest bit flipped, and 600 random (position, byte) pairs.
  std::vector<std::pair<std::size_t, unsigned>> flips;
  for (std::size_t pos = 0; pos < f.good_bytes.size(); ++pos) flips.emplace_back(pos, 0x01u);
  for (int i = 0; i < 600; ++i) flips.emplace_back(rng() % f.good_bytes.size(), 1u + unsigned(rng() % 255u));
  for (const auto& flip : flips) {  // no structured binding: clang before 16 cannot capture one
    {
      const std::size_t pos = flip.first;
      const unsigned mask = flip.second;
      CAPTURE(pos);
      CAPTURE(int(mask));
      auto bytes = f.good_bytes;
      bytes[pos] = char(static_cast<unsigned char>(bytes[pos]) ^ static_cast<unsigned char>(mask));
      write_chars(bad, bytes);
      const std::string msg = error_of([&] { f.target.opt.load(bad); });
      INFO("message: ", msg);
      REQUIRE(msg.rfind("mpopt: ", 0) == 0);
      ++tried;
    }
  }
  CHECK(tried == flips.size());
  CHECK(f.target.snap() == f.twin.snap());
  check_twins(f.target, f.twin);
}

TEST_CASE("load() of a state saved with other policies throws naming the difference and changes nothing") {
  load_fixture f;
  f.reject(save_from<fp16_dyn_lamb>(f.dir, "lamb.safetensors", default_layout, scaler_opts), "rule");
  f.reject(save_from<bf16_adam>(f.dir, "bf16.safetensors", default_layout), "precision");
  f.reject(save_from<fp32_adam>(f.dir, "fp32.safetensors", default_layout), "precision");
  f.reject(save_from<fp16_static_adam>(f.dir, "static.safetensors", default_layout, {.scale = 1024}), "loss_scaler");
  f.reject(save_from<fp16_plain_adam>(f.dir, "plain.safetensors", default_layout), "loss_scaler");
  check_twins(f.target, f.twin);

  // And the other way round: an fp16 dynamic Adam state into a bf16 Adam and an fp16 dynamic LAMB.
  rig<bf16_adam> b1, b2;
  b1.step();
  b2.step();
  CHECK_ERROR(b1.opt.load(f.good), "precision");
  check_twins(b1, b2);
  rig<fp16_dyn_lamb> l1(default_layout, {}, scaler_opts), l2(default_layout, {}, scaler_opts);
  l1.step();
  l2.step();
  CHECK_ERROR(l1.opt.load(f.good), "rule");
  check_twins(l1, l2);
}

TEST_CASE("load() of a state with other tensor names, sizes or group count throws naming it and changes nothing") {
  load_fixture f;
  f.reject(save_from<fp16_dyn_adam>(f.dir, "renamed.safetensors",
                                    {{{"embed.weight", 33}, {"renamed.weight", 17}}, {{"proj.bias", 5}}}, scaler_opts),
           "renamed.weight");
  f.reject(save_from<fp16_dyn_adam>(f.dir, "resized.safetensors",
                                    {{{"embed.weight", 33}, {"proj.weight", 18}}, {{"proj.bias", 5}}}, scaler_opts),
           "18");
  f.reject(save_from<fp16_dyn_adam>(f.dir, "one_group.safetensors",
                                    {{{"embed.weight", 33}, {"proj.weight", 17}, {"proj.bias", 5}}}, scaler_opts),
           "groups");
  f.reject(save_from<fp16_dyn_adam>(f.dir, "extra.safetensors",
                                    {{{"embed.weight", 33}, {"proj.weight", 17}}, {{"proj.bias", 5}, {"extra", 2}}},
                                    scaler_opts),
           "extra");
  f.reject(save_from<fp16_dyn_adam>(f.dir, "fewer.safetensors", {{{"embed.weight", 33}}, {{"proj.bias", 5}}},
                                    scaler_opts),
           "group 0");
  check_twins(f.target, f.twin);
}

TEST_CASE("load() of a well-formed file with bad contents (checksum valid) throws naming it and changes nothing") {
  load_fixture f;
  const auto p = f.dir / "edited.safetensors";
  auto keep = [](nlohmann::json&) {};

  rewrite(f.good, p, [](nlohmann::json& m) { m["groups"][1]["options"]["lr"] = -1.0; });
  f.reject(p, "lr");
  rewrite(f.good, p, [](nlohmann::json& m) { m["groups"][0]["options"]["beta2"] = 1.0; });
  f.reject(p, "beta2");
  rewrite(f.good, p, [](nlohmann::json& m) { m.erase("scaler"); });
  f.reject(p, "scaler");
  rewrite(f.good, p, [](nlohmann::json& m) { m["scaler"].erase("hysteresis_left"); });
  f.reject(p, "hysteresis_left");
  rewrite(f.good, p, [](nlohmann::json& m) { m["groups"][0]["step"] = "seven"; });
  f.reject(p, "edited.safetensors");
  rewrite(f.good, p, [](nlohmann::json& m) { m["rule"] = "lamb"; });
  f.reject(p, "rule");
  // A storage it does not know; one whose tensors the file does not hold (loading converts state).
  rewrite(f.good, p, [](nlohmann::json& m) { m["state"] = "int3"; });
  f.reject(p, "saved with state \"int3\", a storage this version of mpopt does not know");
  rewrite(f.good, p, [](nlohmann::json& m) { m["master"] = 16; });
  f.reject(p, "saved with master 16");
  rewrite(f.good, p, [](nlohmann::json& m) { m["state"] = "blockwise8"; });
  f.reject(p, "tensor 'exp_avg/embed.weight' has dtype F32 and shape [33], expected U8");
  rewrite(f.good, p, [](nlohmann::json& m) { m["master"] = "remainder16"; });
  f.reject(p, "tensor 'remainder/embed.weight' is missing");
  // The spike guard's windows: numbers, both of them.
  rewrite(f.good, p, [](nlohmann::json& m) { m["spike_guard"] = {{"loss", {1.0, "x"}}, {"norm", nlohmann::json::array()}}; });
  f.reject(p, "spike_guard.loss holds \"x\", not a number");
  rewrite(f.good, p, [](nlohmann::json& m) { m["spike_guard"] = {{"loss", nlohmann::json::array()}}; });
  f.reject(p, "spike_guard.norm");
  // A tensor missing, with the wrong dtype, or the wrong shape.
  rewrite(f.good, p, keep, [](const std::string& n, std::string&, std::vector<std::int64_t>&, std::vector<std::byte>&) {
    return n != "exp_avg_sq/proj.bias";
  });
  f.reject(p, "exp_avg_sq/proj.bias");
  rewrite(f.good, p, keep, [](const std::string& n, std::string& dtype, std::vector<std::int64_t>& shape,
                              std::vector<std::byte>& data) {
    if (n == "param/proj.weight") {  // F16 [17] -> F32 [17]
      dtype = "F32";
      data.resize(data.size() * 2);
      (void)shape;
    }
    return true;
  });
  f.reject(p, "param/proj.weight");
  // (Any shape of its 33 elements would do: the fixture registers no shapes; state.cpp covers those.)
  rewrite(f.good, p, keep, [](const std::string& n, std::string&, std::vector<std::int64_t>& shape,
                              std::vector<std::byte>& data) {
    if (n == "master/embed.weight") {  // F32 [33] -> F32 [34]
      shape = {34};
      data.resize(data.size() + sizeof(float));
    }
    return true;
  });
  f.reject(p, "master/embed.weight");
  check_twins(f.target, f.twin);
}

TEST_CASE("load() of a well-formed file with an impossible scaler state throws and changes nothing") {
  // A loss scale that is not a positive finite number, or a hysteresis counter outside [1, hysteresis], cannot
  // come from save(); accepting it would make every later step meaningless.
  load_fixture f;
  const auto p = f.dir / "scaler.safetensors";
  for (double bad : {0.0, -1024.0}) {
    CAPTURE(bad);
    rewrite(f.good, p, [&](nlohmann::json& m) { m["scaler"]["scale"] = bad; });
    f.reject(p, "scale");
  }
  rewrite(f.good, p, [](nlohmann::json& m) { m["scaler"]["hysteresis_left"] = 0; });
  f.reject(p, "hysteresis");
  check_twins(f.target, f.twin);
}

TEST_CASE("a failed load() into an optimizer that has not stepped yet leaves it as it was") {
  // The common pattern "try to resume; if that fails, initialize the model and train from scratch": after
  // the failed load the user writes fresh initial weights, and the first step must start from those.
  temp_dir dir;
  const auto path = save_from<fp16_dyn_lamb>(dir, "lamb.safetensors", default_layout, scaler_opts);
  rig<fp16_dyn_adam> a(default_layout, {}, scaler_opts, 0.5f), b(default_layout, {}, scaler_opts, 0.5f);
  const auto params = a.snap().params;
  CHECK_ERROR(a.opt.load(path), "rule");
  CHECK(a.snap().params == params);
  CHECK_ERROR(a.opt.load(dir / "missing.safetensors"), "missing.safetensors");
  CHECK(a.snap().params == params);
  for (auto* r : {&a, &b})  // re-initialize the weights after the failed resume
    for (auto& p : r->params)
      for (std::size_t i = 0; i < p.size(); ++i) p[i] = mpopt::half(0.25f * std::cos(float(i)));
  check_twins(a, b);  // neither is finalized: each first step copies the new weights into its masters
}

TEST_CASE("a failed load() into an optimizer that has not stepped yet still lets it add groups and tensors") {
  temp_dir dir;
  fp32_adam opt;
  std::vector<float> p(3, 1.0f), g(3, 0.0f), q(4, 1.0f), gq(4, 0.0f);
  opt.add_group({}).add(p, g, "w");
  CHECK_ERROR(opt.load(dir / "missing.safetensors"), "missing.safetensors");
  CHECK_NOTHROW(opt.group(0).add(q, gq, "added_after_failed_load"));
  CHECK_NOTHROW(opt.add_group({}));
}

// ---------------------------------------------------------------------------------------------------
// Hardening: numbers that pass a check in double but break in float, counters written as floats or out of
// range, memory shared between tensors.

TEST_CASE("load() refuses a metadata counter that is not a non-negative integer in range, and changes nothing") {
  // A float such as 1e30 used to reach a float-to-integer conversion (undefined behaviour); -1 wrapped to 2^64 - 1.
  load_fixture f;
  const auto p = f.dir / "counter.safetensors";
  using edit = std::function<void(nlohmann::json&, const nlohmann::json&)>;
  const std::vector<std::pair<std::string, edit>> fields = {
      {"applied_steps", [](nlohmann::json& m, const nlohmann::json& v) { m["applied_steps"] = v; }},
      {"skipped_steps", [](nlohmann::json& m, const nlohmann::json& v) { m["skipped_steps"] = v; }},
      {"consecutive_skips", [](nlohmann::json& m, const nlohmann::json& v) { m["consecutive_skips"] = v; }},
      {"step", [](nlohmann::json& m, const nlohmann::json& v) { m["groups"][1]["step"] = v; }},
      {"iter", [](nlohmann::json& m, const nlohmann::json& v) { m["scaler"]["iter"] = v; }},
      {"hysteresis_left", [](nlohmann::json& m, const nlohmann::json& v) { m["scaler"]["hysteresis_left"] = v; }},
      {"last_overflow_iter", [](nlohmann::json& m, const nlohmann::json& v) { m["scaler"]["last_overflow_iter"] = v; }},
  };
  const std::vector<nlohmann::json> bad = {1e30, -1e30, 1.5, 2.0, -2, std::numeric_limits<std::uint64_t>::max(),
                                           std::int64_t{1} << 60, "3", nullptr, true};
  for (const auto& entry : fields)  // no structured binding: clang before 16 cannot capture one
    for (const auto& v : bad) {
      const std::string& field = entry.first;
      const edit& set = entry.second;
      CAPTURE(field);
      CAPTURE(v.dump());
      rewrite(f.good, p, [&](nlohmann::json& m) { set(m, v); });
      f.reject(p, field);
    }
  for (const char* field : {"applied_steps", "skipped_steps", "consecutive_skips"}) {
    CAPTURE(field);
    rewrite(f.good, p, [&](nlohmann::json& m) { m[field] = -1; });
    f.reject(p, field);
  }
  rewrite(f.good, p, [](nlohmann::json& m) { m["groups"][0]["step"] = -1; });
  f.reject(p, "step");
  check_twins(f.target, f.twin);
}

TEST_CASE("load() refuses a rounding_seed that is not an unsigned 64-bit integer, and changes nothing") {
  load_fixture f;
  const auto p = f.dir / "seed.safetensors";
  const std::vector<nlohmann::json> bad = {1e30, -1, 1.5, 2.0, "3", nullptr, true, nlohmann::json::array()};
  for (const auto& v : bad) {
    CAPTURE(v.dump());
    rewrite(f.good, p, [&](nlohmann::json& m) { m["rounding_seed"] = v; });
    f.reject(p, "rounding_seed");
  }
  check_twins(f.target, f.twin);
}

TEST_CASE("load() refuses a malformed learning-rate schedule or base rate, and changes nothing") {
  load_fixture f;
  for (auto* r : {&f.target, &f.twin}) r->opt.set_schedule(mpopt::step_decay{.step_size = 3});
  const auto p = f.dir / "schedule.safetensors";
  using edit = std::function<void(nlohmann::json&)>;
  const std::vector<std::pair<std::string, edit>> bad = {
      {"lr_schedule must be a JSON object", [](nlohmann::json& m) { m["lr_schedule"] = 5; }},
      {"lr_schedule.type: \"Nope\" is not a schedule", [](nlohmann::json& m) { m["lr_schedule"] = {{"type", "Nope"}}; }},
      {"lr_schedule.params.warmup_num_step: unknown key",
       [](nlohmann::json& m) { m["lr_schedule"] = {{"type", "WarmupLR"}, {"params", {{"warmup_num_step", 3}}}}; }},
      {"WarmupLR.warmup_num_steps",
       [](nlohmann::json& m) { m["lr_schedule"] = {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 0}}}}; }},
      {"lr_schedule.params.step_size must be an integer",
       [](nlohmann::json& m) { m["lr_schedule"] = {{"type", "step_decay"}, {"params", {{"step_size", 1e30}}}}; }},
      {"group 1.base_lr must be >= 0, got -0.001", [](nlohmann::json& m) { m["groups"][1]["base_lr"] = -1e-3; }},
      {"group 0.base_lr must be a number", [](nlohmann::json& m) { m["groups"][0]["base_lr"] = "0.1"; }},
      {"group 1.base_lr", [](nlohmann::json& m) { m["groups"][1].erase("base_lr"); }},
      {"group 0.base_lr", [](nlohmann::json& m) { m["groups"][0]["base_lr"] = 1e300; }},  // infinite as a float
  };
  for (const auto& entry : bad) {  // no structured binding: clang before 16 cannot capture one
    const std::string& needle = entry.first;
    CAPTURE(needle);
    rewrite(f.good, p, entry.second);
    f.reject(p, needle);
    CHECK(mpopt::detail::schedule_settings(f.target.opt.schedule()) ==
          mpopt::detail::schedule_settings(mpopt::step_decay{.step_size = 3}));
  }
  check_twins(f.target, f.twin);
}

TEST_CASE("load() of a file written before schedules were saved leaves the schedule and base rates as they are") {
  load_fixture f;
  const auto p = f.dir / "older.safetensors";
  rewrite(f.good, p, [](nlohmann::json& m) {
    m.erase("lr_schedule");
    for (auto& g : m["groups"]) g.erase("base_lr");
  });
  const mpopt::lr_schedule s = mpopt::step_decay{.step_size = 2, .gamma = 0.5};
  f.target.opt.set_schedule(s);
  f.target.opt.group(1).set_lr(7e-3);
  f.target.opt.load(p);
  REQUIRE(f.target.opt.schedule());
  CHECK(mpopt::detail::schedule_settings(f.target.opt.schedule()) == mpopt::detail::schedule_settings(s));
  CHECK(f.target.opt.group(1).base_lr() == 7e-3);
  // The current format: the file's (none) replaces it.
  f.target.opt.load(f.good);
  CHECK_FALSE(f.target.opt.schedule());
  CHECK(f.target.opt.group(1).base_lr() == 1e-2 / 2);
}

TEST_CASE("load() refuses counters that no run of the saved optimizer can reach, and changes nothing") {
  load_fixture f;
  const auto p = f.dir / "counts.safetensors";
  const nlohmann::json meta = mpopt::detail::state_reader(f.good).metadata();
  const auto applied = meta["applied_steps"].get<std::uint64_t>(), skipped = meta["skipped_steps"].get<std::uint64_t>();
  REQUIRE(applied > 0);
  REQUIRE(skipped > 0);
  rewrite(f.good, p, [&](nlohmann::json& m) { m["groups"][0]["step"] = applied + 1; });  // steps only when applied
  f.reject(p, "step");
  rewrite(f.good, p, [&](nlohmann::json& m) { m["consecutive_skips"] = skipped + 1; });
  f.reject(p, "consecutive_skips");
  rewrite(f.good, p, [&](nlohmann::json& m) { m["scaler"]["iter"] = applied + skipped + 1; });  // one per boundary
  f.reject(p, "iter");
  check_twins(f.target, f.twin);
}

TEST_CASE("load() refuses options and scales that are finite doubles but not usable floats, and changes nothing") {
  // An lr of 1e300 is infinite as a float and made every parameter non-finite; a scale of 1e300 skipped every step.
  load_fixture f;
  const auto p = f.dir / "float.safetensors";
  rewrite(f.good, p, [](nlohmann::json& m) { m["groups"][1]["options"]["lr"] = 1e300; });
  f.reject(p, "lr");
  rewrite(f.good, p, [](nlohmann::json& m) { m["groups"][0]["options"]["weight_decay"] = 1e300; });
  f.reject(p, "weight_decay");
  rewrite(f.good, p, [](nlohmann::json& m) { m["groups"][0]["options"]["eps"] = 1e-50; });
  f.reject(p, "eps");
  rewrite(f.good, p, [](nlohmann::json& m) { m["groups"][0]["options"]["decoupled_weight_decay"] = 1; });
  f.reject(p, "decoupled_weight_decay");
  for (double scale : {1e300, 1e39, 0x1p65}) {
    CAPTURE(scale);
    rewrite(f.good, p, [&](nlohmann::json& m) { m["scaler"]["scale"] = scale; });
    f.reject(p, "scale");
  }
  check_twins(f.target, f.twin);
}

template <class Opt>
void check_float_options() {
  using O = typename Opt::group_options;
  Opt opt;
  CHECK_ERROR(opt.add_group(O{.lr = 1e300}), "lr");
  CHECK_ERROR(opt.add_group(O{.weight_decay = 1e300}), "weight_decay");
  for (double eps : {1e-50, 1e-39}) {  // 0 as a float; a subnormal float, which flushes to 0 where denormals do
    CAPTURE(eps);
    CHECK_ERROR(opt.add_group(O{.eps = eps}), "eps");
  }
  CHECK(opt.group_count() == 0);
  auto& g = opt.add_group(O{.eps = 1.1754943508222875e-38});  // the smallest normal float is fine
  CHECK_ERROR(g.set_lr(1e300), "lr");
  CHECK(g.lr() == doctest::Approx(O{}.lr));
}

TEST_CASE("options that pass the checks in double but break in float throw naming the field") {
  check_float_options<fp32_adam>();
  check_float_options<fp32_lamb>();
  check_float_options<mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::onebit_lamb>>();
  // LAMB's step size lr * sqrt(1 - beta2) / (1 - beta1), times max_coeff, must be a float too.
  fp32_lamb opt;
  CHECK_ERROR(opt.add_group({.lr = 1e30, .beta1 = 1 - 1e-12}), "lr");
  CHECK_ERROR(opt.add_group({.lr = 1e37, .max_coeff = 1e10}), "max_coeff");
  // Scales and the predivide factor: a float whose reciprocal is a float too.
  for (double bad : {1e300, 1e39, 0x1p65}) {
    CAPTURE(bad);
    CHECK_ERROR(fp16_dyn_adam({}, {.init_scale = bad}), "init_scale");
    CHECK_ERROR(fp16_static_adam({}, {.scale = bad}), "scale");
  }
  CHECK_ERROR(fp16_dyn_adam({}, {.init_scale = 1e300, .min_scale = 1e300}), "scale");
  for (double bad : {1e300, 1e-300, 1e-45}) {
    CAPTURE(bad);
    CHECK_ERROR(fp32_adam({.gradient_predivide = bad}), "gradient_predivide");
  }
  CHECK_NOTHROW(fp16_dyn_adam({}, {.init_scale = 0x1p64}));  // the largest loss scale
}

TEST_CASE("load() of a 1-bit LAMB state refuses its compression counters written as floats or out of range") {
  using onebit = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::onebit_lamb>;
  temp_dir dir;
  const auto good = save_from<onebit>(dir, "onebit.safetensors", default_layout, scaler_opts);
  rig<onebit> a(default_layout, {}, scaler_opts, 0.5f), b(default_layout, {}, scaler_opts, 0.5f);
  a.step();
  b.step();
  const auto p = dir / "edited.safetensors";
  auto reject = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& needle) {
    rewrite(good, p, edit);
    CHECK_ERROR(a.opt.load(p), needle);
    CHECK(a.snap() == b.snap());
  };
  reject([](nlohmann::json& m) { m["groups"][0]["options"]["freeze_step"] = 1e30; }, "freeze_step");
  reject([](nlohmann::json& m) { m["groups"][0]["options"]["freeze_step"] = -1; }, "freeze_step");
  reject([](nlohmann::json& m) { m["compression"]["compression_step"] = 1e30; }, "compression_step");
  reject([](nlohmann::json& m) { m["compression"]["world_size"] = 1e30; }, "world_size");
  reject([](nlohmann::json& m) { m["compression"]["world_size"] = 0; }, "world_size");
  reject([](nlohmann::json& m) { m["compression"]["scaling_ready"] = 1; }, "scaling_ready");
  check_twins(a, b);
}

TEST_CASE("registration refuses memory shared by two tensors, naming both, and registers nothing") {
  fp32_adam opt;
  std::vector<float> w(64, 1.0f), gw(64, 0.0f), b(8, 1.0f), gb(8, 0.0f), spare(64, 0.0f);
  const std::span<float> ws(w), gws(gw), bs(b), spares(spare);
  auto& g0 = opt.add_group({});
  g0.add(w, gw, "w");
  auto& g1 = opt.add_group({});
  CHECK_ERROR(g1.add(w, spare, "w_again"), "'w'");  // the same parameter under two names, across groups
  CHECK_ERROR(g1.add(w, spare, "w_again"), "'w_again'");
  CHECK_ERROR(g0.add(b, gws.subspan(0, 8), "b"), "'w'");                  // another tensor's gradient
  CHECK_ERROR(g0.add(gws.subspan(60, 4), spares.subspan(0, 4), "tail"), "'w'");  // a gradient as a parameter
  CHECK_ERROR(g1.add(bs.subspan(0, 1), ws.subspan(63, 1), "last"), "'w'");  // the last element alone
  CHECK(g0.size() == 1);
  CHECK(g1.size() == 0);
  CHECK_NOTHROW(g1.add(b, gb, "x"));
  CHECK_ERROR(g1.add(gb, spares.subspan(0, 8), "y"), "'x'");  // x's gradient as y's parameter
  CHECK(g1.size() == 1);
  // Adjacent, not overlapping: accepted.
  std::vector<float> whole(20, 0.0f);
  const std::span<float> all(whole);
  CHECK_NOTHROW(g1.add(all.subspan(0, 5), all.subspan(5, 5), "left"));
  CHECK_NOTHROW(g1.add(all.subspan(10, 5), all.subspan(15, 5), "right"));
  // A flat group's views handed to add() again.
  auto& flat = opt.add_flat_group({}, {{"f", 6}});
  CHECK_ERROR(g1.add(flat.param(0), spares.subspan(0, 6), "f_again"), "'f'");
  CHECK(g1.size() == 3);
  opt.step();
}

/// A layout whose owner() gives two shards to one rank, or a rank that does not exist.
struct crowded_zero1 : mpopt::zero1 {
  static constexpr std::string_view name = "crowded_zero1";
  struct layout : mpopt::one_shard_each {
    static std::size_t owner(std::size_t shard, std::size_t) { return shard + 1; }
  };
};
/// A sharded layout over replicated's exchange, which works on every element: not a partition.
struct sharded_replicated : mpopt::replicated {
  using layout = mpopt::one_shard_each;
};
static_assert(mpopt::partition_policy<crowded_zero1, mpopt::fp32, mpopt::host, mpopt::single_process>);
static_assert(!mpopt::partition_policy<sharded_replicated, mpopt::fp32, mpopt::host, mpopt::single_process>);

TEST_CASE("a partition whose layout does not give each rank one shard is refused at finalize(), naming it") {
  mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, crowded_zero1, mpopt::adam> opt;
  std::vector<float> w(64, 1.0f), gw(64, 0.0f);
  opt.add_group({}).add(w, gw, "w");
  CHECK_ERROR(opt.finalize(), "partition crowded_zero1: its layout's owner(0, 1) is 1");
  CHECK(w == std::vector<float>(64, 1.0f));
}

TEST_CASE("registration checks overlap across many tensors in any order") {
  // 2,000 tensors carved out of two buffers in shuffled order, then one that overlaps a random one.
  fp32_adam opt;
  constexpr std::size_t n = 2000, size = 3;
  std::vector<float> params(n * size, 0.5f), grads(n * size, 0.0f);
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(11));
  auto& g = opt.add_group({});
  const std::span<float> ps(params), gs(grads);
  for (std::size_t i : order)  // append, not "t" + ...: GCC 12 warns falsely there (-Wrestrict, PR105651)
    g.add(ps.subspan(i * size, size), gs.subspan(i * size, size), std::string("t").append(std::to_string(i)));
  std::vector<float> spare(size);
  const std::string msg = error_of([&] { g.add(spare, gs.subspan(1234 * size + 2, size), "late"); });
  INFO(msg);
  CHECK(msg.find("'late'") != std::string::npos);
  CHECK((msg.find("'t1234'") != std::string::npos || msg.find("'t1235'") != std::string::npos));
  CHECK(g.size() == n);
}

TEST_CASE("host::use_threads: a negative count is refused and changes nothing; the count and threshold hold") {
  const threads_restored restore;
  mpopt::host::use_threads(1, 1000);
  CHECK(error_of([] { mpopt::host::use_threads(-1); }) ==
        "mpopt: host::use_threads: -1 threads (0 is OpenMP's count)");
  CHECK(mpopt::host::threads() == 1);
  CHECK(mpopt::detail::host_threads(1'000'000) == 1);
#if defined(_OPENMP)
  mpopt::host::use_threads(3, 1000);  // one thread per 1,000 elements begun, at most 3
  CHECK(mpopt::host::threads() == 3);
  CHECK(mpopt::detail::host_threads(1000) == 1);
  CHECK(mpopt::detail::host_threads(1001) == 2);
  CHECK(mpopt::detail::host_threads(1'000'000) == 3);
  mpopt::host::use_threads(0);  // OpenMP's count, the measured threshold
  CHECK(mpopt::host::threads() == omp_get_max_threads());
  CHECK(mpopt::detail::host_threads(mpopt::detail::default_elements_per_thread()) == 1);
#endif
}

}  // TEST_SUITE
