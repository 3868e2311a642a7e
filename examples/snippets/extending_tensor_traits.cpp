// The snippet of docs/extending.md, "Adapting your tensor type", made a translation unit; the stand-in
// is my::tensor.
#include <mpopt/tensor.hpp>

#include <cstddef>

namespace my {
struct tensor {
  float* data_ptr();
  std::size_t numel() const;
};
}  // namespace my

template <>
struct mpopt::tensor_traits<my::tensor> {
  using element_type = float;                                  // or mpopt::half / mpopt::bfloat16
  static float* data(my::tensor& t) { return t.data_ptr(); }   // contiguous storage
  static std::size_t size(const my::tensor& t) { return t.numel(); }
  static constexpr mpopt::memory_space space = mpopt::memory_space::host;
};

static_assert(mpopt::tensor_of<my::tensor, float>);
