// Tests for how the library sees a user's tensor (include/mpopt/tensor.hpp): the mpopt::tensor concept,
// the std::span / std::vector / mpopt::view adapters, a foreign tensor type adapted through a
// tensor_traits specialization and used with the optimizer end to end, and foreign 16-bit element
// types with mpopt's bits (numeric_traits: a user's own, and with MPOPT_TEST_EIGEN Eigen's through
// <mpopt/interop.hpp>) taken as they are.
#include <doctest/doctest.h>

#include <mpopt/mpopt.hpp>
// interop.hpp before Eigen declares nothing; included again after Eigen/Core, it adds Eigen's types.
#include <mpopt/interop.hpp>
#if MPOPT_TEST_EIGEN
#include <Eigen/Core>

#include <mpopt/interop.hpp>
#endif

#include "error_of.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

// ---------------------------------------------------------------------------------------------------
// Foreign tensor types, as a user's framework would have them.
namespace user {

// A row-major matrix owning its storage; its API knows nothing about mpopt.
template <class E>
class matrix {
 public:
  matrix(std::size_t rows, std::size_t cols) : rows_(rows), cols_(cols), data_(new E[rows * cols]) {}
  E* raw() { return data_.get(); }
  const E* raw() const { return data_.get(); }
  std::size_t rows() const { return rows_; }
  std::size_t cols() const { return cols_; }
  E& operator()(std::size_t r, std::size_t c) { return data_[r * cols_ + c]; }

 private:
  std::size_t rows_, cols_;
  std::unique_ptr<E[]> data_;
};

// A handle whose element count is an int (convertible to std::size_t, as the concept allows).
struct int_sized {
  float* p;
  int n;
};

// 16-bit element types of the user's own with the bits of mpopt::half and mpopt::bfloat16 (as a
// framework's fp16 type would be); numeric_traits below declares it.
struct f16 {
  std::uint16_t raw;
};
struct b16 {
  std::uint16_t raw;
};

// Types that are NOT tensors, each missing one requirement.
struct no_space {
  float* p;
};
struct const_data {
  const float* p;
};
struct no_size {
  float* p;
};

}  // namespace user

template <class E>
struct mpopt::tensor_traits<user::matrix<E>> {
  using element_type = E;
  static E* data(user::matrix<E>& m) { return m.raw(); }
  static std::size_t size(const user::matrix<E>& m) { return m.rows() * m.cols(); }
  static constexpr memory_space space = memory_space::host;
};

template <>
struct mpopt::tensor_traits<user::int_sized> {
  using element_type = float;
  static float* data(user::int_sized& t) { return t.p; }
  static int size(const user::int_sized& t) { return t.n; }
  static constexpr memory_space space = memory_space::host;
};

template <>
struct mpopt::tensor_traits<user::no_space> {
  using element_type = float;
  static float* data(user::no_space& t) { return t.p; }
  static std::size_t size(const user::no_space&) { return 1; }
};

template <>
struct mpopt::tensor_traits<user::const_data> {
  using element_type = float;
  static const float* data(user::const_data& t) { return t.p; }
  static std::size_t size(const user::const_data&) { return 1; }
  static constexpr memory_space space = memory_space::host;
};

template <>
struct mpopt::tensor_traits<user::no_size> {
  using element_type = float;
  static float* data(user::no_size& t) { return t.p; }
  static constexpr memory_space space = memory_space::host;
};

template <>
struct mpopt::numeric_traits<user::f16> {
  using storage = mpopt::half;
};
template <>
struct mpopt::numeric_traits<user::b16> {
  using storage = mpopt::bfloat16;
};

#if MPOPT_TEST_EIGEN
// Eigen's dense vectors, adapted as examples/eigen_tensor.cpp does.
template <class S>
struct mpopt::tensor_traits<Eigen::Matrix<S, Eigen::Dynamic, 1>> {
  using element_type = S;
  static S* data(Eigen::Matrix<S, Eigen::Dynamic, 1>& v) { return v.data(); }
  static std::size_t size(const Eigen::Matrix<S, Eigen::Dynamic, 1>& v) { return std::size_t(v.size()); }
  static constexpr memory_space space = memory_space::host;
};
#endif

namespace {

using mpopt::bfloat16;
using mpopt::half;

// ---------------------------------------------------------------------------------------------------
// The concept and the shipped adapters, at compile time.
static_assert(mpopt::tensor<std::vector<float>>);
static_assert(mpopt::tensor<std::vector<half>>);
static_assert(mpopt::tensor<std::vector<bfloat16>>);
static_assert(mpopt::tensor<std::vector<float>&>);  // cv-ref qualified spellings of a tensor are tensors
static_assert(mpopt::tensor<std::span<float>>);
static_assert(mpopt::tensor<std::span<half, 8>>);  // static extent
static_assert(mpopt::tensor<mpopt::view<float>>);
static_assert(mpopt::tensor<mpopt::view<bfloat16>>);
static_assert(mpopt::tensor<user::matrix<float>>);
static_assert(mpopt::tensor<user::matrix<half>>);
static_assert(mpopt::tensor<user::int_sized>);

static_assert(!mpopt::tensor<int>);
static_assert(!mpopt::tensor<float*>);
static_assert(!mpopt::tensor<std::array<float, 4>>);  // no adapter shipped
static_assert(!mpopt::tensor<std::span<const float>>);
static_assert(!mpopt::tensor<user::no_space>);
static_assert(!mpopt::tensor<user::const_data>);
static_assert(!mpopt::tensor<user::no_size>);

static_assert(std::is_same_v<mpopt::tensor_element_t<std::vector<half>>, half>);
static_assert(std::is_same_v<mpopt::tensor_element_t<std::span<bfloat16>>, bfloat16>);
static_assert(std::is_same_v<mpopt::tensor_element_t<const std::vector<float>&>, float>);
static_assert(std::is_same_v<mpopt::tensor_element_t<user::matrix<half>>, half>);
static_assert(std::is_same_v<mpopt::tensor_element_t<mpopt::view<float>>, float>);

// Element type mismatches are visible at compile time through tensor_of: an fp16 optimizer's
// param_type/grad_type is mpopt::half, so float or bfloat16 tensors do not qualify.
using fp32_adam = mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, mpopt::adam>;
using fp16_lamb = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::lamb>;
using bf16_adam = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::adam>;
static_assert(mpopt::tensor_of<std::vector<half>, fp16_lamb::param_type>);
static_assert(mpopt::tensor_of<std::vector<half>, fp16_lamb::grad_type>);
static_assert(!mpopt::tensor_of<std::vector<float>, fp16_lamb::param_type>);
static_assert(!mpopt::tensor_of<std::vector<bfloat16>, fp16_lamb::grad_type>);
static_assert(!mpopt::tensor_of<std::vector<half>, bf16_adam::param_type>);
static_assert(!mpopt::tensor_of<user::matrix<float>, bf16_adam::param_type>);
static_assert(!mpopt::tensor_of<std::span<half>, fp32_adam::grad_type>);
static_assert(mpopt::tensor_of<user::matrix<float>, fp32_adam::param_type>);
static_assert(!mpopt::tensor_of<int, float>);
// And param_group::add takes only tensors: a requires-expression rejects non-tensors.
template <class Group, class P, class G>
constexpr bool can_add = requires(Group& g, P& p, G& gr) { g.add(p, gr, "x"); };
static_assert(can_add<fp32_adam::param_group, std::vector<float>, std::vector<float>>);
static_assert(!can_add<fp32_adam::param_group, int, std::vector<float>>);
// A raw pointer without a length is taken by the overload that stops compilation naming
// add(param_ptr, grad_ptr, n, name) (tests/malformed_policies.cpp); with one, it is a tensor.
template <class Group, class P, class G>
constexpr bool can_add_raw = requires(Group& g, P p, G gr) { g.add(p, gr, 4, "x"); };
static_assert(can_add_raw<fp32_adam::param_group, float*, float*>);
static_assert(!can_add_raw<fp32_adam::param_group, float*, std::vector<float>>);
// A pointer and a count, of any integer type, is a parameter whose gradient the optimizer holds.
template <class Opt, class P, class N>
constexpr bool can_add_held = requires(typename Opt::param_group& g, P p, N n) {
  { g.add(p, n, "x") } -> std::same_as<std::span<typename Opt::grad_type>>;
};
static_assert(can_add_held<fp32_adam, float*, std::size_t>);
static_assert(can_add_held<fp16_lamb, half*, int>);
static_assert(can_add_held<fp16_lamb, user::f16*, unsigned>);
static_assert(!can_add<fp32_adam::param_group, std::span<const float>, std::vector<float>>);

// Element types with mpopt's bits (numeric_traits): the optimizer takes their tensors where its
// param_type/grad_type is their storage type, and only there; tensor_of stays exact.
static_assert(std::is_same_v<mpopt::storage_t<float>, float>);
static_assert(std::is_same_v<mpopt::storage_t<half>, half>);
static_assert(std::is_same_v<mpopt::storage_t<bfloat16>, bfloat16>);
static_assert(std::is_same_v<mpopt::storage_t<user::f16>, half>);
static_assert(std::is_same_v<mpopt::tensor_storage_t<std::vector<user::b16>&>, bfloat16>);
static_assert(mpopt::tensor_storing<std::vector<half>, fp16_lamb::param_type>);
static_assert(mpopt::tensor_storing<std::vector<user::f16>, fp16_lamb::param_type>);
static_assert(mpopt::tensor_storing<user::matrix<user::b16>, bf16_adam::grad_type>);
static_assert(mpopt::tensor_storing<mpopt::view<user::f16>, half>);
static_assert(!mpopt::tensor_storing<std::vector<user::f16>, bf16_adam::param_type>);  // fp16 bits are not bf16's
static_assert(!mpopt::tensor_storing<std::vector<user::b16>, fp16_lamb::grad_type>);
static_assert(!mpopt::tensor_storing<std::vector<user::f16>, fp32_adam::param_type>);
static_assert(!mpopt::tensor_storing<std::vector<std::uint16_t>, half>);  // same size, but not declared
static_assert(!mpopt::tensor_storing<std::vector<double>, float>);
static_assert(!mpopt::tensor_storing<int, float>);
static_assert(!mpopt::tensor_of<std::vector<user::f16>, half>);
#if MPOPT_TEST_EIGEN
using eigen_half_vector = Eigen::Matrix<Eigen::half, Eigen::Dynamic, 1>;
using eigen_bf16_vector = Eigen::Matrix<Eigen::bfloat16, Eigen::Dynamic, 1>;
static_assert(std::is_same_v<mpopt::storage_t<Eigen::half>, half>);
static_assert(std::is_same_v<mpopt::storage_t<Eigen::bfloat16>, bfloat16>);
static_assert(mpopt::tensor_storing<eigen_half_vector, fp16_lamb::param_type>);
static_assert(mpopt::tensor_storing<eigen_bf16_vector, bf16_adam::param_type>);
static_assert(mpopt::tensor_storing<Eigen::VectorXf, fp32_adam::param_type>);
static_assert(!mpopt::tensor_storing<eigen_half_vector, bf16_adam::param_type>);
static_assert(!mpopt::tensor_storing<eigen_bf16_vector, fp16_lamb::grad_type>);
#endif

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

bool same_status(const mpopt::step_status& a, const mpopt::step_status& b) {
  auto eq = [](double x, double y) { return std::bit_cast<std::uint64_t>(x) == std::bit_cast<std::uint64_t>(y); };
  return a.result == b.result && a.applied == b.applied && eq(a.scale_before, b.scale_before) &&
         eq(a.scale_after, b.scale_after) && eq(a.grad_norm, b.grad_norm) &&
         eq(a.grad_norm_clipped, b.grad_norm_clipped) && eq(a.clip_coef, b.clip_coef) && a.step == b.step &&
         a.skipped_steps == b.skipped_steps && a.consecutive_skips == b.consecutive_skips && a.micro_step == b.micro_step;
}

template <class E>
E value(std::size_t i, std::size_t step) {
  return E(0.2f * std::sin(0.3f * float(i) + 1.1f * float(step)) + (step == 0 ? 0.1f : 0.0f));
}

template <class E>
std::vector<std::uint16_t> bits16(std::span<const E> s) {
  std::vector<std::uint16_t> out;
  for (auto x : s) out.push_back(x.bits);
  return out;
}

// What a few steps leave behind, to compare bit for bit.
struct trace {
  std::vector<mpopt::step_status> statuses;
  std::vector<std::uint16_t> param;
  std::vector<float> master;
};

// Trains one 16-bit tensor, param and grad of any element types storing the optimizer's types, for 8
// steps (gradients scaled by the loss scale, an infinity at step 3); written through the elements' own
// types with the bits of mpopt::half/bfloat16 values.
template <class Opt, class P, class G>
trace train_16bit(Opt& opt, P& param, G& grad) {
  using S = typename Opt::param_type;
  const auto p = mpopt::as_view(param);
  const auto g = mpopt::as_view(grad);
  using PE = std::remove_pointer_t<decltype(p.data)>;
  using GE = std::remove_pointer_t<decltype(g.data)>;
  for (std::size_t i = 0; i < p.size; ++i) p.data[i] = std::bit_cast<PE>(value<S>(i, 0));
  opt.add_group({.lr = 1e-2, .weight_decay = 0.01}).add(param, grad, "w");
  // The optimizer's view of the tensor is the user's memory.
  CHECK(static_cast<void*>(opt.group(0).param(0).data()) == static_cast<void*>(p.data));
  CHECK(static_cast<void*>(opt.group(0).grad(0).data()) == static_cast<void*>(g.data));
  trace t;
  for (std::size_t step = 1; step <= 8; ++step) {
    const float scale = float(opt.loss_scale());
    for (std::size_t i = 0; i < g.size; ++i) g.data[i] = std::bit_cast<GE>(S(float(value<float>(i, step)) * scale));
    if (step == 3) g.data[5] = std::bit_cast<GE>(S(std::numeric_limits<float>::infinity()));
    t.statuses.push_back(opt.step());
  }
  for (std::size_t i = 0; i < p.size; ++i) t.param.push_back(std::bit_cast<std::uint16_t>(p.data[i]));
  t.master.assign(opt.master(0).begin(), opt.master(0).end());
  return t;
}

void check_same(const trace& a, const trace& b) {
  REQUIRE(a.statuses.size() == b.statuses.size());
  for (std::size_t s = 0; s < a.statuses.size(); ++s) {
    CAPTURE(s);
    CHECK(same_status(a.statuses[s], b.statuses[s]));
    CHECK(a.statuses[s].applied == (s != 2));  // step 3 overflowed
  }
  CHECK(a.param == b.param);
  REQUIRE(a.master.size() == b.master.size());
  CHECK(std::memcmp(a.master.data(), b.master.data(), sizeof(float) * a.master.size()) == 0);
  CHECK(a.master[0] != float(value<float>(0, 0)));  // it trained
}

}  // namespace

TEST_SUITE("tensor") {

TEST_CASE("as_view gives the data pointer, element count and memory space of each adapter") {
  std::vector<float> v(5, 1.0f);
  const auto vv = mpopt::as_view(v);
  CHECK(vv.data == v.data());
  CHECK(vv.size == 5);
  CHECK(vv.space == mpopt::memory_space::host);

  std::vector<half> h(7);
  std::span<half> s(h.data() + 2, 3);
  const auto sv = mpopt::as_view(s);
  CHECK(sv.data == h.data() + 2);
  CHECK(sv.size == 3);

  std::span<half, 4> fixed(h.data(), 4);
  CHECK(mpopt::as_view(fixed).size == 4);

  mpopt::view<bfloat16> raw{reinterpret_cast<bfloat16*>(h.data()), 6};
  const auto rv = mpopt::as_view(raw);
  CHECK(rv.data == raw.data);
  CHECK(rv.size == 6);
  CHECK(rv.space == mpopt::memory_space::host);

  user::matrix<float> m(3, 4);
  const auto mv = mpopt::as_view(m);
  CHECK(mv.data == m.raw());
  CHECK(mv.size == 12);

  std::vector<float> backing(9);
  user::int_sized is{backing.data(), 9};
  CHECK(mpopt::as_view(is).size == 9);
}

TEST_CASE("as_view keeps the memory space an mpopt::view says its memory is in") {
  std::vector<float> v(4);
  mpopt::view<float> dev{v.data(), v.size(), mpopt::memory_space::device};
  CHECK(mpopt::as_view(dev).space == mpopt::memory_space::device);
}

TEST_CASE("a foreign matrix type adapted via tensor_traits trains exactly like std::vector (fp32 Adam)") {
  constexpr std::size_t rows = 5, cols = 7, n = rows * cols;
  std::vector<float> vp(n), vg(n);
  user::matrix<float> mp(rows, cols), mg(rows, cols);
  for (std::size_t i = 0; i < n; ++i) vp[i] = mp.raw()[i] = value<float>(i, 0);
  std::vector<float> bp(3, 0.5f), bg(3), cp(3, 0.5f), cg(3);

  fp32_adam a, b;
  a.add_group({.lr = 1e-2, .weight_decay = 0.1}).add(vp, vg, "w");
  a.group(0).add(bp, bg, "bias");
  b.add_group({.lr = 1e-2, .weight_decay = 0.1}).add(mp, mg, "w");
  b.group(0).add(std::span<float>(cp), mpopt::view<float>{cg.data(), cg.size()}, "bias");  // rvalue adapters
  for (std::size_t step = 1; step <= 6; ++step) {
    CAPTURE(step);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) vg[r * cols + c] = mg(r, c) = value<float>(r * cols + c, step);
    for (std::size_t i = 0; i < 3; ++i) bg[i] = cg[i] = value<float>(i + 100, step);
    const auto sa = a.step(), sb = b.step();
    CHECK(sa.applied);
    CHECK(same_status(sa, sb));
  }
  for (std::size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(bits(mp.raw()[i]) == bits(vp[i]));
  }
  CHECK(std::memcmp(cp.data(), bp.data(), sizeof(float) * 3) == 0);
  CHECK(vp[0] != value<float>(0, 0));  // it trained
}

TEST_CASE("a foreign matrix of mpopt::half trains exactly like std::vector<half> (fp16, dynamic scale, LAMB)") {
  constexpr std::size_t rows = 4, cols = 9, n = rows * cols;
  std::vector<half> vp(n), vg(n);
  user::matrix<half> mp(rows, cols), mg(rows, cols);
  for (std::size_t i = 0; i < n; ++i) vp[i] = mp.raw()[i] = value<half>(i, 0);
  fp16_lamb a({}, {.init_scale = 256, .window = 2}), b({}, {.init_scale = 256, .window = 2});
  a.add_group({.lr = 1e-2}).add(vp, vg, "w");
  b.add_group({.lr = 1e-2}).add(mp, mg, "w");
  for (std::size_t step = 1; step <= 8; ++step) {
    CAPTURE(step);
    const float s = float(a.loss_scale());
    for (std::size_t i = 0; i < n; ++i) vg[i] = mg.raw()[i] = half(float(value<float>(i, step)) * s);
    if (step == 3) vg[5] = mg.raw()[5] = half(std::numeric_limits<float>::infinity());
    const auto sa = a.step(), sb = b.step();
    CHECK(same_status(sa, sb));
    CHECK(sa.applied == (step != 3));
  }
  CHECK(bits16<half>(std::span<const half>(mp.raw(), n)) == bits16<half>(std::span<const half>(vp)));
  for (std::size_t i = 0; i < n; ++i) CHECK(bits(a.master(0)[i]) == bits(b.master(0)[i]));
  CHECK(a.lamb_coeffs()[0] == b.lamb_coeffs()[0]);
}

TEST_CASE("the optimizer writes through the adapter into the user's own memory") {
  // bf16 with mpopt::view over a buffer the user owns: the update lands in that buffer, nowhere else.
  std::vector<bfloat16> storage(12, bfloat16(1.0f));
  std::vector<bfloat16> grads(12, bfloat16(0.0f));
  bf16_adam opt({.clip_grad = 0});
  opt.add_group({.lr = 0.5}).add(mpopt::view<bfloat16>{storage.data() + 2, 8}, std::span<bfloat16>(grads.data() + 2, 8), "middle");
  for (std::size_t i = 0; i < 12; ++i) grads[i] = bfloat16(1.0f);
  CHECK(opt.step().applied);
  CHECK(float(storage[0]) == 1.0f);
  CHECK(float(storage[1]) == 1.0f);
  for (std::size_t i = 2; i < 10; ++i) CHECK(float(storage[i]) == 0.5f);  // Adam's first step moves by lr
  CHECK(float(storage[10]) == 1.0f);
  CHECK(float(storage[11]) == 1.0f);
}

/// Tensors "w" (35 elements) and "b" (3) of fp16 LAMB, held by an engine in one allocation
/// (`params`, registered in `engine` by each test) and, as the reference, in vectors of their own.
struct raw_buffer_run {
  static constexpr std::size_t n_w = 35, n_b = 3, n = n_w + n_b;
  std::vector<half> params = values(0, n), vw = values(0, n_w), vgw = std::vector<half>(n_w),
                    vb = values(n_w, n_b), vgb = std::vector<half>(n_b);
  fp16_lamb reference{{}, {.init_scale = 256}}, engine{{}, {.init_scale = 256}};

  raw_buffer_run() {
    reference.add_group({.lr = 1e-2}).add(vw, vgw, "w");
    reference.group(0).add(vb, vgb, "b");
  }
  static std::vector<half> values(std::size_t first, std::size_t count) {
    std::vector<half> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = value<half>(first + i, 0);
    return v;
  }
  /// Four steps, the engine's gradient element i written by set_grad(i, g): the same bits as the
  /// reference's.
  template <class SetGrad>
  void train_and_compare(SetGrad set_grad) {
    for (std::size_t step = 1; step <= 4; ++step) {
      CAPTURE(step);
      const float s = float(reference.loss_scale());
      for (std::size_t i = 0; i < n; ++i) {
        const half g = half(float(value<float>(i, step)) * s);
        set_grad(i, g);
        (i < n_w ? vgw[i] : vgb[i - n_w]) = g;
      }
      const auto sa = reference.step(), sb = engine.step();
      CHECK(sa.applied);
      CHECK(same_status(sa, sb));
    }
    CHECK(bits16<half>(std::span<const half>(params.data(), n_w)) == bits16<half>(std::span<const half>(vw)));
    CHECK(bits16<half>(std::span<const half>(params.data() + n_w, n_b)) == bits16<half>(std::span<const half>(vb)));
    CHECK(bits(params[0]) != bits(value<half>(0, 0)));  // it trained
  }
};

TEST_CASE("raw pointers with a length train bit for bit like the same memory as tensors (an engine's flat buffers)") {
  // llm.c keeps every parameter in one allocation and every gradient in another.
  raw_buffer_run run;
  constexpr std::size_t n_w = raw_buffer_run::n_w;
  std::vector<half> grads(raw_buffer_run::n);
  auto& group = run.engine.add_group({.lr = 1e-2});
  group.add(run.params.data(), grads.data(), n_w, "w", {5, 7});
  group.add(run.params.data() + n_w, grads.data() + n_w, raw_buffer_run::n_b, "b");
  CHECK(group.shape(0) == mpopt::tensor_shape{5, 7});
  CHECK(group.name(1) == "b");
  // A null pointer is refused as for any tensor, naming it; nothing is registered.
  CHECK(error_of([&] { group.add(static_cast<half*>(nullptr), grads.data(), 4, "null"); }).find("'null' has a null") !=
        std::string::npos);
  CHECK(group.size() == 2);
  run.train_and_compare([&](std::size_t i, half g) { grads[i] = g; });
}

TEST_CASE("a parameter added with its length alone gets a gradient the optimizer holds, and trains bit for bit like "
          "one the user holds") {
  raw_buffer_run run;
  constexpr std::size_t n_w = raw_buffer_run::n_w, n = raw_buffer_run::n;
  std::vector<half>& params = run.params;
  auto& group = run.engine.add_group({.lr = 1e-2});
  const std::span<half> gw = group.add(params.data(), n_w, "w", {5, 7});
  const std::span<half> gb = group.add(reinterpret_cast<user::f16*>(params.data() + n_w), int(raw_buffer_run::n_b));
  CHECK(gw.size() == n_w);
  CHECK(gw.data() == group.grad(0).data());
  CHECK(gb.data() == group.grad(1).data());
  CHECK(group.param(1).data() == params.data() + n_w);
  CHECK(group.shape(0) == mpopt::tensor_shape{5, 7});
  CHECK(group.name(1) == "group 0.1");
  for (const half g : gw) CHECK(bits(g) == 0);  // zeros until the backward pass writes them

  // Bad input is refused, naming the tensor, and registers nothing.
  std::vector<half> spare(4);
  auto refused = [&](auto add, std::string_view message) {
    CAPTURE(message);
    CHECK(error_of(add).find(message) != std::string::npos);
    CHECK(group.size() == 2);
  };
  refused([&] { group.add(spare.data(), 0, "empty"); }, "tensor 'empty' has no elements");
  refused([&] { group.add(spare.data(), std::size_t(-1), "huge"); }, "tensor 'huge' has 18446744073709551615 elements: more");
  refused([&] { group.add(static_cast<half*>(nullptr), 4, "null"); }, "tensor 'null' has a null data pointer");
  refused([&] { group.add(spare.data(), 4, "w"); }, "tensor name 'w' is used twice");
  refused([&] { group.add(params.data() + 3, 4, "inside_w"); }, "its parameter memory overlaps the parameter of tensor 'w'");
  refused([&] { group.add(spare.data(), 4, "odd", {3}); }, "tensor 'odd': shape [3]");
  auto& flat = run.engine.add_flat_group({}, {{"f", 4}});
  CHECK(error_of([&] { flat.add(spare.data(), 4, "into_flat"); }).find("group 1 is a flat group") != std::string::npos);
  CHECK(flat.size() == 1);

  // The optimizer's gradients are its own in the memory report; the parameters stay the user's.
  const auto listed = [](const mpopt::memory_report& r, std::string_view name) -> const mpopt::memory_buffer* {
    for (const auto& buffer : r.buffers)
      if (buffer.name == name) return &buffer;
    return nullptr;
  };
  const auto report = run.engine.memory_report();
  REQUIRE(listed(report, "group 0 gradients"));
  CHECK(listed(report, "group 0 gradients")->bytes == n * sizeof(half));
  CHECK(listed(report, "group 0 gradients")->owned);
  REQUIRE(listed(report, "parameters"));
  CHECK(listed(report, "parameters")->bytes == n * sizeof(half));
  CHECK_FALSE(listed(report, "parameters")->owned);
  CHECK_FALSE(listed(report, "gradients"));  // the user holds none

  run.train_and_compare([&](std::size_t i, half g) { (i < n_w ? gw[i] : gb[i - n_w]) = g; });
  CHECK(error_of([&] { group.add(spare.data(), 4, "late"); }).find("cannot add tensor 'late' after the first step") !=
        std::string::npos);
}

TEST_CASE("flat group views are tensors and can be handed to code that takes tensors") {
  fp32_adam opt;
  auto& g = opt.add_flat_group({}, {{"a", 3}, {"b", 20}});
  static_assert(mpopt::tensor<decltype(g.param(0))>);
  static_assert(mpopt::tensor_of<decltype(g.grad(1)), float>);
  auto b = g.param(1);
  CHECK(mpopt::as_view(b).size == 20);
  CHECK(g.param(0).data() != g.param(1).data());
  CHECK(g.name(1) == "b");
}

TEST_CASE("a tensor with a null data pointer is rejected, naming it") {
  std::vector<float> g(4);
  fp32_adam opt;
  auto& group = opt.add_group({});
  bool threw = false;
  try {
    group.add(mpopt::view<float>{nullptr, 4}, g, "null_param");
  } catch (const mpopt::error& e) {
    threw = true;
    CHECK(std::string(e.what()).find("null_param") != std::string::npos);
  }
  CHECK(threw);
  CHECK(group.size() == 0);
}

TEST_CASE("a tensor registered without a name gets a generated, distinct one") {
  std::vector<float> p1(3), g1(3), p2(3), g2(3);
  fp32_adam opt;
  auto& group = opt.add_group({});
  group.add(p1, g1);
  group.add(p2, g2);
  CHECK_FALSE(group.name(0).empty());
  CHECK(group.name(0) != group.name(1));
}

}  // TEST_SUITE

TEST_SUITE("tensor") {

TEST_CASE("a tensor of a type numeric_traits maps to mpopt::half trains bit for bit like one of mpopt::half (fp16, dynamic scale)") {
  constexpr std::size_t n = 37;
  const mpopt::dynamic_scale_options scaler{.init_scale = 256, .window = 2};
  fp16_lamb a({}, scaler), b({}, scaler), c({}, scaler);
  std::vector<half> ap(n), ag(n), cg(n);
  std::vector<user::f16> bp(n), bg(n), cp(n);
  const trace ta = train_16bit(a, ap, ag);
  const trace tb = train_16bit(b, bp, bg);
  const trace tc = train_16bit(c, cp, cg);  // parameter of user::f16, gradient of mpopt::half
  check_same(ta, tb);
  check_same(ta, tc);
}

TEST_CASE("a tensor of a type numeric_traits maps to mpopt::bfloat16 trains bit for bit like one of mpopt::bfloat16 (bf16, LAMB)") {
  using bf16_lamb = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::lamb>;
  bf16_lamb a, b;
  user::matrix<bfloat16> ap(3, 11), ag(3, 11);
  user::matrix<user::b16> bp(3, 11), bg(3, 11);
  check_same(train_16bit(a, ap, ag), train_16bit(b, bp, bg));
  CHECK(a.lamb_coeffs()[0] == b.lamb_coeffs()[0]);
}

#if MPOPT_TEST_EIGEN
TEST_CASE("Eigen::half vectors train bit for bit like std::vector<mpopt::half> (fp16, dynamic scale, Adam)") {
  constexpr std::size_t n = 41;
  using fp16_adam = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, mpopt::adam>;
  fp16_adam a({}, {.init_scale = 1024, .window = 3}), b({}, {.init_scale = 1024, .window = 3});
  std::vector<half> ap(n), ag(n);
  eigen_half_vector bp(n), bg(n);
  check_same(train_16bit(a, ap, ag), train_16bit(b, bp, bg));
  CHECK(float(bp[0]) == float(ap[0]));  // Eigen reads the value the optimizer wrote
}

TEST_CASE("Eigen::bfloat16 vectors train bit for bit like std::vector<mpopt::bfloat16> (bf16, Adam)") {
  constexpr std::size_t n = 29;
  bf16_adam a, b;
  std::vector<bfloat16> ap(n), ag(n);
  eigen_bf16_vector bp(n), bg(n);
  check_same(train_16bit(a, ap, ag), train_16bit(b, bp, bg));
  CHECK(float(bp[3]) == float(ap[3]));
}
#endif

}  // TEST_SUITE
