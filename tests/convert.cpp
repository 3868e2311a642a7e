// Tests for mpopt/convert.hpp, which runs the host backend's lanes at its SIMD level, and so for the
// vector primitives of mpopt/detail/lanes/simd_convert.hpp: at every level this CPU runs, convert() gives
// the scalar conversions' bits, and the tail of a vector touches no memory past its last element.
// Also stochastic rounding (mpopt/detail/lanes/stochastic_rounding.hpp): every lane type's bits, exact
// unbiasedness over every noise value, and the hashed noise's mean in practice.
#include <doctest/doctest.h>

#include <mpopt/convert.hpp>
#include <mpopt/detail/lanes/stochastic_rounding.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__unix__)
#include <sys/mman.h>
#include <unistd.h>
#endif

using mpopt::bfloat16;
using mpopt::half;
namespace detail = mpopt::detail;

namespace {

// Floats with a heavy share of the hard cases: NaNs (quiet and signalling, both signs), infinities,
// zeros, float subnormals, half-range values, exact half and bfloat16 ties, and uniform bit patterns.
std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  static constexpr std::uint32_t special[] = {
      0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA02000,
      0xFFBFFFFF, 0x00000001, 0x807FFFFF, 0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001, 0x387FC000,
      0x7F7F8000, 0x7F7FFFFF, 0x3F808000, 0x3F818000};
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (auto& f : v) {
    const std::uint64_t r = rng();
    const auto hi = static_cast<std::uint32_t>(r >> 32);
    const std::uint32_t sign = hi & 0x80000000u;
    const std::uint32_t in_half_range = sign | ((100u + (hi >> 8) % 44u) << 23) | (hi & 0x007FFFFFu);
    std::uint32_t u = 0;
    switch (r % 8) {
      case 0: u = special[(r >> 8) % std::size(special)]; break;
      case 1: u = sign | 0x7F800000u | ((hi & 0x007FFFFFu) ? (hi & 0x007FFFFFu) : 0x00400000u); break;  // NaN
      case 2: u = sign | (hi & 0x007FFFFFu); break;                                                    // subnormal
      case 3: u = in_half_range; break;
      case 4: u = (in_half_range & ~0x1FFFu) | 0x1000u; break;  // half tie
      case 5: u = (hi & ~0xFFFFu) | 0x8000u; break;              // bfloat16 tie
      default: u = hi;
    }
    f = std::bit_cast<float>(u);
  }
  return v;
}

template <class T>
std::vector<T> random_16bit(std::size_t n, std::uint64_t seed) {  // uniform: includes NaN, inf, subnormals
  std::mt19937_64 rng(seed);
  std::vector<T> v(n);
  for (auto& x : v) x = T::from_bits(static_cast<std::uint16_t>(rng()));
  return v;
}

template <class T>
std::vector<T> random_inputs(std::size_t n, std::uint64_t seed) {
  if constexpr (std::is_same_v<T, float>) {
    return random_floats(n, seed);
  } else {
    return random_16bit<T>(n, seed);
  }
}

template <class T>
std::uint32_t raw(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<std::uint32_t>(x);
  } else {
    return x.bits;
  }
}

constexpr unsigned char sentinel = 0xA5;

template <class T>
bool untouched(const T* p, std::size_t count) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < count * sizeof(T); ++i) {
    if (bytes[i] != sentinel) return false;
  }
  return true;
}

// convert() on [in_off, in_off + n) of a random input into an output placed out_off elements into
// a sentinel-filled buffer; compares against convert_scalar and checks the guard elements.
template <class From, class To>
void check_bulk(std::size_t n, std::size_t in_off, std::size_t out_off) {
  CAPTURE(n);
  CAPTURE(in_off);
  CAPTURE(out_off);
  const std::vector<From> src = random_inputs<From>(n + in_off, n * 31 + in_off);
  const std::span<const From> in(src.data() + in_off, n);
  std::vector<To> got(n + out_off + 2);
  std::vector<To> want(n + out_off + 2);
  std::memset(static_cast<void*>(got.data()), sentinel, got.size() * sizeof(To));
  std::memset(static_cast<void*>(want.data()), sentinel, want.size() * sizeof(To));
  mpopt::convert(in, std::span<To>(got.data() + 1 + out_off, n));
  detail::convert_scalar(in, std::span<To>(want.data() + 1 + out_off, n));
  CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(To)) == 0);
  CHECK(untouched(got.data(), 1 + out_off));
  CHECK(untouched(got.data() + 1 + out_off + n, 1));
}

template <class From, class To>
void check_mismatch(std::size_t in_n, std::size_t out_n) {
  const std::vector<From> in = random_inputs<From>(in_n, 5);
  std::vector<To> out(out_n);
  std::memset(static_cast<void*>(out.data()), sentinel, out.size() * sizeof(To));
  const std::string sizes[] = {std::to_string(in_n), std::to_string(out_n)};
  auto expect_throw = [&](auto&& call) {
    try {
      call();
      FAIL_CHECK("no exception for sizes " << in_n << " and " << out_n);
    } catch (const mpopt::error& e) {
      const std::string what = e.what();
      CHECK(what.find("input has " + sizes[0] + " elements") != std::string::npos);
      CHECK(what.find("output has " + sizes[1]) != std::string::npos);
    }
    CHECK(untouched(out.data(), out.size()));
  };
  expect_throw([&] { mpopt::convert(std::span<const From>(in), std::span<To>(out)); });
  expect_throw([&] { detail::convert_scalar(std::span<const From>(in), std::span<To>(out)); });
}

/// Stochastic rounding of in[j] as element first + j, through the host backend's lanes.
template <class T>
struct stochastic_pass {
  const float* in;
  float* rounded;
  std::size_t n;
  std::uint32_t key;
  std::uint64_t first;
  detail::pass_outputs out{};
  std::size_t count() const { return (n + detail::chunk_elements - 1) / detail::chunk_elements; }
  std::size_t size(std::size_t ci) const { return std::min(detail::chunk_elements, n - ci * detail::chunk_elements); }
  std::size_t at(std::size_t ci) const { return ci * detail::chunk_elements; }
  template <class L, class Tail, class R>
  void apply(std::size_t at, std::size_t i, Tail tail, R&) const {
    const auto x = detail::vload<L>(in + at + i, tail);
    detail::vstore<L>(rounded + at + i, L::template round_stochastic<T>(x, key, first + at + i), tail);
  }
};

template <class T>
double magnitude(std::uint16_t bits) {
  return std::fabs(double(float(T::from_bits(bits))));
}

/// The T values either side of |x| (equal when x is one), found from the nearest one by stepping its
/// bits; past the largest finite value, the step that would follow it (what inf stands for there).
template <class T>
std::pair<double, double> neighbours(float x) {
  const std::uint16_t b = T(x).bits & 0x7FFF;
  const double v = magnitude<T>(b), ax = std::fabs(double(x));
  if (v == ax) return {v, v};
  auto at = [](std::uint16_t c) {
    const double m = magnitude<T>(c);
    return std::isinf(m) ? 2 * magnitude<T>(std::uint16_t(c - 1)) - magnitude<T>(std::uint16_t(c - 2)) : m;
  };
  return v < ax ? std::pair{v, at(std::uint16_t(b + 1))} : std::pair{at(std::uint16_t(b - 1)), at(b)};
}

/// f() at every SIMD level this CPU runs, then back at the level before.
template <class F>
void at_every_level(F&& f) {
  const auto before = mpopt::host::simd();
  for (auto level : {mpopt::simd_level::scalar, mpopt::simd_level::avx2, mpopt::simd_level::avx512}) {
    if (!mpopt::cpu_supports(level)) continue;
    CAPTURE(std::string(mpopt::to_string(level)));
    mpopt::host::use_simd(level);
    f();
  }
  mpopt::host::use_simd(before);
}

#if defined(__unix__)
// Two pages, the second inaccessible: any access at or past end() faults, so a partial load/store
// that only touches its active lanes can be placed to end exactly there.
class guarded_page {
 public:
  guarded_page() : size_(static_cast<std::size_t>(sysconf(_SC_PAGESIZE))) {
    base_ = mmap(nullptr, 2 * size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(base_ != MAP_FAILED);
    REQUIRE(mprotect(static_cast<char*>(base_) + size_, size_, PROT_NONE) == 0);
  }
  guarded_page(const guarded_page&) = delete;
  guarded_page& operator=(const guarded_page&) = delete;
  ~guarded_page() { munmap(base_, 2 * size_); }
  template <class T>
  T* end() const {
    return reinterpret_cast<T*>(static_cast<char*>(base_) + size_);
  }

 private:
  std::size_t size_;
  void* base_ = nullptr;
};
#endif

}  // namespace

TEST_SUITE("convert") {
  TEST_CASE("the SIMD level is the best this CPU runs (or MPOPT_SIMD's); use_simd refuses the others") {
    const char* env = std::getenv("MPOPT_SIMD");
    const auto best = mpopt::cpu_supports(mpopt::simd_level::avx512) ? mpopt::simd_level::avx512
                      : mpopt::cpu_supports(mpopt::simd_level::avx2) ? mpopt::simd_level::avx2
                                                                      : mpopt::simd_level::scalar;
    if (env == nullptr || *env == '\0') CHECK(mpopt::host::simd() == best);
    else CHECK(mpopt::to_string(mpopt::host::simd()) == env);
    MESSAGE("host SIMD level: " << mpopt::to_string(mpopt::host::simd()) << " (best here: " << mpopt::to_string(best) << ")");
    CHECK(mpopt::cpu_supports(mpopt::simd_level::scalar));
    const auto before = mpopt::host::simd();
    for (auto level : {mpopt::simd_level::avx2, mpopt::simd_level::avx512}) {
      if (mpopt::cpu_supports(level)) continue;
      try {
        mpopt::host::use_simd(level);
        FAIL_CHECK("use_simd accepted " << mpopt::to_string(level));
      } catch (const mpopt::error& e) {
        const std::string what = e.what(), name(mpopt::to_string(level));
        const bool named = what.find("cannot run " + name) != std::string::npos ||
                           what.find("use_simd: " + name + " is not in this build") != std::string::npos;
        CHECK_MESSAGE(named, what);
      }
      CHECK(mpopt::host::simd() == before);
    }
  }

  TEST_CASE_TEMPLATE_DEFINE("convert is bit-identical to convert_scalar for all sizes and unaligned starts", P,
                            bulk_directions) {
    using From = typename P::first_type;
    using To = typename P::second_type;
    at_every_level([] {
      for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 15u, 16u, 17u, 31u, 33u, 1000u, (1u << 20) + 3u}) {
        check_bulk<From, To>(n, 0, 0);
        check_bulk<From, To>(n, 1, 1);
        check_bulk<From, To>(n, 1, 0);
      }
    });
  }
  TEST_CASE_TEMPLATE_INVOKE(bulk_directions, std::pair<float, half>, std::pair<float, bfloat16>,
                            std::pair<half, float>, std::pair<bfloat16, float>);

  TEST_CASE_TEMPLATE("stochastic rounding: every SIMD level gives the scalar bits, also where indices cross 2^32", T,
                     half, bfloat16) {
    const std::vector<float> in = random_floats(5000, 0x5707);
    std::vector<float> got(in.size()), want(in.size());
    for (std::uint64_t seed : {0ull, 0x1234567890ABCDEFull})
      for (std::uint64_t first : {0ull, (1ull << 32) - 37, 3 * (1ull << 32) - 1, (1ull << 40) + 5}) {
        CAPTURE(seed);
        CAPTURE(first);
        const std::uint32_t key = detail::rounding_key(seed, 17);
        for (std::size_t j = 0; j < in.size(); ++j)
          want[j] = detail::stochastic_round<T>(in[j], detail::rounding_noise(key, first + j));
        at_every_level([&] {
          for (std::size_t n : {in.size(), std::size_t{0}, std::size_t{1}, std::size_t{37}}) {
            std::fill(got.begin(), got.end(), -1.0f);
            mpopt::host::run_flat(stochastic_pass<T>{in.data(), got.data(), n, key, first}, true);
            CHECK(std::memcmp(got.data(), want.data(), n * sizeof(float)) == 0);
            CHECK(std::all_of(got.begin() + std::ptrdiff_t(n), got.end(), [](float v) { return v == -1.0f; }));
          }
        });
        // What is stored next rounds to nearest: exact for every value up to the largest finite,
        // inf beyond it.
        const float largest = float(std::numeric_limits<T>::max());
        for (float r : want) {
          if (std::isnan(r)) continue;
          const float stored = float(T(r));
          if (std::fabs(r) <= largest) CHECK(std::bit_cast<std::uint32_t>(stored) == std::bit_cast<std::uint32_t>(r));
          else CHECK((std::isinf(stored) && std::signbit(stored) == std::signbit(r)));
        }
      }
  }

  TEST_CASE_TEMPLATE("stochastic rounding goes to a neighbour, up with exactly the dropped fraction over all noise",
                     T, half, bfloat16) {
    // noise_j = j << 8 | j >> 16 for j < 2^24 is uniform on the low 16 bits and on the high 24: every
    // threshold each format's rule reads (docs/concepts.md, "Rounding") comes equally often.
    std::mt19937_64 rng(0x5708);
    std::vector<float> xs = {1.0f + 0x1p-9f, -3.1415926f, 65519.0f, -65503.5f, 6.0e-5f, 6.1e-5f, 1.0e-7f, -2.9e-8f,
                             1.0e-30f,       3.0e38f,     -0x1.fffffep127f, 0x1p-140f};
    for (int k = 0; k < 10; ++k) {
      const int e = std::uniform_int_distribution<int>(std::is_same_v<T, half> ? -27 : -130, std::is_same_v<T, half> ? 15 : 126)(rng);
      xs.push_back(std::ldexp(std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng), e));
    }
    for (float x : xs) {
      CAPTURE(x);
      if (std::is_same_v<T, half> && std::fabs(x) > 65535.0f) continue;  // beyond the step past 65504
      const auto [down, up] = neighbours<T>(x);
      const double fraction = up == down ? 0.0 : (std::fabs(double(x)) - down) / (up - down);
      const double largest = magnitude<T>(std::numeric_limits<T>::max().bits);
      std::uint64_t ups = 0;
      for (std::uint32_t j = 0; j < (1u << 24); ++j) {
        const float r = detail::stochastic_round<T>(x, j << 8 | j >> 16);
        const double m = std::isinf(r) && up > largest ? up : std::fabs(double(r));  // inf: the step past it
        if ((m != down && m != up) || std::signbit(r) != std::signbit(x)) {
          FAIL_CHECK("rounded to " << r << ", not to " << down << " or " << up << " with x's sign");
          break;
        }
        ups += m == up && up != down;
      }
      const double measured = double(ups) * 0x1p-24;
      if (std::fabs(x) >= 0x1p-25f || !std::is_same_v<T, half>) CHECK(measured == fraction);
      else CHECK(std::fabs(measured - fraction) <= 0x1p-24);  // half below 2^-25: within 2^-24 of a step
    }
    for (float x : {0.0f, -0.0f, INFINITY, -INFINITY})
      CHECK(std::bit_cast<std::uint32_t>(detail::stochastic_round<T>(x, 0xFFFFFFFFu)) == std::bit_cast<std::uint32_t>(x));
    CHECK(std::isnan(detail::stochastic_round<T>(NAN, 0xFFFFFFFFu)));
  }

  TEST_CASE_TEMPLATE("stochastic rounding with hashed noise: the mean of 20000 roundings is within 5 sigma of x", T,
                     half, bfloat16) {
    constexpr int n = 20000;
    for (float x : {1.0f + 0x1p-12f, -1.0f - 0x1.8p-12f, 3.0e-3f, 7.0e-7f, -123.456f}) {
      CAPTURE(x);
      const auto [down, up] = neighbours<T>(x);
      const double p = (std::fabs(double(x)) - down) / (up - down);
      const double bound = 5.0 * (up - down) * std::sqrt(p * (1.0 - p) / n);
      double over_steps = 0, over_elements = 0;
      for (int k = 0; k < n; ++k) {  // one element over n steps; n elements of one step
        over_steps += detail::stochastic_round<T>(x, detail::rounding_noise(detail::rounding_key(42, std::uint64_t(k) + 1), 1234567));
        over_elements += detail::stochastic_round<T>(x, detail::rounding_noise(detail::rounding_key(42, 9), std::uint64_t(k)));
      }
      CHECK(std::fabs(over_steps / n - double(x)) <= bound);
      CHECK(std::fabs(over_elements / n - double(x)) <= bound);
    }
  }

  TEST_CASE("a size mismatch throws mpopt::error naming both sizes and writes nothing") {
    check_mismatch<float, half>(5, 17);
    check_mismatch<float, bfloat16>(17, 5);
    check_mismatch<half, float>(0, 1);
    check_mismatch<bfloat16, float>(33, 32);
  }

  TEST_CASE("convert accepts contiguous containers directly") {
    std::vector<float> f = {1.0f, -2.5f, 65504.0f};
    std::vector<half> h(3);
    std::vector<bfloat16> b(3);
    mpopt::convert(f, h);
    mpopt::convert(f, b);
    std::array<float, 3> back{};
    mpopt::convert(h, back);
    CHECK(back == std::array<float, 3>{1.0f, -2.5f, 65504.0f});
    mpopt::convert(b, back);
    CHECK(back == std::array<float, 3>{1.0f, -2.5f, 65536.0f});
  }

  // Slow (about 25 s): run with --no-skip.
  TEST_CASE("exhaustive: convert equals convert_scalar for every float bit pattern" * doctest::skip()) {
    constexpr std::size_t chunk = std::size_t{1} << 20;
    std::vector<float> in(chunk);
    std::vector<half> h1(chunk), h2(chunk);
    std::vector<bfloat16> b1(chunk), b2(chunk);
    at_every_level([&] {
      std::size_t bad = 0;
      for (std::uint64_t start = 0; start < (std::uint64_t{1} << 32); start += chunk) {
        for (std::size_t i = 0; i < chunk; ++i) in[i] = std::bit_cast<float>(static_cast<std::uint32_t>(start + i));
        mpopt::convert(in, h1);
        detail::convert_scalar(in, h2);
        mpopt::convert(in, b1);
        detail::convert_scalar(in, b2);
        bad += std::memcmp(h1.data(), h2.data(), chunk * sizeof(half)) != 0;
        bad += std::memcmp(b1.data(), b2.data(), chunk * sizeof(bfloat16)) != 0;
      }
      CHECK(bad == 0);
    });
  }

  TEST_CASE("every half and bfloat16 bit pattern widens to the scalar conversion's bits") {
    std::vector<half> h(0x10000);
    std::vector<bfloat16> b(0x10000);
    for (std::uint32_t i = 0; i < 0x10000; ++i) {
      h[i] = half::from_bits(static_cast<std::uint16_t>(i));
      b[i] = bfloat16::from_bits(static_cast<std::uint16_t>(i));
    }
    std::vector<float> got(0x10000), want(0x10000);
    at_every_level([&] {
      mpopt::convert(h, got);
      detail::convert_scalar(std::span<const half>(h), std::span<float>(want));
      CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
      mpopt::convert(b, got);
      detail::convert_scalar(std::span<const bfloat16>(b), std::span<float>(want));
      CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    });
  }

#if defined(__unix__)
  TEST_CASE_TEMPLATE_DEFINE("a tail of n = 0..33 elements ending at an inaccessible page reads and writes only them", P,
                            guarded_directions) {
    using From = typename P::first_type;
    using To = typename P::second_type;
    const std::vector<From> src = random_inputs<From>(33, 21);
    at_every_level([&] {
      for (std::size_t n = 0; n <= 33; ++n) {
        CAPTURE(n);
        const guarded_page in_page, out_page;  // input and output both end where the next page faults
        From* in = in_page.end<From>() - n;
        To* out = out_page.end<To>() - n;
        std::memcpy(static_cast<void*>(in), src.data(), n * sizeof(From));
        std::vector<To> want(n);
        mpopt::convert(std::span<const From>(in, n), std::span<To>(out, n));
        detail::convert_scalar(std::span<const From>(in, n), std::span<To>(want));
        CHECK(std::memcmp(out, want.data(), n * sizeof(To)) == 0);
      }
    });
  }
  TEST_CASE_TEMPLATE_INVOKE(guarded_directions, std::pair<float, half>, std::pair<float, bfloat16>,
                            std::pair<half, float>, std::pair<bfloat16, float>);
#endif

}
