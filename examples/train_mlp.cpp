// train_mlp: mixed-precision training of a small MLP with mpopt, done the way a real engine does it.
//
//   build/examples/train_mlp                                   # fp16 + dynamic loss scaling, Adam, fused layout
//   build/examples/train_mlp --precision bf16 --rule lamb --layout unfused
//   build/examples/train_mlp --precision bf16 --rounding stochastic   # stochastic rounding of the master
//   build/examples/train_mlp --steps 12 --print-every 1              # watch the loss scale come down
//   build/examples/train_mlp --steps 200 --save mlp.safetensors        # a checkpoint (with [out, in] shapes)
//   build/examples/train_mlp --load mlp.safetensors --steps 100       # resume it
//   mpirun -np 4 build/examples/train_mlp --rule onebit_lamb --csv loss.csv  # compressed momentum
//   mpirun -np 2 build/examples/train_mlp --rule onebit_adam                 # the same over Adam
//   mpirun -np 2 build/examples/train_mlp --rule zero_one_adam               # and 0/1 Adam's local steps
//   build/examples/train_mlp --config examples/configs/fp16_adamw.json       # a DeepSpeed configuration
//   mpirun -np 2 build/examples/train_mlp --config examples/configs/fp16_zero2_adamw.json
//   build/examples/train_mlp --help
//
// The task: 32-d Gaussian points labelled by a random "teacher" network (the argmax of its 10
// outputs). The student is a 32-64-64-10 ReLU MLP trained with softmax cross-entropy.
//
// Who does what in one training step:
//   the model (this file)  keeps its weights in the precision's param_type (mpopt::half,
//                          mpopt::bfloat16 or float). Forward and backward compute in float, reading
//                          those weights. The backward multiplies the loss gradient by
//                          opt.loss_scale() and stores the weight gradients in grad_type.
//   opt.step() (mpopt)     unscales the gradients, skips the step and lowers the scale if any of them
//                          overflowed, clips to a global norm of 1, runs Adam or LAMB on the fp32
//                          master weights and rounds the result back into the model's weights.
//
// With fp16 the dynamic loss scale starts at 2^24, far too high on purpose: watch the first steps
// overflow and get skipped while the scale comes down (the "skipped" column). At the end the same
// run (same seed, data, initial weights and batches) is repeated in fp32 without loss scaling, and
// the two results are printed side by side (--compare-fp32 off skips it). The exit code is nonzero if
// the loss did not go down.
//
// The optimizer comes from a DeepSpeed configuration: the one --config FILE names, read by
// mpopt::deepspeed_config, or the one the flags stand for. mpopt::make_optimizer (in
// configured_optimizer.cpp, the one translation unit that instantiates the optimizers a
// configuration can name) builds an mpopt::any_optimizer of the policies it names, and the
// training loop runs it (the fp32 comparison too, from the same configuration with fp16/bf16
// switched off). What a configuration cannot say (stochastic rounding, fp16 without loss scaling,
// the device backend of train_mlp_device) builds a typed mpopt::optimizer here, with Adam or LAMB.

#include "configured_optimizer.hpp"  // mpopt::any_optimizer from a DeepSpeed configuration
#include "flags.hpp"
#include "world.hpp"
#include <mpopt/mpopt.hpp>
#if MPOPT_EXAMPLE_DEVICE
#include <mpopt/cuda.hpp>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <numbers>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

#if MPOPT_EXAMPLE_DEVICE
// train_mlp_device: --device cuda steps with the device backend. The model below computes on the
// host, so this build is Thrust's OpenMP system (whose device memory is host memory); on a GPU the
// model would run there too and hand the optimizer device tensors.
#if MPOPT_DEVICE_IS_GPU
#error "train_mlp's model computes on the host: build train_mlp_device with THRUST_DEVICE_SYSTEM_OMP"
#endif
constexpr bool with_device = true;
using device_backend = mpopt::cuda;
#else
constexpr bool with_device = false;
using device_backend = mpopt::host;  // never chosen: parse_args refuses --device cuda
#endif

// The MPI build (train_mlp wherever MPI is found): each rank trains on its own shard of the data;
// the optimizer's communicator sums the gradients over the ranks (replicated) or reduce-scatters
// them into shards (--zero 1|2).
using example::communicator, example::make_communicator, example::with_mpi, example::world_rank, example::world_size,
    example::gather_on_rank0, example::mean_over_ranks, example::sum_over_ranks;

constexpr int n_inputs = 32;
constexpr int n_hidden = 64;
constexpr int n_classes = 10;

// ---------------------------------------------------------------------------------------------
// Random numbers: splitmix64 and Box-Muller, so that every platform draws the same data and init.

class rng {
 public:
  explicit rng(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  std::size_t below(std::size_t n) { return std::size_t(uniform() * double(n)); }
  float normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]: log(u1) is finite
    const double u2 = uniform();
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
  }

 private:
  std::uint64_t state_;
};

// ---------------------------------------------------------------------------------------------
// The data: Gaussian inputs, labelled by argmax(V tanh(U x)) for a random teacher (U, V).
// Mildly nonlinear, and learnable by the student well beyond chance (10%) in a few hundred steps.

struct dataset {
  std::vector<float> x;  // size() rows of n_inputs
  std::vector<int> y;    // labels in [0, n_classes)
  std::size_t size() const { return y.size(); }
};

struct task {
  dataset train, test;
};

task make_task(std::uint64_t seed, std::size_t n_train, std::size_t n_test) {
  constexpr int teacher_hidden = 32;
  rng r(seed);
  std::vector<float> u(teacher_hidden * n_inputs), v(n_classes * teacher_hidden);
  for (float& w : u) w = 0.75f * r.normal() / std::sqrt(float(n_inputs));
  for (float& w : v) w = r.normal() / std::sqrt(float(teacher_hidden));

  auto draw = [&](std::size_t n) {
    dataset d;
    d.x.resize(n * n_inputs);
    d.y.resize(n);
    std::array<float, teacher_hidden> h;
    for (std::size_t s = 0; s < n; ++s) {
      float* x = &d.x[s * n_inputs];
      for (int i = 0; i < n_inputs; ++i) x[i] = r.normal();
      for (int j = 0; j < teacher_hidden; ++j) {
        float a = 0;
        for (int i = 0; i < n_inputs; ++i) a += u[j * n_inputs + i] * x[i];
        h[j] = std::tanh(a);
      }
      int best = 0;
      float best_score = 0;
      for (int c = 0; c < n_classes; ++c) {
        float score = 0;
        for (int j = 0; j < teacher_hidden; ++j) score += v[c * teacher_hidden + j] * h[j];
        if (c == 0 || score > best_score) best = c, best_score = score;
      }
      d.y[s] = best;
    }
    return d;
  };
  task t;
  t.train = draw(n_train);
  t.test = draw(n_test);
  return t;
}

// ---------------------------------------------------------------------------------------------
// Conversions between the model's storage types and float, in bulk (mpopt::convert uses F16C /
// AVX-512 where available and rounds to nearest even).

template <class T>
void widen(std::span<const T> in, std::span<float> out) {
  if constexpr (std::is_same_v<T, float>) std::ranges::copy(in, out.begin());
  else mpopt::convert(in, out);
}

template <class T>
void narrow(std::span<const float> in, std::span<T> out) {
  if constexpr (std::is_same_v<T, float>) std::ranges::copy(in, out.begin());
  else mpopt::convert(in, out);  // values beyond the format's range become inf: that is an overflow
}

// ---------------------------------------------------------------------------------------------
// The model. A layer is y = W x + b with W stored [out][in], as in PyTorch. Its parameters and
// gradients are views: into the optimizer's flat buffers (fused layout) or into vectors the
// training loop owns (unfused layout). P is the precision's param_type, G its grad_type.

template <class P, class G>
struct linear {
  std::string name;
  int in = 0, out = 0;
  std::span<P> weight, bias;
  std::span<G> weight_grad, bias_grad;
};

// Cross-entropy of one sample's logits z[0..n_classes) against its label. With dz, also writes
// the gradient d(loss)/dz = softmax(z) - onehot(label).
double cross_entropy(const float* z, int label, float* dz = nullptr) {
  const float zmax = *std::max_element(z, z + n_classes);  // for a stable softmax
  float sum = 0;
  for (int c = 0; c < n_classes; ++c) sum += std::exp(z[c] - zmax);
  if (dz)
    for (int c = 0; c < n_classes; ++c) dz[c] = std::exp(z[c] - zmax) / sum - (c == label ? 1.0f : 0.0f);
  return std::log(sum) - (z[label] - zmax);
}

struct evaluation {
  double loss = 0;      // mean cross-entropy
  double accuracy = 0;  // fraction of correct argmax predictions
};

template <class P, class G>
class mlp {
 public:
  using param_type = P;
  using grad_type = G;
  static constexpr int depth = 3;
  static constexpr std::array<int, depth + 1> widths = {n_inputs, n_hidden, n_hidden, n_classes};

  std::array<linear<P, G>, depth> layers;

  mlp() {
    for (int l = 0; l < depth; ++l) {
      layers[l].name = "fc" + std::to_string(l + 1);
      layers[l].in = widths[l];
      layers[l].out = widths[l + 1];
      w_[l].resize(std::size_t(widths[l]) * widths[l + 1]);
      wt_[l].resize(w_[l].size());
      dw_[l].resize(w_[l].size());
      b_[l].resize(widths[l + 1]);
      db_[l].resize(b_[l].size());
    }
  }

  /// He-normal weights and zero biases, drawn in float and rounded to P. Call once the layers'
  /// views are attached to their storage.
  void initialize(std::uint64_t seed) {
    rng r(seed);
    for (auto& layer : layers) {
      const float stddev = std::sqrt(2.0f / float(layer.in));
      for (P& w : layer.weight) w = P(stddev * r.normal());
      std::ranges::fill(layer.bias, P(0.0f));
    }
  }

  /// The largest magnitude of any weight or bias.
  double largest_parameter() const {
    double most = 0;
    for (const auto& layer : layers) {
      for (P w : layer.weight) most = std::max(most, std::fabs(double(float(w))));
      for (P b : layer.bias) most = std::max(most, std::fabs(double(float(b))));
    }
    return most;
  }

  /// Forward and backward on one batch. Returns the batch's mean cross-entropy and stores
  /// loss_scale * d(mean loss)/d(parameter) into the gradient tensors, in grad type G.
  /// `stored(l)` runs once layer l's gradients are in place, last layer first (as a backward pass
  /// finishes them): the place to tell a zero2 optimizer they are ready.
  template <class Stored>
  double train_batch(std::span<const float> x, std::span<const int> labels, float loss_scale, Stored&& stored) {
    const int batch = int(labels.size());
    load_parameters();
    forward(x, batch);

    // The loss is the batch mean, so d(loss)/d(logits) is each sample's gradient / batch.
    // Multiplying it by the loss scale here scales every gradient of the backward pass.
    double loss = 0;
    dact_[depth].resize(std::size_t(batch) * n_classes);
    for (int n = 0; n < batch; ++n) {
      float* dz = &dact_[depth][std::size_t(n) * n_classes];
      loss += cross_entropy(&act_[depth][std::size_t(n) * n_classes], labels[n], dz);
      for (int c = 0; c < n_classes; ++c) dz[c] *= loss_scale / float(batch);
    }

    backward(batch);
    for (int l = depth - 1; l >= 0; --l) {
      narrow<G>(dw_[l], layers[l].weight_grad);
      narrow<G>(db_[l], layers[l].bias_grad);
      stored(l);
    }
    return loss / batch;
  }

  /// Mean loss and accuracy over a whole data set (forward only). Every rank calls it; each
  /// evaluates every W-th chunk of samples, and the sums meet on every rank.
  evaluation evaluate(const dataset& d) {
    constexpr std::size_t chunk = 256;
    load_parameters();
    evaluation e;
    const std::size_t ranks = std::size_t(world_size());
    for (std::size_t first = std::size_t(world_rank()) * chunk; first < d.size(); first += ranks * chunk) {
      const int batch = int(std::min(chunk, d.size() - first));
      forward(std::span(d.x).subspan(first * n_inputs, std::size_t(batch) * n_inputs), batch);
      for (int n = 0; n < batch; ++n) {
        const float* z = &act_[depth][std::size_t(n) * n_classes];
        const int label = d.y[first + n];
        e.loss += cross_entropy(z, label);
        e.accuracy += (std::max_element(z, z + n_classes) - z == label) ? 1 : 0;
      }
    }
    e.loss = sum_over_ranks(e.loss) / double(d.size());
    e.accuracy = sum_over_ranks(e.accuracy) / double(d.size());
    return e;
  }

 private:
  // Reads the stored parameters (type P) into the float copies the arithmetic uses, and a
  // transposed copy of each weight so that every inner loop below runs over contiguous memory.
  void load_parameters() {
    for (int l = 0; l < depth; ++l) {
      widen<P>(layers[l].weight, w_[l]);
      widen<P>(layers[l].bias, b_[l]);
      const int in = widths[l], out = widths[l + 1];
      for (int o = 0; o < out; ++o)
        for (int i = 0; i < in; ++i) wt_[l][std::size_t(i) * out + o] = w_[l][std::size_t(o) * in + i];
    }
  }

  void forward(std::span<const float> x, int batch) {
    act_[0].assign(x.begin(), x.end());
    for (int l = 0; l < depth; ++l) {
      const int in = widths[l], out = widths[l + 1];
      act_[l + 1].resize(std::size_t(batch) * out);
      const bool relu = l + 1 < depth;  // ReLU on the hidden layers, raw logits at the end
      for (int n = 0; n < batch; ++n) {
        const float* xn = &act_[l][std::size_t(n) * in];
        float* yn = &act_[l + 1][std::size_t(n) * out];
        std::ranges::copy(b_[l], yn);  // y = b + sum_i x[i] * W[:, i]
        for (int i = 0; i < in; ++i) {
          if (xn[i] == 0.0f) continue;  // ReLU zeroed it
          const float* wi = &wt_[l][std::size_t(i) * out];
          for (int o = 0; o < out; ++o) yn[o] += xn[i] * wi[o];
        }
        if (relu)
          for (int o = 0; o < out; ++o) yn[o] = std::max(yn[o], 0.0f);
      }
    }
  }

  // Expects dact_[depth] = d(scaled loss)/d(logits); fills dw_ and db_.
  void backward(int batch) {
    for (int l = depth - 1; l >= 0; --l) {
      const int in = widths[l], out = widths[l + 1];
      std::ranges::fill(dw_[l], 0.0f);
      std::ranges::fill(db_[l], 0.0f);
      const bool propagate = l > 0;  // no gradient needed for the input data
      if (propagate) dact_[l].assign(std::size_t(batch) * in, 0.0f);
      for (int n = 0; n < batch; ++n) {
        const float* xn = &act_[l][std::size_t(n) * in];
        const float* dyn = &dact_[l + 1][std::size_t(n) * out];
        float* dxn = propagate ? &dact_[l][std::size_t(n) * in] : nullptr;
        for (int o = 0; o < out; ++o) {
          const float g = dyn[o];
          if (g == 0.0f) continue;  // ReLU zeroed it
          db_[l][o] += g;
          float* dwo = &dw_[l][std::size_t(o) * in];
          for (int i = 0; i < in; ++i) dwo[i] += g * xn[i];
          if (propagate) {
            const float* wo = &w_[l][std::size_t(o) * in];
            for (int i = 0; i < in; ++i) dxn[i] += g * wo[i];
          }
        }
        if (propagate)  // through the ReLU that produced xn
          for (int i = 0; i < in; ++i)
            if (xn[i] <= 0.0f) dxn[i] = 0.0f;
      }
    }
  }

  std::array<std::vector<float>, depth> w_, wt_, b_;  // float copies of the parameters (wt_: transposed)
  std::array<std::vector<float>, depth> dw_, db_;      // float gradients, before rounding to G
  std::array<std::vector<float>, depth + 1> act_, dact_;    // activations and their gradients
};

// ---------------------------------------------------------------------------------------------
// Command line.

struct config {
  std::string precision = "fp16";  // fp16 | bf16 | fp32
  std::string scaler;              // dynamic | static | none; default: dynamic for fp16, else none
  std::string rounding = "nearest";  // nearest | stochastic (of the master into 16-bit parameters)
  std::string state = "fp32";      // fp32 | bf16: how the rule's state is stored
  std::string master = "fp32";     // fp32 | remainder16: how the master is stored
  std::string rule = "adam";       // adam | lamb | onebit_lamb | onebit_adam | zero_one_adam
  std::string layout = "fused";    // fused | unfused
  std::string device = with_device ? "cuda" : "host";  // cuda in train_mlp_device, else host
  int zero = -1;                   // -1: one process; 0: replicated over MPI ranks; 1, 2: ZeRO stage
  bool overlap = false;            // optimizer_options::overlap_comm
  int steps = 600;
  int batch = 64;
  int accumulate = 1;
  int print_every = 100;
  double lr = -1;         // < 0: the rule's default (see usage)
  double loss_scale = 0;  // 0: 2^24 initial scale for dynamic, 1024 for static
  double weight_decay = 0.01;
  std::uint64_t seed = 1;
  std::size_t train_samples = 8192;
  std::uint64_t freeze_step = 0;  // the compressing rules; 0: 20% of the steps
  bool bias_correction = true;    // adam, lamb
  mpopt::compression_options compression;  // the compressing rules
  bool compare_fp32 = true;       // repeat a 16-bit run in fp32 and compare the two
  std::string schedule = "constant";  // constant | linear (decay to 0 over the steps)
  std::string csv;                // write "step,loss" here (the batch loss averaged over ranks)
  std::string load;               // resume from this checkpoint before the first step
  std::string save;               // write a checkpoint here after the last step
  std::string config_file;        // a DeepSpeed JSON configuration: the optimizer comes from it
  std::vector<std::string> given;  // the flags on the command line
};

constexpr std::string_view usage = R"(usage: train_mlp [options]

Trains a 32-64-64-10 MLP on a synthetic 10-class task with mixed precision, then repeats the
run in fp32 without loss scaling for comparison (unless --compare-fp32 off).

  --precision fp16|bf16|fp32    parameter and gradient type (default fp16)
  --scaler dynamic|static|none  loss scaling; dynamic or static need fp16 (default: dynamic
                                for fp16, none otherwise); fp16 with none takes --rule adam or
                                lamb, replicated
  --loss-scale S                initial scale (dynamic, default 2^24) or the scale (static,
                                default 1024)
  --rounding nearest|stochastic how the fp32 master becomes the 16-bit parameters (default
                                nearest); stochastic (bf16, or fp16 with dynamic scaling) is
                                seeded by --seed and gives the same bits on any thread count,
                                SIMD level or number of ranks; it takes --rule adam or lamb,
                                replicated
  --state fp32|bf16|blockwise8|blockwise4|fp8
                                how the rule's state is stored (default fp32): bf16, or quantized
                                in blocks (8-bit, 4-bit or fp8 codes, a scale per block; with
                                --rule adam only)
  --master fp32|remainder16     how the master is stored (default fp32): remainder16 keeps the 16
                                bits the bf16 parameter lacks of it, so the two are the fp32 master
                                exactly. Built as --state S --master remainder16 with --precision
                                bf16 (bf16 state: 6 bytes of state a parameter instead of 12),
                                --rule adam or lamb, replicated (this example's choice); --load
                                reads a checkpoint of any storage into these
  --rule adam|lamb|onebit_lamb|onebit_adam|zero_one_adam
                                update rule (default adam; AdamW-style weight decay). onebit_lamb
                                (1-bit LAMB) and onebit_adam (1-bit Adam) average the momentum over
                                ranks 1-bit compressed after --freeze-step warm-up steps of LAMB or
                                Adam; zero_one_adam (0/1 Adam) averages gradients 1-bit compressed
                                between variance steps for --freeze-step steps, then steps locally
                                and averages the parameters' drift at syncs, up to 16 steps apart
                                (the interval doubles every --steps / 20 steps); replicated only
                                (no --zero 1|2)
  --freeze-step N               the compressing rules' warm-up steps (0/1 Adam: var_freeze_step;
                                default: 20% of --steps)
  --compression-scale per_tensor|global
                                the compressing rules' scales: each tensor its own (default) or one
                                over every tensor (DeepSpeed's fp16 optimizer's, and mpopt's before)
  --exclude-zero-variance on|off
                                the compressing rules keep a zero average where the variance is 0
                                when compression starts (default on) ...
  --zero-variance-ratio X       ... or at most X times its tensor's mean (default 1e-3)
  --bias-correction on|off      adam's and lamb's bias correction (default on; the compressing
                                rules have none, so compare them with off)
  --compare-fp32 on|off         after a 16-bit run, the same run in fp32 without loss scaling,
                                and the two side by side (default on)
  --csv FILE                    write "step,loss" per step, the batch loss averaged over ranks
  --schedule constant|linear    learning rate over the steps: constant (default) or decaying
                                linearly to 0 (mpopt::linear_with_warmup, by applied steps); with
                                --config, its scheduler block decides instead
  --layout fused|unfused        optimizer-owned flat buffers (add_flat_group, default) or the
                                model's own vectors (add_group + add)
  --steps N                     optimizer steps (default 600; 0 with --save writes the
                                optimizer's state before any step: a template for
                                tools/mpopt_checkpoint.py import)
  --load FILE                   resume from a checkpoint saved by --save with the same options
                                (or made by tools/mpopt_checkpoint.py import) before the first step
  --save FILE                   save a checkpoint after the last step (weights with their shapes,
                                [out, in] and [out], fp32 masters, moments, scaler, counters)
  --batch B                     samples per micro-batch (default 64)
  --accumulate K                micro-batches per optimizer step (default 1)
  --lr X                        learning rate (default 3e-3 for adam and onebit_adam, 1e-2 for lamb
                                and onebit_lamb)
  --seed S                      seed of the data, the initial weights and the batches (default 1)
  --train-samples N             training set size (default 8192: many passes over few samples;
                                2^18: about one pass in 2000 steps on 4 ranks, like pretraining)
  --print-every N               progress line every N steps (default 100; 0: none)
  --device host|cuda            the optimizer's backend: host in train_mlp; cuda (only) in
                                train_mlp_device, the device backend built for Thrust's OpenMP
                                system, with --rule adam or lamb
  --zero 0|1|2                  the MPI build only (under mpirun): 0 replicated, 1 ZeRO-1, 2 ZeRO-2;
                                each rank trains on its own shard of the data (default 0)
  --overlap on|off              reduce gradients during backward as layers finish, and gather the
                                updated parameters during the next forward (overlap_comm with
                                leave_param_gather_in_flight; default off)
  --config FILE                 the optimizer from a DeepSpeed JSON configuration (fp16, bf16,
                                zero_optimization, optimizer, gradient_clipping, ...; see
                                docs/deepspeed-config.md) through mpopt::make_optimizer. It sets what --precision,
                                --scaler, --loss-scale, --rounding, --rule, --lr, --freeze-step,
                                --bias-correction, --accumulate, --zero, --overlap and --device set, so those
                                are refused with it; train_micro_batch_size_per_gpu, when given,
                                sets --batch. Examples: examples/configs/*.json
  --help                        this text
)";

using example::usage_error, example::parse_number, example::check_choice;

// Most flags stand for a DeepSpeed configuration, and their optimizer comes from
// configured_optimizer.cpp, compiled once. A few need an optimizer type of this file's own (the
// typed path): stochastic rounding and fp16 without loss scaling, which a configuration cannot
// say, and every run of train_mlp_device (make_optimizer builds host-backend optimizers).
bool needs_typed_path(const config& c) {
  return with_device || c.rounding == "stochastic" || c.state != "fp32" || (c.precision == "fp16" && c.scaler == "none");
}

// Returns false if --help was given.
bool parse_args(int argc, char** argv, config& c) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "--help" || flag == "-h") return false;
    if (const auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
    } else if (flag.starts_with("--") && i + 1 < argc && !std::string_view(argv[i + 1]).starts_with("--")) {
      value = argv[++i];
    } else {
      throw usage_error{flag.starts_with("--") ? flag + " needs a value" : "unexpected argument '" + flag + "'"};
    }
    c.given.push_back(flag);
    if (flag == "--precision") check_choice(flag, c.precision = value, {"fp16", "bf16", "fp32"});
    else if (flag == "--scaler") check_choice(flag, c.scaler = value, {"dynamic", "static", "none"});
    else if (flag == "--rounding") check_choice(flag, c.rounding = value, {"nearest", "stochastic"});
    else if (flag == "--state") check_choice(flag, c.state = value, {"fp32", "bf16", "blockwise8", "blockwise4", "fp8"});
    else if (flag == "--master") check_choice(flag, c.master = value, {"fp32", "remainder16"});
    else if (flag == "--rule") check_choice(flag, c.rule = value, {"adam", "lamb", "onebit_lamb", "onebit_adam", "zero_one_adam"});
    else if (flag == "--freeze-step") c.freeze_step = parse_number<std::uint64_t>(flag, value, 1);
    else if (flag == "--csv") c.csv = value;
    else if (flag == "--config") {
      if (with_device)  // and so train_mlp_device does not compile the factory
        throw usage_error{"--config builds a host-backend optimizer: build/examples/train_mlp --config FILE"};
      c.config_file = value;
    }
    else if (flag == "--schedule") check_choice(flag, c.schedule = value, {"constant", "linear"});
    else if (flag == "--bias-correction") {
      check_choice(flag, value, {"on", "off"});
      c.bias_correction = value == "on";
    }
    else if (flag == "--compression-scale") {
      check_choice(flag, value, {"per_tensor", "global"});
      c.compression.scale = value == "global" ? mpopt::compression_scale::global : mpopt::compression_scale::per_tensor;
    }
    else if (flag == "--exclude-zero-variance") {
      check_choice(flag, value, {"on", "off"});
      c.compression.exclude_zero_variance = value == "on";
    }
    else if (flag == "--zero-variance-ratio") c.compression.zero_variance_ratio = parse_number<double>(flag, value, 0.0);
    else if (flag == "--overlap") {
      check_choice(flag, value, {"on", "off"});
      c.overlap = value == "on";
    }
    else if (flag == "--compare-fp32") {
      check_choice(flag, value, {"on", "off"});
      c.compare_fp32 = value == "on";
    }
    else if (flag == "--layout") check_choice(flag, c.layout = value, {"fused", "unfused"});
    else if (flag == "--loss-scale") c.loss_scale = parse_number<double>(flag, value, 1);
    else if (flag == "--steps") c.steps = parse_number<int>(flag, value, 0);
    else if (flag == "--load") c.load = value;
    else if (flag == "--save") c.save = value;
    else if (flag == "--batch") c.batch = parse_number<int>(flag, value, 1);
    else if (flag == "--accumulate") c.accumulate = parse_number<int>(flag, value, 1);
    else if (flag == "--lr") c.lr = parse_number<double>(flag, value, 0);
    else if (flag == "--seed") c.seed = parse_number<std::uint64_t>(flag, value, 0);
    else if (flag == "--train-samples") c.train_samples = parse_number<std::size_t>(flag, value, 1);
    else if (flag == "--print-every") c.print_every = parse_number<int>(flag, value, 0);
    else if (flag == "--device") {
      check_choice(flag, c.device = value, {"host", "cuda"});
      if (c.device == "cuda" && !with_device)
        throw usage_error{"--device cuda needs the device build: build/examples/train_mlp_device --device cuda"};
      if (c.device == "host" && with_device)  // one backend per build keeps each build's instantiations few
        throw usage_error{"train_mlp_device steps on the device backend only: build/examples/train_mlp for the host"};
    }
    else if (flag == "--zero") {
      check_choice(flag, value, {"0", "1", "2"});
      if (!with_mpi) throw usage_error{"--zero needs the MPI build: mpirun -np 2 build/examples/train_mlp --zero 2"};
      c.zero = std::stoi(value);
    }
    else throw usage_error{"unknown option '" + flag + "'"};
  }

  if (!c.config_file.empty()) {
    // The configuration decides these; a flag beside it would be one of two answers.
    static const std::pair<std::string_view, std::string_view> decided[] = {
        {"--precision", "fp16.enabled and bf16.enabled"},
        {"--scaler", "fp16.loss_scale"},
        {"--loss-scale", "fp16.loss_scale and fp16.initial_scale_power"},
        {"--rounding", "nothing: a configuration rounds to nearest"},
        {"--rule", "optimizer.type"},
        {"--lr", "optimizer.params.lr"},
        {"--freeze-step", "optimizer.params.freeze_step"},
        {"--bias-correction", "optimizer.params.bias_correction"},
        {"--compression-scale", "optimizer.params.compression_scale"},
        {"--exclude-zero-variance", "optimizer.params.exclude_zero_variance"},
        {"--zero-variance-ratio", "optimizer.params.zero_variance_ratio"},
        {"--accumulate", "gradient_accumulation_steps"},
        {"--zero", "zero_optimization.stage"},
        {"--overlap", "zero_optimization.overlap_comm"},
        {"--device", "nothing: make_optimizer builds host-backend optimizers"}};
    for (const auto& [flag, key] : decided)
      if (std::ranges::find(c.given, flag) != c.given.end())
        throw usage_error{std::string(flag) + " conflicts with --config: the configuration decides it (" + std::string(key) + ")"};
  }
  if (c.scaler.empty()) c.scaler = c.precision == "fp16" ? "dynamic" : "none";
  if (c.scaler != "none" && c.precision != "fp16")
    throw usage_error{"--scaler " + c.scaler + " needs --precision fp16: loss scaling exists for fp16 gradients; " +
                      c.precision + " has float's exponent range (use --scaler none)"};
  if (c.loss_scale != 0 && c.scaler == "none") throw usage_error{"--loss-scale needs --scaler dynamic or static"};
  if (c.rounding == "stochastic" && c.precision == "fp32")
    throw usage_error{"--rounding stochastic needs --precision bf16 or fp16: fp32 parameters are their own master"};
  if ((c.state != "fp32" || c.master != "fp32") &&
      (c.precision != "bf16" || c.state == "fp32" || c.master != "remainder16" || c.rounding != "nearest"))
    throw usage_error{"--state and --master are built as --precision bf16 --state S --master remainder16 only "
                      "(this example's choice)"};
  const bool quantized = c.state != "fp32" && c.state != "bf16";
  if (quantized && (with_device || c.rule != "adam"))
    throw usage_error{"--state " + c.state + " is built with --rule adam on the host only (this example's choice)"};
  if (c.rounding == "stochastic" && c.precision == "fp16" && c.scaler != "dynamic")
    throw usage_error{"--rounding stochastic with fp16 is built with --scaler dynamic only (this example's choice)"};
  if (c.loss_scale == 0) c.loss_scale = c.scaler == "dynamic" ? 0x1p24 : 1024;
  if (c.lr < 0) c.lr = c.rule.ends_with("adam") ? 3e-3 : 1e-2;
  const bool compressing = c.rule == "onebit_lamb" || c.rule == "onebit_adam" || c.rule == "zero_one_adam";
  if (c.freeze_step != 0 && !compressing)
    throw usage_error{"--freeze-step needs --rule onebit_lamb, onebit_adam or zero_one_adam"};
  if (!c.bias_correction && c.rule != "lamb" && c.rule != "adam")
    throw usage_error{"--bias-correction needs --rule adam or lamb"};
  for (const char* flag : {"--compression-scale", "--exclude-zero-variance", "--zero-variance-ratio"})
    if (!compressing && std::ranges::find(c.given, flag) != c.given.end())
      throw usage_error{std::string(flag) + " needs --rule onebit_lamb, onebit_adam or zero_one_adam"};
  if (c.freeze_step == 0) c.freeze_step = std::max(1, c.steps / 5);
  if (c.train_samples < std::size_t(world_size()))
    throw usage_error{"--train-samples must be at least the number of ranks (" + std::to_string(world_size()) + ")"};
  if (compressing && c.zero > 0)
    throw usage_error{"--rule " + c.rule + " keeps the whole momentum on every rank: use --zero 0"};
  if (needs_typed_path(c)) {
    const std::string what = with_device                  ? "train_mlp_device"
                             : c.rounding == "stochastic" ? "--rounding stochastic"
                             : c.state != "fp32"          ? "--state " + c.state
                                                          : "fp16 with --scaler none";
    if (c.rule != "adam" && c.rule != "lamb")
      throw usage_error{what + " is built with --rule adam or lamb only (this example's choice)"};
    if (c.zero > 0) throw usage_error{what + " is built replicated only: use --zero 0 (this example's choice)"};
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Attaching the model's tensors to the optimizer. Two parameter groups in both layouts: the
// weights with weight decay, the biases without.

// The views of flat tensor i: a typed optimizer's group knows their element type, an
// mpopt::any_optimizer's is told it (and checks it).
template <class T, class Group>
std::span<T> param_view(Group& g, std::size_t i) {
  if constexpr (requires { g.template param<T>(i); }) return g.template param<T>(i);
  else return g.param(i);
}
template <class T, class Group>
std::span<T> grad_view(Group& g, std::size_t i) {
  if constexpr (requires { g.template grad<T>(i); }) return g.template grad<T>(i);
  else return g.grad(i);
}

// Fused: the optimizer allocates one flat parameter buffer and one flat gradient buffer per group
// (like DeepSpeed's flattened groups); the layers get views into them. They start at zero.
// `Options`: the rule's group options, or an any_optimizer's group_settings.
template <class Opt, class Model, class Options>
void attach_fused(Opt& opt, Model& model, const Options& weights_options, const Options& biases_options) {
  using P = typename Model::param_type;
  using G = typename Model::grad_type;
  std::vector<mpopt::tensor_spec> weight_specs, bias_specs;
  for (const auto& l : model.layers) {
    // With their shapes, as PyTorch's nn.Linear has them: checkpoints store them.
    weight_specs.push_back({l.name + ".weight", std::size_t(l.in) * l.out, {l.out, l.in}});
    bias_specs.push_back({l.name + ".bias", std::size_t(l.out), {l.out}});
  }
  auto&& weights = opt.add_flat_group(weights_options, weight_specs);
  auto&& biases = opt.add_flat_group(biases_options, bias_specs);
  for (std::size_t i = 0; i < model.layers.size(); ++i) {
    auto& l = model.layers[i];
    l.weight = param_view<P>(weights, i);
    l.weight_grad = grad_view<G>(weights, i);
    l.bias = param_view<P>(biases, i);
    l.bias_grad = grad_view<G>(biases, i);
  }
}

// Unfused: the model owns its tensors (here std::vectors) and registers them one by one. They
// must stay alive and in place as long as the optimizer is used.
template <class P, class G>
struct owned_tensor {
  std::vector<P> param;
  std::vector<G> grad;
};

template <class Opt, class Model, class Options>
void attach_unfused(Opt& opt, Model& model, const Options& weights_options, const Options& biases_options,
                    std::vector<owned_tensor<typename Model::param_type, typename Model::grad_type>>& storage) {
  using P = typename Model::param_type;
  using G = typename Model::grad_type;
  storage.reserve(2 * model.layers.size());  // no reallocation: the optimizer keeps pointers
  auto make = [&](std::size_t n) -> auto& {
    return storage.emplace_back(owned_tensor<P, G>{std::vector<P>(n, P(0.0f)), std::vector<G>(n, G(0.0f))});
  };
  auto&& weights = opt.add_group(weights_options);
  auto&& biases = opt.add_group(biases_options);
  for (auto& l : model.layers) {
    auto& w = make(std::size_t(l.in) * l.out);
    auto& b = make(std::size_t(l.out));
    weights.add(w.param, w.grad, l.name + ".weight", {l.out, l.in});
    biases.add(b.param, b.grad, l.name + ".bias", {l.out});
    l.weight = w.param;
    l.weight_grad = w.grad;
    l.bias = b.param;
    l.bias_grad = b.grad;
  }
}

// ---------------------------------------------------------------------------------------------
// The training loop, written once for every optimizer type.

struct run_result {
  double initial_loss = 0;  // on the whole training set, before the first step
  double final_loss = 0;    // on the whole training set, after the last step
  double test_accuracy = 0;
  std::uint64_t skipped = 0;
  double comm_ratio = 0;  // bytes sent per step over an fp32 all-reduce of the gradients, on average
  double seconds = 0;  // the training loop only
  double largest_parameter = 0;  // the largest magnitude of any weight or bias after the last step
  std::string memory;  // the optimizer's memory report on this rank
  std::size_t memory_total = 0;  // the bytes it holds on this rank
};

std::string format(const char* spec, double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, spec, v);
  return buf;
}

template <class Scaler>
Scaler scaler_options(const config& c) {
  if constexpr (std::is_same_v<Scaler, mpopt::dynamic_scale_options>) {
    // A deliberately huge initial scale: the first backward passes overflow fp16 (max 65504), those
    // steps are skipped (weights untouched) and the scale comes down until the gradients fit.
    // After `window` clean steps the scaler tries doubling it again, which can cost another skip.
    // DeepSpeed starts at 2^16 by default; 2^24 makes the mechanism visible.
    return {.init_scale = c.loss_scale, .window = 200};
  } else if constexpr (std::is_same_v<Scaler, mpopt::static_scale_options>) {
    return {.scale = c.loss_scale};
  } else {
    return {};
  }
}

template <class Opt, class Model>
run_result train_loop(const config& c, const task& data, bool verbose, Opt& opt, Model& model);

// What a run prints at its first compressed step.
std::string compression_news(const std::string& rule, std::size_t ranks) {
  if (ranks == 1) return rule + ": compressing from here (one rank: nothing to compress)";
  if (rule == "onebit_lamb") return "1-bit LAMB: warm-up done, variance frozen; the momentum is averaged 1-bit compressed from here";
  if (rule == "onebit_adam") return "1-bit Adam: warm-up done, variance frozen; the momentum is averaged 1-bit compressed from here";
  return "0/1 Adam: gradients are averaged 1-bit compressed between variance steps from here";
}

template <class Opt>
run_result train(const config& c, const task& data, bool verbose) {
  using P = typename Opt::param_type;
  using G = typename Opt::grad_type;

  std::vector<owned_tensor<P, G>> storage;  // the unfused layout's tensors; outlives the optimizer
  // Clip the true gradient to a global L2 norm of 1; give up (mpopt::error) if 100 steps in a row
  // overflow, which no sane loss scale would cause.
  Opt opt(make_communicator(),
          {.clip_grad = 1.0, .accumulation_steps = c.accumulate, .max_consecutive_skips = 100, .rounding_seed = c.seed,
           .overlap_comm = c.overlap, .leave_param_gather_in_flight = c.overlap},
          scaler_options<typename Opt::scaler_options>(c));

  typename Opt::group_options weights_options{.lr = c.lr, .weight_decay = c.weight_decay};
  typename Opt::group_options biases_options{.lr = c.lr, .weight_decay = 0.0};
  weights_options.bias_correction = biases_options.bias_correction = c.bias_correction;
  mlp<P, G> model;
  if (c.layout == "fused") attach_fused(opt, model, weights_options, biases_options);
  else attach_unfused(opt, model, weights_options, biases_options, storage);
  return train_loop(c, data, verbose, opt, model);
}

#if !MPOPT_EXAMPLE_DEVICE  // parse_args refuses --config there
// The same with the optimizer a DeepSpeed configuration describes, its tensors of type P.
template <class P>
run_result train_configured(const config& c, const mpopt::deepspeed_config& ds, const task& data, bool verbose) {
  std::vector<owned_tensor<P, P>> storage;  // outlives the optimizer
  mpopt::any_optimizer opt = make_configured_optimizer(ds);
  if (verbose && world_rank() == 0) std::printf("optimizer: mpopt::optimizer<%s>\n", opt.policies().c_str());
  // The weights with the configuration's options, the biases without weight decay.
  const mpopt::group_settings weights_options, biases_options{.weight_decay = 0.0};
  mlp<P, P> model;
  if (c.layout == "fused") attach_fused(opt, model, weights_options, biases_options);
  else attach_unfused(opt, model, weights_options, biases_options, storage);
  return train_loop(c, data, verbose, opt, model);
}
#endif

// Initializes the model and trains it with opt: a typed optimizer or an mpopt::any_optimizer.
template <class Opt, class Model>
run_result train_loop(const config& c, const task& data, bool verbose, Opt& opt, Model& model) {
  using clock = std::chrono::steady_clock;
  model.initialize(c.seed);
  if (c.schedule == "linear") opt.set_schedule(mpopt::linear_with_warmup{.total_steps = std::max(1, c.steps)});
  if (!c.load.empty()) {  // parameters, fp32 masters, moments, scaler, counters, schedule: all from the file
    opt.load(c.load);
    if (verbose && world_rank() == 0)
      std::printf("loaded %s: %llu steps applied, loss scale %g\n", c.load.c_str(),
                  static_cast<unsigned long long>(opt.group(0).step()), opt.loss_scale());
  }

  run_result r;
  r.initial_loss = model.evaluate(data.train).loss;

  // Each rank draws its batches from its own shard of the training set: samples rank, rank + W, ...
  const std::size_t rank = std::size_t(world_rank()), ranks = std::size_t(world_size());
  rng batches(c.seed + 1 + rank);
  std::vector<float> x(std::size_t(c.batch) * n_inputs);
  std::vector<int> y(c.batch);
  double loss_sum = 0, last_norm = -1;  // mean batch loss since the last progress line; last applied step's norm
  int loss_count = 0;
  bool compressing = false;  // a compressing rule past its warm-up
  double comm_sum = 0;       // the steps' comm_ratio
  std::FILE* csv = nullptr;  // written by rank 0
  if (verbose && !c.csv.empty()) {
    if (world_rank() == 0) csv = std::fopen(c.csv.c_str(), "w");
    // Every rank learns of rank 0's failure, or the others would wait for it in the first step.
    if (mean_over_ranks(world_rank() == 0 && !csv ? 1 : 0) > 0) throw std::runtime_error("cannot write " + c.csv);
    if (csv) std::fprintf(csv, "step,loss\n");
  }
  mpopt::step_status status;
  const auto start = clock::now();
  auto last_print = start;

  for (int step = 1; step <= c.steps; ++step) {
    double step_loss = 0;  // this rank's batch loss, averaged over the micro-batches
    for (int micro = 0; micro < c.accumulate; ++micro) {
      for (int n = 0; n < c.batch; ++n) {
        const std::size_t s = batches.below(data.train.size() / ranks) * ranks + rank;
        std::copy_n(&data.train.x[s * n_inputs], n_inputs, &x[std::size_t(n) * n_inputs]);
        y[n] = data.train.y[s];
      }
      opt.wait_params();  // --overlap: the last step's parameters may still be on their way
      // Tensors are registered as group 0 = the layers' weights, group 1 = their biases.
      const double loss = model.train_batch(x, y, float(opt.loss_scale()), [&](int l) {
        opt.grad_ready(std::size_t(l));
        opt.grad_ready(std::size_t(model.depth + l));
      });
      loss_sum += loss;
      step_loss += loss / c.accumulate;
      ++loss_count;
      // One call per backward: micro-steps 1..K-1 only accumulate, the K-th applies (or skips).
      status = opt.step();
    }
    if (status.applied) last_norm = status.grad_norm;
    if (verbose && !c.csv.empty()) {  // every rank takes part in the average
      const double global = mean_over_ranks(step_loss);
      if (csv) std::fprintf(csv, "%d,%.6f\n", step, global);
    }
    if (verbose && rank == 0 && status.compression_step > 0 && !compressing)  // counts applied steps only
      std::printf("step %5d  %s\n", step, compression_news(c.rule, ranks).c_str());
    compressing = status.compression_step > 0;
    comm_sum += status.comm_ratio;

    if (verbose && rank == 0 && c.print_every > 0 && (step % c.print_every == 0 || step == c.steps)) {
      const auto now = clock::now();
      const double elapsed = std::chrono::duration<double>(now - last_print).count();
      const int since = step % c.print_every == 0 ? c.print_every : step % c.print_every;
      const std::string norm = last_norm < 0 ? "-" : format("%.3f", last_norm);  // "-": no step applied yet
      std::printf("step %5d  loss %.4f  scale %-9.0f  grad-norm %6s  skipped %3llu  %5.0f steps/s", step,
                  loss_sum / loss_count, opt.loss_scale(), norm.c_str(),
                  static_cast<unsigned long long>(status.skipped_steps), since / elapsed);
      // Bytes sent per step, as a fraction of an fp32 all-reduce of every gradient.
      if (with_mpi) std::printf("  comm %.3f", status.comm_ratio);
      std::printf("\n");
      loss_sum = 0;
      loss_count = 0;
      last_print = now;
    }
  }
  opt.wait_params();  // before the evaluation reads them
  if (csv) std::fclose(csv);
  r.seconds = std::chrono::duration<double>(clock::now() - start).count();
  if (!c.save.empty()) {
    opt.finalize();  // with --steps 0: the state before any step
    opt.save(c.save);
    if (verbose && rank == 0) std::printf("saved %s\n", c.save.c_str());
  }
  r.skipped = status.skipped_steps;
  r.comm_ratio = c.steps > 0 ? comm_sum / c.steps : 0;
  r.final_loss = model.evaluate(data.train).loss;
  r.largest_parameter = model.largest_parameter();
  r.test_accuracy = model.evaluate(data.test).accuracy;
  r.memory = opt.memory_report().to_string();
  r.memory_total = opt.memory_report().owned_bytes();
  return r;
}

std::string describe(const config& c) {
  std::string s = c.precision;
  if (c.scaler != "none") s += " + " + c.scaler + " scale";
  if (c.rounding == "stochastic") s += " + stochastic rounding";
  if (c.state != "fp32") s += " + " + c.state + " state, " + c.master + " master";
  return s;
}

void print_comparison(const std::string& label, const run_result& mixed, const run_result& fp32) {
  const int width = std::max(28, int(label.size()) + 2);
  auto row = [&](const char* what, const std::string& a, const std::string& b) {
    std::printf("  %-18s %-*s %s\n", what, width, a.c_str(), b.c_str());
  };
  std::printf("\nthe same run (seed, data, initial weights, batches) in fp32 without loss scaling:\n");
  row("", label, "fp32");
  row("final train loss", format("%.4f", mixed.final_loss), format("%.4f", fp32.final_loss));
  row("test accuracy", format("%.1f%%", 100 * mixed.test_accuracy), format("%.1f%%", 100 * fp32.test_accuracy));
  row("skipped steps", format("%.0f", double(mixed.skipped)), format("%.0f", double(fp32.skipped)));
  row("wall time", format("%.2f s", mixed.seconds), format("%.2f s", fp32.seconds));
}

int report(const config& c, const std::string& label, std::string_view partition, const run_result& r,
           const std::optional<run_result>& fp32);

template <class Opt>
int run(const config& c, const task& data) {
  const bool printer = world_rank() == 0;
  if (printer) {
    std::printf("train_mlp: %s, %s, %s layout, %s backend; MLP %d-%d-%d-%d; %zu train / %zu test samples; %d steps of %s%d samples",
                describe(c).c_str(), c.rule.c_str(), c.layout.c_str(), c.device.c_str(), n_inputs, n_hidden, n_hidden, n_classes,
                data.train.size(), data.test.size(), c.steps,
                c.accumulate > 1 ? (std::to_string(c.accumulate) + " x ").c_str() : "", c.batch);
    if (with_mpi) std::printf(" per rank; %s over %d ranks", std::string(Opt::partition::name).c_str(), world_size());
    std::printf("; host SIMD %s\n", std::string(mpopt::to_string(mpopt::host::simd())).c_str());
  }

  const run_result r = train<Opt>(c, data, true);
  std::optional<run_result> fp32;
  if constexpr (!std::is_same_v<typename Opt::precision, mpopt::fp32>) {
    if (c.compare_fp32) {
      using reference =
          mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, typename Opt::rule, mpopt::host, communicator>;
      config fc = c;
      fc.precision = "fp32";
      fc.scaler = "none";
      fc.load.clear();  // the checkpoints are the mixed-precision run's
      fc.save.clear();
      fp32 = train<reference>(fc, data, false);
    }
  }
  return report(c, describe(c), Opt::partition::name, r, fp32);
}

// What every run prints at the end (beside an fp32 run, if there is one); nonzero if the loss did
// not go down.
int report(const config& c, const std::string& label, std::string_view partition, const run_result& r,
           const std::optional<run_result>& fp32) {
  const bool printer = world_rank() == 0;
  if (printer) std::printf("done: train loss %.4f -> %.4f, test accuracy %.1f%% (chance %.0f%%), %llu of %d steps skipped, %.2f s\n",
              r.initial_loss, r.final_loss, 100 * r.test_accuracy, 100.0 / n_classes,
              static_cast<unsigned long long>(r.skipped), c.steps, r.seconds);
  if (printer) std::printf("largest |parameter| %.4g\n", r.largest_parameter);
  if (with_mpi && printer) std::printf("communication: comm_ratio %.4f on average (bytes per step over an fp32 all-reduce)\n", r.comm_ratio);
  if (fp32 && printer) print_comparison(label, r, *fp32);
  if (with_mpi) {
    const auto totals = gather_on_rank0(r.memory_total);
    if (printer) {
      std::printf("\noptimizer memory on rank 0 (%s over %d ranks):\n%s", std::string(partition).c_str(),
                  world_size(), r.memory.c_str());
      std::printf("optimizer total per rank:");
      for (std::size_t k = 0; k < totals.size(); ++k) std::printf("  rank %zu %llu B", k, totals[k]);
      std::printf("\n");
    }
  }

  if (c.steps > 0 && !(r.final_loss < r.initial_loss)) {  // also catches a NaN loss
    std::fprintf(stderr, "train_mlp: training did not reduce the loss (%.4f -> %.4f)\n", r.initial_loss, r.final_loss);
    return 1;
  }
  return 0;
}

// The typed path: runtime flags -> one instantiation of mpopt::optimizer<Precision, LossScaler,
// replicated, Rule>, Rule adam or lamb (parse_args refuses the rest). Each type costs the build
// seconds, so this path holds only what the configured path cannot: the device backend, stochastic
// rounding, fp16 without loss scaling.
using backend = std::conditional_t<with_device, device_backend, mpopt::host>;

template <class Precision, class Scaler>
int run_typed(const config& c, const task& data) {
  if (c.rule == "lamb")
    return run<mpopt::optimizer<Precision, Scaler, mpopt::replicated, mpopt::lamb, backend, communicator>>(c, data);
  return run<mpopt::optimizer<Precision, Scaler, mpopt::replicated, mpopt::adam, backend, communicator>>(c, data);
}

// Moments quantized in blocks of State, remainder16 masters, bf16: with Adam only (one optimizer type each).
template <class State>
int run_adam(const config& c, const task& data) {
  using P = mpopt::with_state<mpopt::bf16, State, mpopt::remainder16>;
  return run<mpopt::optimizer<P, mpopt::no_scaling, mpopt::replicated, mpopt::adam, backend, communicator>>(c, data);
}

#if !MPOPT_EXAMPLE_DEVICE
// The optimizer a DeepSpeed configuration describes (`source`: where it came from), on tensors of
// its precision's type.
int run_configured(config c, const mpopt::deepspeed_config& ds, const std::string& source, const task& data) {
  c.accumulate = ds.options.accumulation_steps;
  if (ds.micro_batch_size > 0) c.batch = ds.micro_batch_size;
  const bool printer = world_rank() == 0;
  if (printer) {
    std::printf("train_mlp: %s (%s), %s layout; MLP %d-%d-%d-%d; %zu train / %zu test samples; %d steps of %s%d samples",
                ds.summary().c_str(), source.c_str(), c.layout.c_str(), n_inputs, n_hidden, n_hidden, n_classes,
                data.train.size(), data.test.size(), c.steps,
                c.accumulate > 1 ? (std::to_string(c.accumulate) + " x ").c_str() : "", c.batch);
    if (with_mpi) std::printf(" per rank over %d ranks", world_size());
    std::printf("; host SIMD %s\n", std::string(mpopt::to_string(mpopt::host::simd())).c_str());
    std::string ignored;
    for (const auto& key : ds.ignored_keys) ignored += (ignored.empty() ? "" : ", ") + key;
    if (!ignored.empty()) std::printf("configuration keys that change nothing here: %s\n", ignored.c_str());
  }
  auto train_in = [&](const config& k, const mpopt::deepspeed_config& d, bool verbose) {
    switch (d.precision) {
      case mpopt::config_precision::fp16: return train_configured<mpopt::half>(k, d, data, verbose);
      case mpopt::config_precision::bf16: return train_configured<mpopt::bfloat16>(k, d, data, verbose);
      case mpopt::config_precision::fp32: break;
    }
    return train_configured<float>(k, d, data, verbose);
  };
  const run_result r = train_in(c, ds, true);
  std::optional<run_result> fp32;
  if (c.compare_fp32 && ds.precision != mpopt::config_precision::fp32) {  // the same configuration in fp32
    mpopt::deepspeed_config reference = ds;
    reference.precision = mpopt::config_precision::fp32;
    reference.scaler = mpopt::config_scaler::none;
    config fc = c;
    fc.load.clear();  // the checkpoints are the mixed-precision run's
    fc.save.clear();
    fp32 = train_in(fc, reference, false);
  }
  static constexpr std::string_view partitions[] = {"replicated", "zero1", "zero2"};
  return report(c, ds.summary(), partitions[ds.zero_stage], r, fp32);
}

// The flags as the DeepSpeed configuration they stand for (all but what needs_typed_path takes).
mpopt::deepspeed_config flags_config(const config& c) {
  mpopt::deepspeed_config ds;
  ds.precision = c.precision == "fp16"   ? mpopt::config_precision::fp16
                 : c.precision == "bf16" ? mpopt::config_precision::bf16
                                         : mpopt::config_precision::fp32;
  ds.scaler = c.scaler == "dynamic" ? mpopt::config_scaler::dynamic_scale
              : c.scaler == "static" ? mpopt::config_scaler::static_scale
                                     : mpopt::config_scaler::none;
  ds.dynamic_options = scaler_options<mpopt::dynamic_scale_options>(c);
  ds.static_options = scaler_options<mpopt::static_scale_options>(c);
  ds.zero_stage = std::max(c.zero, 0);
  // Clip the true gradient to a global L2 norm of 1; give up (mpopt::error) if 100 steps in a row
  // overflow, which no sane loss scale would cause.
  ds.options = {.clip_grad = 1.0, .accumulation_steps = c.accumulate, .max_consecutive_skips = 100,
                .rounding_seed = c.seed, .overlap_comm = c.overlap, .leave_param_gather_in_flight = c.overlap};
  ds.adam_options = {.lr = c.lr, .weight_decay = c.weight_decay, .bias_correction = c.bias_correction};
  ds.lamb_options = {.lr = c.lr, .weight_decay = c.weight_decay, .bias_correction = c.bias_correction};
  ds.onebit_adam_options = {.lr = c.lr, .weight_decay = c.weight_decay, .freeze_step = c.freeze_step,
                            .compression = c.compression};
  ds.onebit_lamb_options = {.lr = c.lr, .weight_decay = c.weight_decay, .freeze_step = c.freeze_step,
                            .compression = c.compression};
  ds.zero_one_adam_options = {.lr = c.lr, .weight_decay = c.weight_decay, .var_freeze_step = c.freeze_step,
                              .local_step_scaler = std::uint64_t(std::max(1, c.steps / 20)),
                              .compression = c.compression};
  set_rule(ds, c.rule);
  return ds;
}
#endif

int dispatch(const config& c, const task& data) {
#if !MPOPT_EXAMPLE_DEVICE
  if (!c.config_file.empty()) {
    const mpopt::deepspeed_config ds = mpopt::deepspeed_config::read(c.config_file, world_size());
    if (ds.micro_batch_size > 0 && std::ranges::find(c.given, "--batch") != c.given.end())
      throw usage_error{"--batch conflicts with --config: the configuration decides it (train_micro_batch_size_per_gpu)"};
    if (ds.schedule && c.schedule != "constant")
      throw usage_error{"--schedule conflicts with --config: the configuration decides it (scheduler)"};
    return run_configured(c, ds, "DeepSpeed configuration " + c.config_file, data);
  }
  if (!needs_typed_path(c)) return run_configured(c, flags_config(c), "from the flags", data);
#endif
  if (c.rounding == "stochastic") {  // parse_args allows bf16 and fp16 with dynamic scaling
    if (c.precision == "bf16") return run_typed<mpopt::bf16_stochastic, mpopt::no_scaling>(c, data);
    return run_typed<mpopt::fp16_stochastic, mpopt::dynamic_scale>(c, data);
  }
  if (c.precision == "fp16" && c.scaler == "none") return run_typed<mpopt::fp16, mpopt::no_scaling>(c, data);
  if (c.state == "bf16")
    return run_typed<mpopt::with_state<mpopt::bf16, mpopt::bf16_state<>, mpopt::remainder16>, mpopt::no_scaling>(c, data);
#if !MPOPT_EXAMPLE_DEVICE
  if (c.state == "blockwise8") return run_adam<mpopt::blockwise8_state>(c, data);
  if (c.state == "blockwise4") return run_adam<mpopt::blockwise4_state>(c, data);
  if (c.state == "fp8") return run_adam<mpopt::fp8_state>(c, data);
#endif
#if MPOPT_EXAMPLE_DEVICE
  if (c.precision == "fp32") return run_typed<mpopt::fp32, mpopt::no_scaling>(c, data);
  if (c.precision == "bf16") return run_typed<mpopt::bf16, mpopt::no_scaling>(c, data);
  if (c.scaler == "dynamic") return run_typed<mpopt::fp16, mpopt::dynamic_scale>(c, data);
  return run_typed<mpopt::fp16, mpopt::static_scale>(c, data);
#else
  throw std::logic_error("dispatch: flags that needs_typed_path does not know");
#endif
}

}  // namespace

int train_main(int argc, char** argv) {
  config c;
  try {
    if (!parse_args(argc, argv, c)) {
      std::fputs(usage.data(), stdout);
      return 0;
    }
  } catch (const usage_error& e) {
    std::fprintf(stderr, "train_mlp: %s (see --help)\n", e.message.c_str());
    return 2;
  }

  try {
    const task data = make_task(c.seed, c.train_samples, 2048);
    return dispatch(c, data);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "train_mlp: %s (see --help)\n", e.message.c_str());
    return 2;
  } catch (const mpopt::error& e) {  // invalid option, or training beyond what the scaler can rescue
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp: unexpected error: %s\n", e.what());
  }
  return 1;
}

int main(int argc, char** argv) {
#if MPOPT_EXAMPLE_MPI
  MPI_Init(&argc, &argv);
  const int rc = train_main(argc, argv);
  MPI_Finalize();
  return rc;
#else
  return train_main(argc, argv);
#endif
}
