// A character-level GPT-2 (decoder-only transformer) on the CPU: forward, exact backward, GPT-2
// initialization. Plain loops in the manner of llm.c's train_gpt2.c, parallelized with OpenMP pragmas
// when compiled with -fopenmp (without it, the same code runs on one thread).
//
// Conventions match PyTorch, so that a torch copy of the model gives the same numbers: Linear
// weights are [out, in], LayerNorm uses eps 1e-5 and the biased variance, GELU is the tanh
// approximation, the output projection is tied to the token embedding (wte).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

// Pragmas only under -fopenmp, so that -Wall -Werror builds without it do not warn about them.
#if defined(_OPENMP)
#define GPT_PARALLEL_FOR _Pragma("omp parallel for")
#define GPT_PARALLEL_FOR_COLLAPSE2 _Pragma("omp parallel for collapse(2)")
#define GPT_PARALLEL_FOR_COLLAPSE3 _Pragma("omp parallel for collapse(3)")
#define GPT_SIMD _Pragma("omp simd")
#define GPT_SIMD_SUM _Pragma("omp simd reduction(+ : sum)")  // over a variable named sum
#else
#define GPT_PARALLEL_FOR
#define GPT_PARALLEL_FOR_COLLAPSE2
#define GPT_PARALLEL_FOR_COLLAPSE3
#define GPT_SIMD
#define GPT_SIMD_SUM
#endif

namespace gpt {

struct shape {
  int vocab = 0;     // number of token ids
  int context = 64;  // maximum sequence length T (position embeddings)
  int layers = 4;
  int heads = 4;
  int width = 128;  // channels C; must be divisible by heads
};

struct tensor_info {
  std::string name;
  std::vector<std::size_t> shape;  // PyTorch convention: Linear weights are [out, in]
  std::size_t offset = 0, size = 0;  // into the flat parameter array
  bool decay = false;  // 2-D tensors (embeddings, linear weights); not biases or LayerNorm params
};

namespace detail {

// The twelve tensors of a block, in layout order.
enum block_slot : std::size_t {
  ln1_weight, ln1_bias, qkv_weight, qkv_bias, attn_proj_weight, attn_proj_bias,
  ln2_weight, ln2_bias, fc_weight, fc_bias, mlp_proj_weight, mlp_proj_bias, slots_per_block
};

inline constexpr std::size_t embedding_tensors = 2;  // wte, wpe come before the blocks

inline std::size_t block_tensor(std::size_t layer, block_slot slot) {
  return embedding_tensors + layer * slots_per_block + slot;
}

inline std::size_t to_size(int n) { return static_cast<std::size_t>(n); }

}  // namespace detail

inline std::vector<tensor_info> layout(const shape& s) {
  if (s.vocab < 1 || s.context < 1 || s.layers < 1 || s.heads < 1 || s.width < 1)
    throw std::invalid_argument("gpt::layout: every size must be at least 1");
  if (s.width % s.heads != 0)
    throw std::invalid_argument("gpt::layout: width must be divisible by heads");
  const std::size_t V = detail::to_size(s.vocab), T = detail::to_size(s.context);
  const std::size_t C = detail::to_size(s.width);

  std::vector<tensor_info> tensors;
  std::size_t offset = 0;
  auto add = [&](std::string name, std::vector<std::size_t> dims) {
    std::size_t size = 1;
    for (std::size_t d : dims) size *= d;
    const bool decay = dims.size() == 2;
    tensors.push_back({std::move(name), std::move(dims), offset, size, decay});
    offset += size;
  };
  add("wte", {V, C});
  add("wpe", {T, C});
  for (int l = 0; l < s.layers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    add(h + "ln1.weight", {C});
    add(h + "ln1.bias", {C});
    add(h + "attn.qkv.weight", {3 * C, C});
    add(h + "attn.qkv.bias", {3 * C});
    add(h + "attn.proj.weight", {C, C});
    add(h + "attn.proj.bias", {C});
    add(h + "ln2.weight", {C});
    add(h + "ln2.bias", {C});
    add(h + "mlp.fc.weight", {4 * C, C});
    add(h + "mlp.fc.bias", {4 * C});
    add(h + "mlp.proj.weight", {C, 4 * C});
    add(h + "mlp.proj.bias", {C});
  }
  add("lnf.weight", {C});
  add("lnf.bias", {C});
  return tensors;
}

namespace detail {

// splitmix64 and Box-Muller: the same weights for a seed with every standard library (unlike
// std::normal_distribution), up to the last bit of the platform's log and cos.
class normal_rng {
 public:
  explicit normal_rng(std::uint64_t seed) : state_(seed) {}

  double operator()() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = uniform_open(), u2 = uniform_open();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 6.283185307179586 * u2;
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // In (0, 1): log(u1) must stay finite.
  double uniform_open() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }

  std::uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0;
};

// ---- Matrix multiplication --------------------------------------------------------------------
// out[M x N] += A[M x K] * B[K x N], with B and out row-major (row strides N) and A read through
// strides, A(r, k) = a[r * a_row + k * a_col], so that the same kernel also multiplies by a
// transposed A (weight gradients) without copying it. The inner loop runs along contiguous rows of
// B and out, which vectorizes without reassociating sums; each thread owns whole tiles of out, so
// there are no races and every element is summed in the same order on any number of threads.

struct strided {
  std::size_t row, col;
};

// One register tile: Rows x Cols accumulators stay in registers while k runs.
template <std::size_t Rows, std::size_t Cols, class T>
void matmul_tile(const T* a, strided as, const T* b, T* out, std::size_t K, std::size_t N) {
  T acc[Rows][Cols] = {};
  for (std::size_t k = 0; k < K; ++k) {
    const T* b_row = b + k * N;
    for (std::size_t r = 0; r < Rows; ++r) {
      const T a_rk = a[r * as.row + k * as.col];
      GPT_SIMD
      for (std::size_t j = 0; j < Cols; ++j) acc[r][j] += a_rk * b_row[j];
    }
  }
  for (std::size_t r = 0; r < Rows; ++r)
    for (std::size_t j = 0; j < Cols; ++j) out[r * N + j] += acc[r][j];
}

// The ragged tiles at the bottom and right edges.
template <class T>
void matmul_edge(const T* a, strided as, const T* b, T* out, std::size_t rows, std::size_t cols,
                 std::size_t K, std::size_t N) {
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t k = 0; k < K; ++k) {
      const T a_rk = a[r * as.row + k * as.col];
      for (std::size_t j = 0; j < cols; ++j) out[r * N + j] += a_rk * b[k * N + j];
    }
}

template <class T>
void matmul_accumulate(const T* a, strided as, const T* b, T* out, std::size_t M, std::size_t K,
                       std::size_t N) {
  // 6 x 2 AVX2 registers of sums: 12 of the 16, the rest hold the loaded row of B.
  constexpr std::size_t tile_rows = 6, tile_cols = 64 / sizeof(T);
  // K in chunks so that a chunk of a column strip of B stays in L1 while the row tiles pass over it.
  constexpr std::size_t k_chunk = 128;
  const std::size_t row_tiles = (M + tile_rows - 1) / tile_rows;
  const std::size_t col_tiles = (N + tile_cols - 1) / tile_cols;
  for (std::size_t k0 = 0; k0 < K; k0 += k_chunk) {
    const std::size_t depth = std::min(k_chunk, K - k0);
    const T* a_chunk = a + k0 * as.col;
    const T* b_chunk = b + k0 * N;
    GPT_PARALLEL_FOR_COLLAPSE2
    for (std::size_t ct = 0; ct < col_tiles; ++ct)
      for (std::size_t rt = 0; rt < row_tiles; ++rt) {
        const std::size_t r0 = rt * tile_rows, c0 = ct * tile_cols;
        const std::size_t rows = std::min(tile_rows, M - r0), cols = std::min(tile_cols, N - c0);
        const T* a_tile = a_chunk + r0 * as.row;
        if (rows == tile_rows && cols == tile_cols)
          matmul_tile<tile_rows, tile_cols>(a_tile, as, b_chunk + c0, out + r0 * N + c0, depth, N);
        else
          matmul_edge(a_tile, as, b_chunk + c0, out + r0 * N + c0, rows, cols, depth, N);
      }
  }
}

template <class T>
void transpose(const T* in, T* out, std::size_t rows, std::size_t cols) {
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

template <class T>
void broadcast_rows(T* out, const T* row, std::size_t rows, std::size_t cols) {
  for (std::size_t r = 0; r < rows; ++r) std::copy(row, row + cols, out + r * cols);
}

// Bias gradient: column sums of dout. Serial over rows so the summation order is fixed.
template <class T>
void add_column_sums(T* dbias, const T* dout, std::size_t rows, std::size_t cols) {
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) dbias[c] += dout[r * cols + c];
}

// ---- LayerNorm ---------------------------------------------------------------------------------

inline constexpr double layer_norm_eps = 1e-5;

template <class T>
void layer_norm_forward(T* out, T* mean, T* rstd, const T* in, const T* weight, const T* bias,
                        std::size_t rows, std::size_t C) {
  GPT_PARALLEL_FOR
  for (std::size_t r = 0; r < rows; ++r) {
    const T* x = in + r * C;
    T sum = 0;
    for (std::size_t c = 0; c < C; ++c) sum += x[c];
    const T m = sum / static_cast<T>(C);
    T squares = 0;
    for (std::size_t c = 0; c < C; ++c) squares += (x[c] - m) * (x[c] - m);
    const T s = T(1) / std::sqrt(squares / static_cast<T>(C) + static_cast<T>(layer_norm_eps));
    T* y = out + r * C;
    for (std::size_t c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

// Adds the input gradient to din; accumulates the weight and bias gradients.
template <class T>
void layer_norm_backward(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* mean,
                         const T* rstd, const T* weight, std::size_t rows, std::size_t C) {
  GPT_PARALLEL_FOR
  for (std::size_t r = 0; r < rows; ++r) {
    const T* x = in + r * C;
    const T* dy = dout + r * C;
    // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * weight
    T sum_dxhat = 0, sum_dxhat_xhat = 0;
    for (std::size_t c = 0; c < C; ++c) {
      const T dxhat = dy[c] * weight[c];
      sum_dxhat += dxhat;
      sum_dxhat_xhat += dxhat * (x[c] - mean[r]) * rstd[r];
    }
    const T mean_dxhat = sum_dxhat / static_cast<T>(C);
    const T mean_dxhat_xhat = sum_dxhat_xhat / static_cast<T>(C);
    T* dx = din + r * C;
    for (std::size_t c = 0; c < C; ++c) {
      const T xhat = (x[c] - mean[r]) * rstd[r];
      dx[c] += rstd[r] * (dy[c] * weight[c] - mean_dxhat - xhat * mean_dxhat_xhat);
    }
  }
  // Parameter gradients sum over rows: serial, for a fixed order without races.
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < C; ++c) {
      const T xhat = (in[r * C + c] - mean[r]) * rstd[r];
      dweight[c] += dout[r * C + c] * xhat;
      dbias[c] += dout[r * C + c];
    }
}

// ---- GELU (tanh approximation) -----------------------------------------------------------------

inline constexpr double gelu_scale = 0.7978845608028654;  // sqrt(2 / pi)
inline constexpr double gelu_cubic = 0.044715;

// tanh through exp: several times faster than glibc's tanhf, and exact to a few ulp of 1 (GELU
// needs 1 + tanh, so absolute accuracy is what counts). Saturates correctly when exp overflows.
template <class T>
T fast_tanh(T u) {
  return T(1) - T(2) / (std::exp(T(2) * u) + T(1));
}

template <class T>
void gelu_forward(T* out, const T* in, std::size_t n) {
  const T s = static_cast<T>(gelu_scale), a = static_cast<T>(gelu_cubic);
  GPT_PARALLEL_FOR
  for (std::size_t i = 0; i < n; ++i) {
    const T x = in[i];
    out[i] = T(0.5) * x * (T(1) + fast_tanh(s * (x + a * x * x * x)));
  }
}

// In place: d holds dout on entry and din on return.
template <class T>
void gelu_backward(T* d, const T* in, std::size_t n) {
  const T s = static_cast<T>(gelu_scale), a = static_cast<T>(gelu_cubic);
  GPT_PARALLEL_FOR
  for (std::size_t i = 0; i < n; ++i) {
    const T x = in[i];
    const T th = fast_tanh(s * (x + a * x * x * x));
    const T du_dx = s * (T(1) + T(3) * a * x * x);
    d[i] *= T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * du_dx;
  }
}

// ---- Causal self-attention ---------------------------------------------------------------------
// qkv rows hold [q | k | v], C channels each; head h uses channels h*hs .. h*hs+hs-1 of each.
// att holds the softmax probabilities of row i of head h of sequence b at ((b*H + h)*t + i)*t.

struct attention_sizes {
  std::size_t B, t, C, H;
  std::size_t head() const { return C / H; }
  std::size_t row(std::size_t b, std::size_t i) const { return b * t + i; }
  std::size_t probs(std::size_t b, std::size_t h, std::size_t i) const { return ((b * H + h) * t + i) * t; }
};

template <class T>
T dot(const T* x, const T* y, std::size_t n) {
  T sum = 0;
  GPT_SIMD_SUM
  for (std::size_t d = 0; d < n; ++d) sum += x[d] * y[d];
  return sum;
}

template <class T>
void attention_forward(T* out, T* att, const T* qkv, attention_sizes z) {
  const std::size_t C = z.C, hs = z.head();
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  GPT_PARALLEL_FOR_COLLAPSE3
  for (std::size_t b = 0; b < z.B; ++b)
    for (std::size_t h = 0; h < z.H; ++h)
      for (std::size_t i = 0; i < z.t; ++i) {
        const T* q = qkv + z.row(b, i) * 3 * C + h * hs;
        T* p = att + z.probs(b, h, i);
        T max_score = -std::numeric_limits<T>::infinity();
        for (std::size_t j = 0; j <= i; ++j) {
          p[j] = dot(q, qkv + z.row(b, j) * 3 * C + C + h * hs, hs) * scale;
          max_score = std::max(max_score, p[j]);
        }
        T sum = 0;
        for (std::size_t j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - max_score);
          sum += p[j];
        }
        for (std::size_t j = 0; j <= i; ++j) p[j] /= sum;
        T* y = out + z.row(b, i) * C + h * hs;
        std::fill(y, y + hs, T(0));
        for (std::size_t j = 0; j <= i; ++j) {
          const T* v = qkv + z.row(b, j) * 3 * C + 2 * C + h * hs;
          for (std::size_t d = 0; d < hs; ++d) y[d] += p[j] * v[d];
        }
      }
}

// Accumulates into dqkv. One thread per (sequence, head): those own disjoint channels of dqkv.
// dprobs is scratch shaped like att.
template <class T>
void attention_backward(T* dqkv, T* dprobs, const T* dout, const T* att, const T* qkv,
                        attention_sizes z) {
  const std::size_t C = z.C, hs = z.head();
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  GPT_PARALLEL_FOR_COLLAPSE2
  for (std::size_t b = 0; b < z.B; ++b)
    for (std::size_t h = 0; h < z.H; ++h)
      for (std::size_t i = 0; i < z.t; ++i) {
        const std::size_t q_at = z.row(b, i) * 3 * C + h * hs;
        const T* dy = dout + z.row(b, i) * C + h * hs;
        const T* p = att + z.probs(b, h, i);
        T* dp = dprobs + z.probs(b, h, i);
        // Through y = sum_j p_j v_j.
        T sum_p_dp = 0;
        for (std::size_t j = 0; j <= i; ++j) {
          const std::size_t v_at = z.row(b, j) * 3 * C + 2 * C + h * hs;
          dp[j] = dot(dy, qkv + v_at, hs);
          sum_p_dp += p[j] * dp[j];
          for (std::size_t d = 0; d < hs; ++d) dqkv[v_at + d] += p[j] * dy[d];
        }
        // Through the softmax, then the scaled scores q . k_j.
        for (std::size_t j = 0; j <= i; ++j) {
          const std::size_t k_at = z.row(b, j) * 3 * C + C + h * hs;
          const T dscore = p[j] * (dp[j] - sum_p_dp) * scale;
          for (std::size_t d = 0; d < hs; ++d) {
            dqkv[q_at + d] += dscore * qkv[k_at + d];
            dqkv[k_at + d] += dscore * qkv[q_at + d];
          }
        }
      }
}

// ---- Cross-entropy -----------------------------------------------------------------------------

// Writes the softmax of row into probs (may alias row); returns log(sum(exp(row))).
template <class T>
T softmax(T* probs, const T* row, std::size_t n) {
  const T max_logit = *std::max_element(row, row + n);
  T sum = 0;
  for (std::size_t v = 0; v < n; ++v) {
    probs[v] = std::exp(row[v] - max_logit);
    sum += probs[v];
  }
  for (std::size_t v = 0; v < n; ++v) probs[v] /= sum;
  return max_logit + std::log(sum);
}

// Carves named slices out of one buffer: a first pass without a buffer counts the elements.
template <class T>
struct slicer {
  T* base = nullptr;
  std::size_t used = 0;
  T* take(std::size_t n) {
    T* slice = base ? base + used : nullptr;
    used += n;
    return slice;
  }
};

}  // namespace detail

template <class T>
class net {
 public:
  explicit net(const shape& s)
      : shape_(s),
        tensors_(layout(s)),
        V_(detail::to_size(s.vocab)),
        context_(detail::to_size(s.context)),
        L_(detail::to_size(s.layers)),
        H_(detail::to_size(s.heads)),
        C_(detail::to_size(s.width)),
        params_(tensors_.back().offset + tensors_.back().size),
        grads_(params_.size()),
        transposed_(std::max(4 * C_ * C_, V_ * C_)) {}

  const gpt::shape& sizes() const { return shape_; }
  const std::vector<tensor_info>& tensors() const { return tensors_; }
  std::span<T> params() { return params_; }
  std::span<const T> params() const { return params_; }
  std::span<T> grads() { return grads_; }

  // GPT-2: 2-D weights ~ N(0, 0.02), the projections into the residual stream scaled by
  // 1/sqrt(2 * layers) (each block adds two of them); LayerNorm weights 1; biases 0.
  void initialize(std::uint64_t seed) {
    detail::normal_rng normal(seed);
    const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(L_));
    for (const tensor_info& info : tensors_) {
      T* p = params_.data() + info.offset;
      const bool is_layer_norm_weight = info.name.ends_with("ln1.weight") ||
                                        info.name.ends_with("ln2.weight") || info.name == "lnf.weight";
      if (info.decay) {
        const double std_dev = info.name.ends_with("proj.weight") ? residual_std : 0.02;
        for (std::size_t i = 0; i < info.size; ++i) p[i] = static_cast<T>(std_dev * normal());
      } else {
        std::fill(p, p + info.size, is_layer_norm_weight ? T(1) : T(0));
      }
    }
  }

  double forward(std::span<const int> tokens, std::span<const int> targets, int B, int t) {
    validate(tokens, targets, B, t);
    B_ = detail::to_size(B);
    t_ = detail::to_size(t);
    const std::size_t N = B_ * t_, C = C_;
    tokens_.assign(tokens.begin(), tokens.end());
    targets_.assign(targets.begin(), targets.end());
    carve_activations(N);

    embed(N);
    const T* x = acts_.encoded;
    for (std::size_t l = 0; l < L_; ++l) {
      block_forward(l, x, N);
      x = acts_.layers[l].residual3;
    }
    detail::layer_norm_forward(acts_.lnf, acts_.lnf_mean, acts_.lnf_rstd, x, param(lnf_weight()),
                               param(lnf_bias()), N, C);
    // logits = lnf(x) @ wte^T
    detail::transpose(params_.data(), transposed_.data(), V_, C);
    std::fill(acts_.logits, acts_.logits + N * V_, T(0));
    detail::matmul_accumulate(acts_.lnf, {C, 1}, transposed_.data(), acts_.logits, N, C, V_);

    if (targets.empty()) return 0;
    T* row_loss = acts_.row_loss;
    T* probs = acts_.probs;
    const std::size_t V = V_;
    const int* target = targets_.data();
    GPT_PARALLEL_FOR
    for (std::size_t r = 0; r < N; ++r) {
      const T log_sum_exp = detail::softmax(probs + r * V, acts_.logits + r * V, V);
      row_loss[r] = log_sum_exp - acts_.logits[r * V + detail::to_size(target[r])];
    }
    double total = 0;
    for (std::size_t r = 0; r < N; ++r) total += static_cast<double>(row_loss[r]);
    return total / static_cast<double>(N);
  }

  std::span<const T> logits(int b, int i) const {
    if (b < 0 || i < 0 || detail::to_size(b) >= B_ || detail::to_size(i) >= t_)
      throw std::invalid_argument("gpt::net::logits: position outside the last forward");
    return {acts_.logits + (detail::to_size(b) * t_ + detail::to_size(i)) * V_, V_};
  }

  template <class Ready>
  void backward(T scale, Ready&& ready) {
    if (B_ == 0 || targets_.empty())
      throw std::logic_error("gpt::net::backward: the last forward had no targets");
    const std::size_t N = B_ * t_, C = C_, V = V_;
    carve_backward_scratch(N);
    std::fill(grads_.begin(), grads_.end(), T(0));

    // Mean cross-entropy: dlogits = (softmax - onehot(target)) / N, times scale.
    const T row_weight = scale / static_cast<T>(N);
    T* dlogits = scratch_.dlogits;
    GPT_PARALLEL_FOR
    for (std::size_t r = 0; r < N; ++r) {
      for (std::size_t v = 0; v < V; ++v) dlogits[r * V + v] = acts_.probs[r * V + v] * row_weight;
      dlogits[r * V + detail::to_size(targets_[r])] -= row_weight;
    }
    // Through logits = lnf @ wte^T: wte's share here, its embedding share at the very end.
    T* dwte = grads_.data();
    detail::matmul_accumulate(dlogits, {1, V}, acts_.lnf, dwte, V, N, C);
    std::fill(scratch_.dnormed, scratch_.dnormed + N * C, T(0));
    detail::matmul_accumulate(dlogits, {V, 1}, params_.data(), scratch_.dnormed, N, V, C);

    const T* last = acts_.layers[L_ - 1].residual3;
    std::fill(scratch_.dresidual, scratch_.dresidual + N * C, T(0));
    detail::layer_norm_backward(scratch_.dresidual, grad(lnf_weight()), grad(lnf_bias()),
                                scratch_.dnormed, last, acts_.lnf_mean, acts_.lnf_rstd,
                                param(lnf_weight()), N, C);
    ready(lnf_weight());
    ready(lnf_bias());

    for (std::size_t l = L_; l-- > 0;) block_backward(l, N, ready);

    embed_backward(N);
    ready(std::size_t{1});  // wpe
    ready(std::size_t{0});  // wte, final only now
  }

 private:
  struct layer_acts {
    T *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *attn_out, *residual2;
    T *ln2, *ln2_mean, *ln2_rstd, *fc, *fc_gelu, *residual3;
  };
  struct activations {
    T* encoded = nullptr;
    std::vector<layer_acts> layers;
    T *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr, *logits = nullptr;
    T *probs = nullptr, *row_loss = nullptr;
  };
  struct backward_scratch {
    T *dresidual = nullptr, *dnormed = nullptr, *dqkv = nullptr, *dattn_out = nullptr;
    T *dfc = nullptr, *dprobs = nullptr, *dlogits = nullptr;
  };

  static void validate_ids(std::span<const int> ids, std::size_t vocab, const char* what) {
    for (int id : ids)
      if (id < 0 || detail::to_size(id) >= vocab)
        throw std::invalid_argument(std::string("gpt::net::forward: ") + what + " id out of range");
  }

  void validate(std::span<const int> tokens, std::span<const int> targets, int B, int t) const {
    if (B < 1 || t < 1 || detail::to_size(t) > context_)
      throw std::invalid_argument("gpt::net::forward: need B >= 1 and 1 <= t <= context");
    const std::size_t N = detail::to_size(B) * detail::to_size(t);
    if (tokens.size() != N || (!targets.empty() && targets.size() != N))
      throw std::invalid_argument("gpt::net::forward: tokens and targets need B*t ids");
    validate_ids(tokens, V_, "token");
    validate_ids(targets, V_, "target");
  }

  // Attention probabilities take N*H*context (not N*H*t) so that the size depends on N alone: once
  // the largest N has been seen, no later forward allocates.
  std::size_t carve_activations(T* base, std::size_t N) {
    detail::slicer<T> s{base};
    const std::size_t C = C_;
    acts_.encoded = s.take(N * C);
    acts_.layers.resize(L_);
    for (layer_acts& a : acts_.layers) {
      a.ln1 = s.take(N * C);
      a.ln1_mean = s.take(N);
      a.ln1_rstd = s.take(N);
      a.qkv = s.take(N * 3 * C);
      a.att = s.take(N * H_ * context_);
      a.attn_out = s.take(N * C);
      a.residual2 = s.take(N * C);
      a.ln2 = s.take(N * C);
      a.ln2_mean = s.take(N);
      a.ln2_rstd = s.take(N);
      a.fc = s.take(N * 4 * C);
      a.fc_gelu = s.take(N * 4 * C);
      a.residual3 = s.take(N * C);
    }
    acts_.lnf = s.take(N * C);
    acts_.lnf_mean = s.take(N);
    acts_.lnf_rstd = s.take(N);
    acts_.logits = s.take(N * V_);
    acts_.probs = s.take(N * V_);
    acts_.row_loss = s.take(N);
    return s.used;
  }

  void carve_activations(std::size_t N) {
    const std::size_t needed = carve_activations(nullptr, N);
    if (activation_buffer_.size() < needed) activation_buffer_.resize(needed);
    carve_activations(activation_buffer_.data(), N);
  }

  std::size_t carve_backward_scratch(T* base, std::size_t N) {
    detail::slicer<T> s{base};
    const std::size_t C = C_;
    scratch_.dresidual = s.take(N * C);
    scratch_.dnormed = s.take(N * C);
    scratch_.dqkv = s.take(N * 3 * C);
    scratch_.dattn_out = s.take(N * C);
    scratch_.dfc = s.take(N * 4 * C);
    scratch_.dprobs = s.take(N * H_ * context_);
    scratch_.dlogits = s.take(N * V_);
    return s.used;
  }

  void carve_backward_scratch(std::size_t N) {
    const std::size_t needed = carve_backward_scratch(nullptr, N);
    if (scratch_buffer_.size() < needed) scratch_buffer_.resize(needed);
    carve_backward_scratch(scratch_buffer_.data(), N);
  }

  std::size_t lnf_weight() const { return tensors_.size() - 2; }
  std::size_t lnf_bias() const { return tensors_.size() - 1; }
  const T* param(std::size_t tensor) const { return params_.data() + tensors_[tensor].offset; }
  const T* param(std::size_t layer, detail::block_slot slot) const {
    return param(detail::block_tensor(layer, slot));
  }
  T* grad(std::size_t tensor) { return grads_.data() + tensors_[tensor].offset; }
  T* grad(std::size_t layer, detail::block_slot slot) { return grad(detail::block_tensor(layer, slot)); }

  // out[N x out_ch] = in[N x in_ch] @ weight^T + bias, weight [out_ch, in_ch] as in torch.
  void linear_forward(T* out, const T* in, std::size_t layer, detail::block_slot weight_slot,
                      std::size_t N, std::size_t in_ch, std::size_t out_ch) {
    const T* weight = param(layer, weight_slot);
    const T* bias = param(layer, static_cast<detail::block_slot>(weight_slot + 1));
    detail::broadcast_rows(out, bias, N, out_ch);
    // Transposed so that the kernel's inner loop runs along output channels.
    detail::transpose(weight, transposed_.data(), out_ch, in_ch);
    detail::matmul_accumulate(in, {in_ch, 1}, transposed_.data(), out, N, in_ch, out_ch);
  }

  // Accumulates the weight and bias gradients and writes din; then the pair is final.
  template <class Ready>
  void linear_backward(T* din, const T* dout, const T* in, std::size_t layer,
                       detail::block_slot weight_slot, std::size_t N, std::size_t in_ch,
                       std::size_t out_ch, Ready& ready) {
    const auto bias_slot = static_cast<detail::block_slot>(weight_slot + 1);
    // dweight[o][i] = sum_r dout[r][o] * in[r][i]: dout read transposed through its strides.
    detail::matmul_accumulate(dout, {1, out_ch}, in, grad(layer, weight_slot), out_ch, N, in_ch);
    detail::add_column_sums(grad(layer, bias_slot), dout, N, out_ch);
    std::fill(din, din + N * in_ch, T(0));
    detail::matmul_accumulate(dout, {out_ch, 1}, param(layer, weight_slot), din, N, out_ch, in_ch);
    ready(detail::block_tensor(layer, weight_slot));
    ready(detail::block_tensor(layer, bias_slot));
  }

  void embed(std::size_t N) {
    const std::size_t C = C_;
    const T* wte = params_.data();
    const T* wpe = param(std::size_t{1});
    GPT_PARALLEL_FOR
    for (std::size_t r = 0; r < N; ++r) {
      const T* token_row = wte + detail::to_size(tokens_[r]) * C;
      const T* position_row = wpe + (r % t_) * C;
      for (std::size_t c = 0; c < C; ++c) acts_.encoded[r * C + c] = token_row[c] + position_row[c];
    }
  }

  // Serial: rows of the same token add into the same wte row.
  void embed_backward(std::size_t N) {
    const std::size_t C = C_;
    T* dwte = grad(std::size_t{0});
    T* dwpe = grad(std::size_t{1});
    for (std::size_t r = 0; r < N; ++r) {
      const T* d = scratch_.dresidual + r * C;
      T* token_row = dwte + detail::to_size(tokens_[r]) * C;
      T* position_row = dwpe + (r % t_) * C;
      for (std::size_t c = 0; c < C; ++c) {
        token_row[c] += d[c];
        position_row[c] += d[c];
      }
    }
  }

  static void add_into(T* out, const T* residual, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) out[i] += residual[i];
  }

  void block_forward(std::size_t l, const T* x, std::size_t N) {
    using namespace detail;
    layer_acts& a = acts_.layers[l];
    const std::size_t C = C_;
    layer_norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, param(l, ln1_weight), param(l, ln1_bias), N, C);
    linear_forward(a.qkv, a.ln1, l, qkv_weight, N, C, 3 * C);
    attention_forward(a.attn_out, a.att, a.qkv, attention_sizes{B_, t_, C, H_});
    linear_forward(a.residual2, a.attn_out, l, attn_proj_weight, N, C, C);
    add_into(a.residual2, x, N * C);
    layer_norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, param(l, ln2_weight),
                       param(l, ln2_bias), N, C);
    linear_forward(a.fc, a.ln2, l, fc_weight, N, C, 4 * C);
    gelu_forward(a.fc_gelu, a.fc, N * 4 * C);
    linear_forward(a.residual3, a.fc_gelu, l, mlp_proj_weight, N, 4 * C, C);
    add_into(a.residual3, a.residual2, N * C);
  }

  // On entry scratch_.dresidual holds d(loss)/d(block output); on return d(loss)/d(block input).
  template <class Ready>
  void block_backward(std::size_t l, std::size_t N, Ready& ready) {
    using namespace detail;
    const layer_acts& a = acts_.layers[l];
    const T* x = l == 0 ? acts_.encoded : acts_.layers[l - 1].residual3;
    const std::size_t C = C_;
    backward_scratch& s = scratch_;

    // MLP; the residual passes dresidual through unchanged.
    linear_backward(s.dfc, s.dresidual, a.fc_gelu, l, mlp_proj_weight, N, 4 * C, C, ready);
    gelu_backward(s.dfc, a.fc, N * 4 * C);
    linear_backward(s.dnormed, s.dfc, a.ln2, l, fc_weight, N, C, 4 * C, ready);
    layer_norm_backward(s.dresidual, grad(l, ln2_weight), grad(l, ln2_bias), s.dnormed, a.residual2,
                        a.ln2_mean, a.ln2_rstd, param(l, ln2_weight), N, C);
    ready(block_tensor(l, ln2_weight));
    ready(block_tensor(l, ln2_bias));

    // Attention.
    linear_backward(s.dattn_out, s.dresidual, a.attn_out, l, attn_proj_weight, N, C, C, ready);
    std::fill(s.dqkv, s.dqkv + N * 3 * C, T(0));
    attention_backward(s.dqkv, s.dprobs, s.dattn_out, a.att, a.qkv, attention_sizes{B_, t_, C, H_});
    linear_backward(s.dnormed, s.dqkv, a.ln1, l, qkv_weight, N, C, 3 * C, ready);
    layer_norm_backward(s.dresidual, grad(l, ln1_weight), grad(l, ln1_bias), s.dnormed, x, a.ln1_mean,
                        a.ln1_rstd, param(l, ln1_weight), N, C);
    ready(block_tensor(l, ln1_weight));
    ready(block_tensor(l, ln1_bias));
  }

  gpt::shape shape_;
  std::vector<tensor_info> tensors_;
  std::size_t V_, context_, L_, H_, C_;
  std::vector<T> params_, grads_;
  std::vector<T> transposed_;  // a weight matrix, transposed for the forward matmul
  std::vector<T> activation_buffer_, scratch_buffer_;
  activations acts_;
  backward_scratch scratch_;
  std::vector<int> tokens_, targets_;  // of the last forward, for backward
  std::size_t B_ = 0, t_ = 0;
};

}  // namespace gpt
