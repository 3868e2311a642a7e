// Tests for mpopt/convert.hpp and the vector primitives of mpopt/detail/simd_convert.hpp: every
// vector path must give the same bits as the scalar conversions, and partial accesses must not
// touch memory past their last lane.
#include <doctest/doctest.h>

#include <mpopt/convert.hpp>

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
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

// Scalar reference for one element (for the vector primitive tests).
#if MPOPT_HAVE_AVX512 || MPOPT_HAVE_AVX2
float widen(float f) { return f; }
float widen(half h) { return detail::half_bits_to_float(h.bits); }
float widen(bfloat16 b) { return detail::bfloat16_bits_to_float(b.bits); }
#endif
template <class T>
T narrow(float f) {
  if constexpr (std::is_same_v<T, half>) {
    return half::from_bits(detail::float_to_half_bits(f));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return bfloat16::from_bits(detail::float_to_bfloat16_bits(f));
  } else {
    return f;
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
  TEST_CASE("the widest vector path the compiler targets is selected") {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    CHECK(MPOPT_HAVE_AVX512 == 1);
#else
    CHECK(MPOPT_HAVE_AVX512 == 0);
#endif
#if defined(__AVX2__) && defined(__F16C__)
    CHECK(MPOPT_HAVE_AVX2 == 1);
#else
    CHECK(MPOPT_HAVE_AVX2 == 0);
#endif
    const std::string path = MPOPT_HAVE_AVX512 ? "AVX-512" : MPOPT_HAVE_AVX2 ? "AVX2+F16C" : "scalar";
    MESSAGE("convert() path: " << path);
  }

  TEST_CASE_TEMPLATE_DEFINE("convert is bit-identical to convert_scalar for all sizes and unaligned starts", P,
                            bulk_directions) {
    using From = typename P::first_type;
    using To = typename P::second_type;
    for (std::size_t n : {0u, 1u, 7u, 8u, 15u, 16u, 17u, 31u, 33u, 1000u, (1u << 20) + 3u}) {
      check_bulk<From, To>(n, 0, 0);
      check_bulk<From, To>(n, 1, 1);
      check_bulk<From, To>(n, 1, 0);
    }
  }
  TEST_CASE_TEMPLATE_INVOKE(bulk_directions, std::pair<float, half>, std::pair<float, bfloat16>,
                            std::pair<half, float>, std::pair<bfloat16, float>);

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
  }

#if MPOPT_HAVE_AVX512
  TEST_CASE("load16/store16 on full vectors are bit-identical to the scalar conversions") {
    namespace simd = detail::simd;
    std::vector<std::uint16_t> all(0x10000);
    for (std::uint32_t i = 0; i < 0x10000; ++i) all[i] = static_cast<std::uint16_t>(i);
    std::size_t bad = 0;
    alignas(64) std::array<float, 16> lanes{};
    for (std::size_t i = 0; i < all.size(); i += 16) {  // every half and bfloat16 pattern
      simd::store16(lanes.data(), simd::load16(reinterpret_cast<const half*>(all.data() + i)));
      for (std::size_t k = 0; k < 16; ++k) bad += raw(lanes[k]) != raw(widen(half::from_bits(all[i + k])));
      simd::store16(lanes.data(), simd::load16(reinterpret_cast<const bfloat16*>(all.data() + i)));
      for (std::size_t k = 0; k < 16; ++k) bad += raw(lanes[k]) != raw(widen(bfloat16::from_bits(all[i + k])));
    }
    const std::vector<float> f = random_floats(std::size_t{1} << 20, 77);
    std::array<half, 16> h{};
    std::array<bfloat16, 16> b{};
    for (std::size_t i = 0; i < f.size(); i += 16) {
      const __m512 v = simd::load16(f.data() + i);
      simd::store16(h.data(), v);
      simd::store16(b.data(), v);
      simd::store16(lanes.data(), v);
      for (std::size_t k = 0; k < 16; ++k) {
        bad += h[k].bits != narrow<half>(f[i + k]).bits;
        bad += b[k].bits != narrow<bfloat16>(f[i + k]).bits;
        bad += raw(lanes[k]) != raw(f[i + k]);
      }
    }
    CHECK(bad == 0);
  }

  TEST_CASE_TEMPLATE("masked load16 reads only the active lanes and zeroes the others, n = 0..16", T, float, half,
                     bfloat16) {
    namespace simd = detail::simd;
    const std::vector<T> src = random_inputs<T>(16, 11);
    std::array<float, 16> lanes{};
    for (unsigned n = 0; n <= 16; ++n) {
      CAPTURE(n);
      simd::store16(lanes.data(), simd::load16(src.data(), simd::first_lanes16(n)));
      for (unsigned k = 0; k < 16; ++k) CHECK(raw(lanes[k]) == (k < n ? raw(widen(src[k])) : 0u));
#if defined(__unix__)
      const guarded_page page;  // the first n elements end at the inaccessible page
      T* p = page.end<T>() - n;
      std::memcpy(static_cast<void*>(p), src.data(), n * sizeof(T));
      simd::store16(lanes.data(), simd::load16(p, simd::first_lanes16(n)));
      for (unsigned k = 0; k < n; ++k) CHECK(raw(lanes[k]) == raw(widen(src[k])));
#endif
    }
    std::mt19937 rng(3);
    for (int rep = 0; rep < 64; ++rep) {  // arbitrary, non-prefix masks
      const auto m = static_cast<__mmask16>(rng());
      simd::store16(lanes.data(), simd::load16(src.data(), m));
      for (unsigned k = 0; k < 16; ++k) CHECK(raw(lanes[k]) == (((m >> k) & 1) ? raw(widen(src[k])) : 0u));
    }
  }

  TEST_CASE_TEMPLATE("masked store16 writes only the active lanes, n = 0..16", T, float, half, bfloat16) {
    namespace simd = detail::simd;
    const std::vector<float> f = random_floats(16, 12);
    const __m512 v = simd::load16(f.data());
    for (unsigned n = 0; n <= 16; ++n) {
      CAPTURE(n);
      std::array<T, 18> buf;  // one guard element each side
      std::memset(static_cast<void*>(buf.data()), sentinel, sizeof buf);
      simd::store16(buf.data() + 1, v, simd::first_lanes16(n));
      CHECK(untouched(buf.data(), 1));
      for (unsigned k = 0; k < n; ++k) CHECK(raw(buf[1 + k]) == raw(narrow<T>(f[k])));
      CHECK(untouched(buf.data() + 1 + n, 17 - n));
#if defined(__unix__)
      const guarded_page page;
      T* p = page.end<T>() - n;
      simd::store16(p, v, simd::first_lanes16(n));
      for (unsigned k = 0; k < n; ++k) CHECK(raw(p[k]) == raw(narrow<T>(f[k])));
#endif
    }
    std::mt19937 rng(4);
    for (int rep = 0; rep < 64; ++rep) {
      const auto m = static_cast<__mmask16>(rng());
      std::array<T, 16> buf;
      std::memset(static_cast<void*>(buf.data()), sentinel, sizeof buf);
      simd::store16(buf.data(), v, m);
      for (unsigned k = 0; k < 16; ++k) {
        if ((m >> k) & 1) {
          CHECK(raw(buf[k]) == raw(narrow<T>(f[k])));
        } else {
          CHECK(untouched(buf.data() + k, 1));
        }
      }
    }
  }
#endif  // MPOPT_HAVE_AVX512

#if MPOPT_HAVE_AVX2
  TEST_CASE("load8/store8 on full vectors are bit-identical to the scalar conversions") {
    namespace simd = detail::simd;
    std::vector<std::uint16_t> all(0x10000);
    for (std::uint32_t i = 0; i < 0x10000; ++i) all[i] = static_cast<std::uint16_t>(i);
    std::size_t bad = 0;
    std::array<float, 8> lanes{};
    for (std::size_t i = 0; i < all.size(); i += 8) {
      simd::store8(lanes.data(), simd::load8(reinterpret_cast<const half*>(all.data() + i)));
      for (std::size_t k = 0; k < 8; ++k) bad += raw(lanes[k]) != raw(widen(half::from_bits(all[i + k])));
      simd::store8(lanes.data(), simd::load8(reinterpret_cast<const bfloat16*>(all.data() + i)));
      for (std::size_t k = 0; k < 8; ++k) bad += raw(lanes[k]) != raw(widen(bfloat16::from_bits(all[i + k])));
    }
    const std::vector<float> f = random_floats(std::size_t{1} << 20, 78);
    std::array<half, 8> h{};
    std::array<bfloat16, 8> b{};
    for (std::size_t i = 0; i < f.size(); i += 8) {
      const __m256 v = simd::load8(f.data() + i);
      simd::store8(h.data(), v);
      simd::store8(b.data(), v);
      simd::store8(lanes.data(), v);
      for (std::size_t k = 0; k < 8; ++k) {
        bad += h[k].bits != narrow<half>(f[i + k]).bits;
        bad += b[k].bits != narrow<bfloat16>(f[i + k]).bits;
        bad += raw(lanes[k]) != raw(f[i + k]);
      }
    }
    CHECK(bad == 0);
  }

  TEST_CASE_TEMPLATE("partial load8 reads only the first n elements and zeroes the rest, n = 0..8", T, float, half,
                     bfloat16) {
    namespace simd = detail::simd;
    const std::vector<T> src = random_inputs<T>(8, 13);
    std::array<float, 8> lanes{};
    for (int n = 0; n <= 8; ++n) {
      CAPTURE(n);
      simd::store8(lanes.data(), simd::load8(src.data(), n));
      for (int k = 0; k < 8; ++k) CHECK(raw(lanes[k]) == (k < n ? raw(widen(src[k])) : 0u));
#if defined(__unix__)
      const guarded_page page;
      T* p = page.end<T>() - n;
      std::memcpy(static_cast<void*>(p), src.data(), static_cast<std::size_t>(n) * sizeof(T));
      simd::store8(lanes.data(), simd::load8(p, n));
      for (int k = 0; k < n; ++k) CHECK(raw(lanes[k]) == raw(widen(src[k])));
#endif
    }
  }

  TEST_CASE_TEMPLATE("partial store8 writes only the first n elements, n = 0..8", T, float, half, bfloat16) {
    namespace simd = detail::simd;
    const std::vector<float> f = random_floats(8, 14);
    const __m256 v = simd::load8(f.data());
    for (int n = 0; n <= 8; ++n) {
      CAPTURE(n);
      std::array<T, 10> buf;
      std::memset(static_cast<void*>(buf.data()), sentinel, sizeof buf);
      simd::store8(buf.data() + 1, v, n);
      CHECK(untouched(buf.data(), 1));
      for (int k = 0; k < n; ++k) CHECK(raw(buf[1 + k]) == raw(narrow<T>(f[k])));
      CHECK(untouched(buf.data() + 1 + n, static_cast<std::size_t>(9 - n)));
#if defined(__unix__)
      const guarded_page page;
      T* p = page.end<T>() - n;
      simd::store8(p, v, n);
      for (int k = 0; k < n; ++k) CHECK(raw(p[k]) == raw(narrow<T>(f[k])));
#endif
    }
  }
#endif  // MPOPT_HAVE_AVX2
}
