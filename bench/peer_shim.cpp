// A C interface to one mpopt AdamW step over caller-owned buffers, and to the minimal-traffic kernel
// over the optimizer's own buffers: what bench/peers.py loads with ctypes to time mpopt beside
// DeepSpeed's and PyTorch's Adam in one process. Not part of the library.
#include "traffic.hpp"

#include <cstddef>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace {

thread_local std::string last_error;

struct peer {
  virtual ~peer() = default;
  virtual void step() = 0;
  virtual double limit() = 0;
  virtual std::size_t bytes_per_param() const = 0;
};

/// AdamW with fp32 master and moments over the caller's tensors. clip_grad 0 also turns off the
/// overflow skip where the precision allows it (no loss scale): nothing is then needed before the update.
template <class Precision, class Scaler>
struct adam_peer final : peer {
  using P = typename Precision::param_type;
  using G = typename Precision::grad_type;
  mpopt::optimizer<Precision, Scaler, mpopt::replicated, mpopt::adam> opt;
  std::vector<std::span<P>> params;
  std::vector<std::span<G>> grads;
  std::vector<bench::segment<Precision>> segs;
  std::vector<bench::chunk> chunks;

  static mpopt::optimizer_options settings(double clip) {
    mpopt::optimizer_options o;
    o.clip_grad = clip;
    o.skip_nonfinite = clip > 0 || !std::is_same_v<Scaler, mpopt::no_scaling>;
    return o;
  }
  static typename Scaler::options scaler_settings() {
    typename Scaler::options s{};
    if constexpr (std::is_same_v<Scaler, mpopt::static_scale>) s.scale = 1.0;
    return s;
  }

  adam_peer(std::size_t tensors, const std::size_t* sizes, void* const* p, void* const* g, const mpopt::adam::options& ro,
            double clip)
      : opt(settings(clip), scaler_settings()) {
    auto& group = opt.add_group(ro);
    for (std::size_t t = 0; t < tensors; ++t) {
      params.emplace_back(static_cast<P*>(p[t]), sizes[t]);
      grads.emplace_back(static_cast<G*>(g[t]), sizes[t]);
      group.add(params.back(), grads.back(), std::string("t").append(std::to_string(t)));
    }
    opt.finalize();
    segs = bench::segments_of<Precision>(opt, params, grads);
    chunks = bench::make_chunks(segs);
  }
  void step() override {
    const auto st = opt.step();
    if (!st.applied) mpopt::detail::fail("step not applied: ", st.reason());
  }
  double limit() override { return bench::minimal_traffic<Precision, mpopt::adam>(segs, chunks); }
  std::size_t bytes_per_param() const override { return bench::minimal_bytes_per_param<Precision, mpopt::adam>(); }
};

template <class F>
auto guarded(F&& f, decltype(f()) on_error) noexcept {
  try {
    return f();
  } catch (const std::exception& e) {
    last_error = e.what();
  }
  return on_error;
}

}  // namespace

extern "C" {

struct mpopt_peer {
  std::unique_ptr<peer> impl;
};

mpopt_peer* mpopt_peer_create(const char* precision, std::size_t tensors, const std::size_t* sizes,
                              void* const* params, void* const* grads, double lr, double beta1, double beta2,
                              double eps, double weight_decay, double clip_grad) {
  return guarded(
      [&]() -> mpopt_peer* {
        mpopt::adam::options ro;
        ro.lr = lr, ro.beta1 = beta1, ro.beta2 = beta2, ro.eps = eps, ro.weight_decay = weight_decay;
        auto out = std::make_unique<mpopt_peer>();
        const std::string p = precision ? precision : "";
        if (p == "fp32") out->impl = std::make_unique<adam_peer<mpopt::fp32, mpopt::no_scaling>>(tensors, sizes, params, grads, ro, clip_grad);
        else if (p == "bf16") out->impl = std::make_unique<adam_peer<mpopt::bf16, mpopt::no_scaling>>(tensors, sizes, params, grads, ro, clip_grad);
        else if (p == "fp16") out->impl = std::make_unique<adam_peer<mpopt::fp16, mpopt::static_scale>>(tensors, sizes, params, grads, ro, clip_grad);
        else mpopt::detail::fail("precision '", p, "' is none of fp32, fp16, bf16");
        return out.release();
      },
      nullptr);
}

int mpopt_peer_step(mpopt_peer* h) {
  return guarded([&] { return h->impl->step(), 0; }, 1);
}

double mpopt_peer_limit(mpopt_peer* h) {
  return guarded([&] { return h->impl->limit(); }, -1.0);
}

std::size_t mpopt_peer_bytes_per_param(mpopt_peer* h) { return h->impl->bytes_per_param(); }

const char* mpopt_peer_error() { return last_error.c_str(); }

void mpopt_peer_destroy(mpopt_peer* h) { delete h; }

}  // extern "C"
