// The snippet of docs/extending.md, "Adapting your tensor type" (other 16-bit types), made a
// translation unit; the stand-in is my::fp16.
#include <mpopt/numeric.hpp>

#include <cstdint>
#include <type_traits>

namespace my {
struct fp16 {
  std::uint16_t bits;
};
}  // namespace my

template <>
struct mpopt::numeric_traits<my::fp16> {
  using storage = mpopt::half;  // my::fp16 is IEEE binary16 (mpopt::bfloat16: the top half of a float)
};

static_assert(std::is_same_v<mpopt::storage_t<my::fp16>, mpopt::half>);
