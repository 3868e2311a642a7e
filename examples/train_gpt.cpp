// train_gpt: a small GPT, character level, trained on real text with mpopt, on 1 to N ranks.
//
//   build/examples/train_gpt                                     # the King James Bible, fp16, AdamW
//   build/examples/train_gpt --precision bf16 --rule lamb --steps 300
//   mpirun -np 2 build/examples/train_gpt --zero 2 --overlap on  # ZeRO-2, reducing during backward
//   build/examples/train_gpt --data my.txt --layers 6 --width 192 --csv loss.csv
//   build/examples/train_gpt --config examples/configs/fp16_adamw.json
//   build/examples/train_gpt --help
//
// Who does what:
//   gpt/model.hpp (the model)  forward and backward of a decoder-only transformer in plain loops
//                              with OpenMP, as llm.c's CPU trainer: it computes in float.
//   this file (the engine)     keeps the weights in the precision's type (float, mpopt::half or
//                              mpopt::bfloat16) in its own tensor type, gpt_tensor, which mpopt
//                              reads through mpopt::tensor_traits; widens them into the model
//                              before each forward; and stores each gradient, times the loss scale,
//                              as soon as backward finishes it, telling the optimizer (grad_ready).
//   opt.step() (mpopt)         averages over micro-steps and ranks, skips the step if fp16
//                              overflowed, clips to a global norm of 1, runs AdamW (or LAMB, ...) on
//                              fp32 masters and rounds the result back into the weights.
//
// The optimizer is an mpopt::any_optimizer: the flags (or --config FILE, a DeepSpeed JSON) become a
// mpopt::deepspeed_config, and configured_optimizer.cpp builds the optimizer it names (with --state,
// state_optimizer.cpp builds AdamW of that state precision, mpopt::make_optimizer_as). The learning
// rate follows one of mpopt's schedules: the flags' warm-up and cosine (mpopt::cosine_with_warmup),
// or the configuration's scheduler block.

#include "configured_optimizer.hpp"
#include "flags.hpp"
#include "gpt/model.hpp"
#include "world.hpp"

#include <mpopt/convert.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unistd.h>
#include <utility>
#include <vector>

#ifndef MPOPT_GPT_DEFAULT_DATA
#define MPOPT_GPT_DEFAULT_DATA ""
#endif

// ---------------------------------------------------------------------------------------------
// The engine's own tensor type: storage it owns, of one element type. mpopt learns to read it from
// the traits below; it never sees the class otherwise.

template <class E>
struct gpt_tensor {
  std::unique_ptr<E[]> values;
  std::size_t size = 0;

  explicit gpt_tensor(std::size_t n) : values(new E[n]()), size(n) {}
  std::span<E> span() { return {values.get(), size}; }
};

template <class E>
struct mpopt::tensor_traits<gpt_tensor<E>> {
  using element_type = E;
  static E* data(gpt_tensor<E>& t) { return t.values.get(); }
  static std::size_t size(const gpt_tensor<E>& t) { return t.size; }
  static constexpr memory_space space = memory_space::host;
};

namespace {

using example::world_rank, example::world_size, example::sum_over_ranks, example::mean_over_ranks;

// ---------------------------------------------------------------------------------------------
// Text: bytes become token ids, the distinct bytes of the file in byte order.

struct corpus {
  std::vector<unsigned char> alphabet;  // token id -> byte
  std::array<int, 256> token{};          // byte -> token id, -1 where the file has none
  std::vector<int> train, validation;    // the first 90% of the file and the last 10%, held apart
};

corpus read_corpus(const std::string& path, int context) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read the text '" + path + "'");
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  corpus c;
  c.token.fill(-1);
  for (unsigned char b : text) c.token[b] = 0;
  for (int b = 0; b < 256; ++b)
    if (c.token[std::size_t(b)] == 0) {
      c.token[std::size_t(b)] = int(c.alphabet.size());
      c.alphabet.push_back(static_cast<unsigned char>(b));
    }
  const std::size_t split = text.size() - text.size() / 10;
  // Each split must hold one window of context + 1 tokens (the inputs and the next token).
  const std::size_t need = std::size_t(context) + 1;
  if (text.size() / 10 < need)
    throw std::runtime_error("the text '" + path + "' has " + std::to_string(text.size()) + " bytes; with --context " +
                             std::to_string(context) + " it needs at least " + std::to_string(10 * need) +
                             " (its last 10% is held out for validation)");
  for (std::size_t i = 0; i < text.size(); ++i)
    (i < split ? c.train : c.validation).push_back(c.token[static_cast<unsigned char>(text[i])]);
  return c;
}

// splitmix64: the same batches on every platform and rank count.
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The global batch of a step is `batch x accumulate x ranks` windows of the training text at offsets
// drawn from the seed; micro-step m on rank r trains on the (m x ranks + r)-th `batch` of them. So
// 1 rank accumulating 2 micro-batches sees what 2 ranks see in one.
void fill_batch(const std::vector<int>& text, std::uint64_t seed, int step, int micro, int batch, int t,
                std::vector<int>& inputs, std::vector<int>& targets) {
  std::uint64_t state = seed ^ (std::uint64_t(step) << 20);
  splitmix64(state);
  const std::size_t first = std::size_t(micro * world_size() + world_rank()) * std::size_t(batch);
  const std::size_t windows = text.size() - std::size_t(t);
  for (std::size_t w = 0; w < first + std::size_t(batch); ++w) {
    const std::size_t at = splitmix64(state) % windows;
    if (w < first) continue;
    const std::size_t row = (w - first) * std::size_t(t);
    std::copy_n(text.begin() + std::ptrdiff_t(at), t, inputs.begin() + std::ptrdiff_t(row));
    std::copy_n(text.begin() + std::ptrdiff_t(at + 1), t, targets.begin() + std::ptrdiff_t(row));
  }
}

// ---------------------------------------------------------------------------------------------
// Flags

#if MPOPT_EXAMPLE_MUON
constexpr bool with_muon = true;
#else
constexpr bool with_muon = false;
#endif

struct config {
  std::string data = MPOPT_GPT_DEFAULT_DATA;
  std::string precision = "fp16";
  std::string rule = "adam";
  std::string state = "fp32";  // how Adam's moments are stored
  int zero = 0;
  bool overlap = false;
  gpt::shape shape;  // vocab comes from the text
  int steps = 400;
  int schedule_steps = -1;  // the schedule's length: --steps unless given
  int batch = 16;
  int accumulate = 1;
  double lr = 2e-3;
  double muon_lr = 0.02;
  double weight_decay = 0.1;
  double clip = 1.0;
  int warmup = 20;
  std::uint64_t seed = 1;
  int eval_every = 100;
  int eval_windows = 64;
  int print_every = 20;
  int sample = 300;
  std::string prompt = "And God said";
  std::string csv, load, save, config_file;
  std::vector<std::string> given;
};

constexpr std::string_view usage = R"(usage: train_gpt [options]

Trains a character-level GPT (token and position embeddings, pre-LayerNorm blocks of causal
self-attention and a GELU MLP, tied output weights) on a text file, with mixed precision and the
optimizer on every rank, then prints a sample of generated text.

  --data FILE                   the text (default: the King James Bible, which the build makes
                                from Debian's bible-kjv; any UTF-8 or ASCII file will do). Its
                                last 10% is the validation split
  --precision fp16|bf16|fp32    parameter and gradient type (default fp16, with a dynamic loss
                                scale starting at 2^16, as DeepSpeed's)
  --rule adam|lamb|onebit_adam|onebit_lamb|zero_one_adam|muon
                                the update rule (default adam: AdamW). The compressing rules
                                warm up for 20% of the steps, and need --zero 0. muon: Muon for
                                the blocks' matrices (--muon-lr), AdamW for the embeddings, biases
                                and LayerNorm parameters, in one optimizer (mpopt::rules); needs
                                --precision bf16 and --zero 0, and a build with a CBLAS
  --muon-lr X                   Muon's peak learning rate under --rule muon (default 0.02),
                                scheduled as --lr is
  --state fp32|bf16|blockwise8|blockwise4
                                how AdamW's moments are stored (default fp32): in bf16, or in
                                8-bit or 4-bit codes with a scale per block. Other than fp32,
                                the fp32 master is stored as the bf16 weight and its 16-bit
                                remainder; needs bf16, AdamW and no ZeRO (flags or --config)
  --zero 0|1|2                  under mpirun: replicated, ZeRO-1 or ZeRO-2 (default 0)
  --overlap on|off              reduce gradients during backward as tensors finish, and gather the
                                updated parameters during the next forward (default off)
  --accumulate K                micro-batches per optimizer step (default 1)
  --config FILE                 the optimizer from a DeepSpeed JSON configuration instead: it
                                decides what --precision, --rule, --zero, --overlap, --lr,
                                --weight-decay, --clip and --accumulate decide, so those are
                                refused; and the schedule, where it has a scheduler block
                                (WarmupLR, WarmupDecayLR, WarmupCosineLR or OneCycle)
  --layers L --heads H --width C --context T
                                the model (default 4, 4, 128, 64)
  --batch B                     sequences per rank and micro-batch (default 16)
  --steps N                     optimizer steps (default 400); after --load, N more, numbered on
                                from the checkpoint's applied steps, with the batches an
                                uninterrupted run would have drawn
  --schedule-steps N            the schedule's length: the cosine reaches a tenth of --lr at step
                                N (default: --steps). A run of N steps cut in two: --steps K
                                --schedule-steps N --save F, then --load F --steps N-K (the
                                schedule is then F's)
  --lr X                        peak learning rate, after a linear warm-up, decaying by a cosine
                                to a tenth of it at the last step (default 2e-3; counted in
                                applied steps: a skipped fp16 step does not advance it)
  --warmup N                    warm-up steps (default 20)
  --clip X                      clip the gradient to this global L2 norm (default 1; 0: never)
  --weight-decay X              on the embeddings and the linear weights (default 0.1); biases and
                                LayerNorm parameters have none
  --seed S                      initial weights and batches (default 1)
  --eval-every N                validation loss every N steps, and at the end (default 100)
  --eval-windows N              validation windows of --context characters (default 64)
  --print-every N               a progress line every N steps when the output is not a terminal
                                (default 20; 0: none); a terminal sees one line updated in place
  --csv FILE                    step,loss,val_loss,lr,loss_scale,skipped,tokens_per_s,seconds per
                                step (seconds: training time so far, evaluation apart)
  --sample N                    characters to generate at the end (default 300; 0: none)
  --prompt TEXT                 where the sample starts (default "And God said")
  --load FILE / --save FILE     a checkpoint (mpopt's, with every tensor's name and shape) before
                                the first step / after the last
  --help                        this text
)";

using example::usage_error, example::parse_number, example::check_choice;

bool parse_args(int argc, char** argv, config& c) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "--help" || flag == "-h") return false;
    if (!flag.starts_with("--") || i + 1 >= argc)
      throw usage_error{flag.starts_with("--") ? flag + " needs a value" : "unexpected argument '" + flag + "'"};
    value = argv[++i];
    c.given.push_back(flag);
    if (flag == "--data") c.data = value;
    else if (flag == "--precision") c.precision = check_choice(flag, value, {"fp16", "bf16", "fp32"});
    else if (flag == "--rule")
      c.rule = check_choice(flag, value, {"adam", "lamb", "onebit_adam", "onebit_lamb", "zero_one_adam", "muon"});
    else if (flag == "--state") c.state = check_choice(flag, value, {"fp32", "bf16", "blockwise8", "blockwise4"});
    else if (flag == "--zero") c.zero = std::stoi(check_choice(flag, value, {"0", "1", "2"}));
    else if (flag == "--overlap") c.overlap = check_choice(flag, value, {"on", "off"}) == "on";
    else if (flag == "--accumulate") c.accumulate = parse_number<int>(flag, value, 1);
    else if (flag == "--config") c.config_file = value;
    else if (flag == "--layers") c.shape.layers = parse_number<int>(flag, value, 1);
    else if (flag == "--heads") c.shape.heads = parse_number<int>(flag, value, 1);
    else if (flag == "--width") c.shape.width = parse_number<int>(flag, value, 1);
    else if (flag == "--context") c.shape.context = parse_number<int>(flag, value, 1);
    else if (flag == "--batch") c.batch = parse_number<int>(flag, value, 1);
    else if (flag == "--steps") c.steps = parse_number<int>(flag, value, 0);
    else if (flag == "--schedule-steps") c.schedule_steps = parse_number<int>(flag, value, 0);
    else if (flag == "--lr") c.lr = parse_number<double>(flag, value, 0);
    else if (flag == "--muon-lr") c.muon_lr = parse_number<double>(flag, value, 0);
    else if (flag == "--warmup") c.warmup = parse_number<int>(flag, value, 0);
    else if (flag == "--weight-decay") c.weight_decay = parse_number<double>(flag, value, 0);
    else if (flag == "--clip") c.clip = parse_number<double>(flag, value, 0);
    else if (flag == "--seed") c.seed = parse_number<std::uint64_t>(flag, value, 0);
    else if (flag == "--eval-every") c.eval_every = parse_number<int>(flag, value, 1);
    else if (flag == "--eval-windows") c.eval_windows = parse_number<int>(flag, value, 1);
    else if (flag == "--print-every") c.print_every = parse_number<int>(flag, value, 0);
    else if (flag == "--csv") c.csv = value;
    else if (flag == "--sample") c.sample = parse_number<int>(flag, value, 0);
    else if (flag == "--prompt") c.prompt = value;
    else if (flag == "--load") c.load = value;
    else if (flag == "--save") c.save = value;
    else throw usage_error{"unknown option '" + flag + "'"};
  }
  if (c.shape.width % c.shape.heads != 0)
    throw usage_error{"--width " + std::to_string(c.shape.width) + " must be a multiple of --heads " +
                      std::to_string(c.shape.heads)};
  if (c.zero > 0 && !example::with_mpi) throw usage_error{"--zero needs the MPI build (under mpirun)"};
  if (!c.config_file.empty())
    for (std::string_view f : {"--precision", "--rule", "--zero", "--overlap", "--lr", "--weight-decay", "--clip", "--accumulate"})
      if (std::ranges::find(c.given, f) != c.given.end())
        throw usage_error{std::string(f) + " conflicts with --config: the configuration decides it"};
  if (c.state != "fp32" && c.config_file.empty() && (c.precision != "bf16" || c.rule != "adam" || c.zero != 0))
    throw usage_error{"--state " + c.state + " needs --precision bf16, --rule adam and --zero 0"};
  if (c.rule == "muon" && (c.precision != "bf16" || c.zero != 0))
    throw usage_error{"--rule muon needs --precision bf16 and --zero 0"};
  if (c.rule == "muon" && !with_muon) throw usage_error{"--rule muon needs a build with a CBLAS (docs/install.md)"};
  if (c.rule != "muon" && std::ranges::find(c.given, "--muon-lr") != c.given.end())
    throw usage_error{"--muon-lr needs --rule muon"};
  if (c.data.empty())
    throw usage_error{"no text: pass --data FILE (the default, the King James Bible, is made at build time from "
                      "Debian's bible-kjv: apt-get install bible-kjv, then reconfigure)"};
  return true;
}

// The flags' schedule: a linear warm-up, then a cosine to a tenth of the peak at the last step.
mpopt::cosine_with_warmup flags_schedule(const config& c) {
  const int total = c.schedule_steps >= 0 ? c.schedule_steps : c.steps;
  return {.warmup_steps = c.warmup, .total_steps = std::max(total, c.warmup + 1), .min_ratio = 0.1};
}

// The flags as the DeepSpeed configuration they stand for, or the one --config names.
mpopt::deepspeed_config optimizer_config(const config& c) {
  if (!c.config_file.empty()) {
    mpopt::deepspeed_config ds = mpopt::deepspeed_config::read(c.config_file, world_size());
    for (std::string_view f : {"--warmup", "--schedule-steps"})
      if (ds.schedule && std::ranges::find(c.given, f) != c.given.end())
        throw usage_error{std::string(f) + " conflicts with --config: its scheduler block decides the schedule"};
    if (!ds.schedule) ds.schedule = flags_schedule(c);
    return ds;
  }
  mpopt::deepspeed_config ds;
  ds.precision = c.precision == "fp16"   ? mpopt::config_precision::fp16
                 : c.precision == "bf16" ? mpopt::config_precision::bf16
                                         : mpopt::config_precision::fp32;
  ds.scaler = c.precision == "fp16" ? mpopt::config_scaler::dynamic_scale : mpopt::config_scaler::none;
  ds.zero_stage = c.zero;
  ds.options.clip_grad = c.clip;
  ds.options.accumulation_steps = c.accumulate;
  ds.options.overlap_comm = c.overlap;
  ds.options.leave_param_gather_in_flight = c.overlap;  // load_weights() waits before each forward
  ds.options.rounding_seed = c.seed;
  // beta2 0.99: a small model sees few tokens per step (nanoGPT's character-level setting).
  const std::uint64_t freeze = std::uint64_t(std::max(1, c.steps / 5));
  ds.adam_options = {.lr = c.lr, .beta2 = 0.99, .weight_decay = c.weight_decay};
  ds.lamb_options = {.lr = c.lr, .beta2 = 0.99, .weight_decay = c.weight_decay};
  ds.onebit_adam_options = {.lr = c.lr, .beta2 = 0.99, .weight_decay = c.weight_decay, .freeze_step = freeze};
  ds.onebit_lamb_options = {.lr = c.lr, .beta2 = 0.99, .weight_decay = c.weight_decay, .freeze_step = freeze};
  ds.zero_one_adam_options = {.lr = c.lr, .beta2 = 0.99, .weight_decay = c.weight_decay, .var_freeze_step = freeze};
  set_rule(ds, c.rule == "muon" ? "adam" : c.rule);  // muon: the AdamW groups' configuration
  ds.schedule = flags_schedule(c);
  return ds;
}

// ---------------------------------------------------------------------------------------------
// The engine: the model's weights and gradients in P, registered with the optimizer.

template <class P>
struct engine {
  gpt::net<float> model;
  std::vector<gpt_tensor<P>> weights, grads;  // one of each per model tensor, in layout order
  mpopt::any_optimizer opt;
  // The optimizer numbers tensors group by group: model tensor i is its tensor optimizer_index[i].
  std::vector<std::size_t> optimizer_index;

  engine(const gpt::shape& s, const mpopt::deepspeed_config& ds, const config& c)
      : model(s), opt(make_optimizer(ds, c)) {
    // Two groups: the configuration's weight decay (--weight-decay, or the JSON's) on the
    // embeddings and linear weights, none on biases and LayerNorm parameters. Under --rule muon, a
    // third first: Muon for the blocks' matrices, with the same weight decay.
    const auto& tensors = model.tensors();
    weights.reserve(tensors.size());  // no reallocation: the optimizer keeps pointers into them
    grads.reserve(tensors.size());
    for (const auto& t : tensors) {
      weights.emplace_back(t.size);
      grads.emplace_back(t.size);
    }
    const bool muon = c.rule == "muon";
    const auto adam = muon ? std::optional<std::string>("adam") : std::nullopt;
    auto hidden = [&](const gpt::tensor_info& t) { return muon && t.decay && t.name.starts_with("h."); };
    const std::vector<std::pair<mpopt::group_settings, std::function<bool(const gpt::tensor_info&)>>> groups = {
        {{.lr = c.muon_lr, .weight_decay = ds.adam_options.weight_decay, .rule = "muon"}, hidden},
        {{.rule = adam}, [&](const gpt::tensor_info& t) { return t.decay && !hidden(t); }},
        {{.weight_decay = 0.0, .rule = adam}, [](const gpt::tensor_info& t) { return !t.decay; }}};
    optimizer_index.resize(tensors.size());
    std::size_t next = 0;
    for (const auto& [settings, takes] : groups) {
      if (!muon && settings.rule == "muon") continue;
      auto&& group = opt.add_group(settings);
      for (std::size_t i = 0; i < tensors.size(); ++i)
        if (takes(tensors[i])) {
          group.add(weights[i], grads[i], tensors[i].name, tensors[i].shape);
          optimizer_index[i] = next++;
        }
    }
  }

  static mpopt::any_optimizer make_optimizer(const mpopt::deepspeed_config& ds, const config& c) {
#if MPOPT_EXAMPLE_MUON
    if (c.rule == "muon") return make_muon_optimizer(ds);
#endif
    return c.state == "fp32" ? make_configured_optimizer(ds) : make_state_optimizer(ds, c.state);
  }

  // The model's initial weights, rounded to P: the optimizer's masters start from them.
  void initialize(std::uint64_t seed) {
    model.initialize(seed);
    for (std::size_t i = 0; i < weights.size(); ++i) narrow(model_part(model.params(), i), weights[i].span());
  }

  // The optimizer's weights into the model, before a forward.
  void load_weights() {
    opt.wait_params();  // --overlap: the last step's parameters may still be on their way
    for (std::size_t i = 0; i < weights.size(); ++i)
      widen(std::span<const P>(weights[i].span()), model_part(model.params(), i));
  }

  // Backward, storing each tensor's gradient times the loss scale as soon as it is final.
  void backward() {
    model.backward(float(opt.loss_scale()), [&](auto i) {
      narrow(model_part(model.grads(), i), grads[i].span());
      opt.grad_ready(optimizer_index[i]);
    });
  }

  // Tensor i's part of the model's flat parameters or gradients.
  std::span<float> model_part(std::span<float> flat, std::size_t i) const {
    return flat.subspan(model.tensors()[i].offset, model.tensors()[i].size);
  }

  static void widen(std::span<const P> in, std::span<float> out) {
    if constexpr (std::is_same_v<P, float>) std::ranges::copy(in, out.begin());
    else mpopt::convert(in, out);
  }
  static void narrow(std::span<const float> in, std::span<P> out) {
    if constexpr (std::is_same_v<P, float>) std::ranges::copy(in, out.begin());
    else mpopt::convert(in, out);  // beyond fp16's range becomes inf: an overflow the scaler handles
  }
};

// ---------------------------------------------------------------------------------------------
// What a person sees.

struct clock_split {  // seconds spent in each part of the training steps
  double forward = 0, backward = 0, step = 0, total = 0;
};

using steady = std::chrono::steady_clock;
double seconds_since(steady::time_point t) { return std::chrono::duration<double>(steady::now() - t).count(); }

std::string duration(double s) {
  char buf[32];
  const int m = int(s) / 60;
  std::snprintf(buf, sizeof buf, "%d:%02d", m, int(s) - 60 * m);
  return buf;
}

// Mean validation loss over the same windows on any rank count: window w starts at w/(n-1) of the
// way through the split, and rank r evaluates windows r, r + ranks, ...
double validation_loss(gpt::net<float>& model, const corpus& text, const config& c) {
  const int t = c.shape.context;
  const std::size_t last = text.validation.size() - std::size_t(t) - 1;
  std::vector<int> inputs(static_cast<std::size_t>(t)), targets(inputs.size());
  double sum = 0;
  for (int w = world_rank(); w < c.eval_windows; w += world_size()) {
    const std::size_t at = c.eval_windows == 1 ? 0 : last * std::size_t(w) / std::size_t(c.eval_windows - 1);
    std::copy_n(text.validation.begin() + std::ptrdiff_t(at), t, inputs.begin());
    std::copy_n(text.validation.begin() + std::ptrdiff_t(at + 1), t, targets.begin());
    sum += model.forward(inputs, targets, 1, t);
  }
  return sum_over_ranks(sum) / c.eval_windows;
}

// Characters drawn one at a time from the model's softmax, from the prompt on.
std::string generate(gpt::net<float>& model, const corpus& text, const config& c) {
  std::vector<int> tokens;
  for (unsigned char b : c.prompt)
    if (text.token[b] >= 0) tokens.push_back(text.token[b]);
  if (tokens.empty()) tokens.push_back(0);
  std::string out(c.prompt);
  std::uint64_t state = c.seed * 7919;
  for (int n = 0; n < c.sample; ++n) {
    const int t = std::min<int>(int(tokens.size()), c.shape.context);
    model.forward(std::span<const int>(tokens).last(std::size_t(t)), {}, 1, t);
    const auto logits = model.logits(0, t - 1);
    const float top = *std::ranges::max_element(logits);
    std::vector<double> p(logits.size());
    double total = 0;
    for (std::size_t v = 0; v < p.size(); ++v) total += p[v] = std::exp(double(logits[v] - top));
    double u = double(splitmix64(state) >> 11) * 0x1p-53 * total;
    std::size_t v = 0;
    while (v + 1 < p.size() && (u -= p[v]) > 0) ++v;
    tokens.push_back(int(v));
    out += char(text.alphabet[v]);
  }
  return out;
}

template <class P>
int train(const config& c, const corpus& text, const mpopt::deepspeed_config& ds) {
  const bool speaker = world_rank() == 0;
  const bool terminal = speaker && isatty(fileno(stdout));
  gpt::shape shape = c.shape;
  shape.vocab = int(text.alphabet.size());
  engine<P> e(shape, ds, c);
  e.initialize(c.seed);
  if (!c.load.empty()) e.opt.load(c.load);  // the schedule too, where the file has one
  // Steps are numbered on from a loaded checkpoint's, so that a run cut in two draws the batches
  // of the uninterrupted one. (Its applied steps: under fp16, a skipped step's batch is redrawn.)
  const int first = int(e.opt.group(0).step()), last = first + c.steps;
  const int accumulate = int(ds.options.accumulation_steps);
  const int batch = ds.micro_batch_size > 0 && !c.config_file.empty() ? ds.micro_batch_size : c.batch;
  const std::size_t n_params = e.model.params().size();
  if (speaker) {
    std::printf("model: %d layers, %d heads, width %d, context %d, vocabulary %d: %.2fM parameters\n", shape.layers,
                shape.heads, shape.width, shape.context, shape.vocab, double(n_params) / 1e6);
    std::printf("text: %s, %zu characters for training, %zu held out\n", c.data.c_str(), text.train.size(),
                text.validation.size());
    std::string optimizer = ds.summary();
    if (c.state != "fp32") optimizer += ", moments " + c.state + ", master remainder16";
    if (c.rule == "muon") {
      char lr[32];
      std::snprintf(lr, sizeof lr, "%g", c.muon_lr);
      optimizer += "; Muon for the blocks' matrices (lr " + std::string(lr) + ")";
    }
    std::printf("optimizer: %s; %d sequences x %d micro-steps x %d rank(s) = %d tokens per step\n", optimizer.c_str(),
                batch, accumulate, world_size(), batch * accumulate * world_size() * shape.context);
  }

  std::FILE* csv = speaker && !c.csv.empty() ? std::fopen(c.csv.c_str(), "w") : nullptr;
  if (mean_over_ranks(speaker && !c.csv.empty() && !csv ? 1 : 0) > 0) throw std::runtime_error("cannot write " + c.csv);
  if (csv) std::fprintf(csv, "step,loss,val_loss,lr,loss_scale,skipped,tokens_per_s,seconds\n");

  const int t = shape.context;
  std::vector<int> inputs(std::size_t(batch) * std::size_t(t)), targets(inputs.size());
  const double tokens_per_step = double(batch) * accumulate * world_size() * t;
  e.load_weights();
  const double initial_val = validation_loss(e.model, text, c);
  double val = initial_val, train_loss = 0;
  if (speaker) std::printf("step %5d/%d | validation loss %.4f\n", first, last, val);
  if (csv) std::fprintf(csv, "%d,,%.9g,0,%.0f,0,0,0\n", first, val, e.opt.loss_scale());  // before any step
  clock_split time;
  mpopt::step_status status;
  for (int step = first + 1; step <= last; ++step) {
    const auto step_start = steady::now();
    double loss = 0;
    for (int micro = 0; micro < accumulate; ++micro) {
      fill_batch(text.train, c.seed, step, micro, batch, t, inputs, targets);
      auto start = steady::now();
      e.load_weights();
      loss += e.model.forward(inputs, targets, batch, t) / accumulate;
      time.forward += seconds_since(start);
      start = steady::now();
      e.backward();
      time.backward += seconds_since(start);
      start = steady::now();
      status = e.opt.step();
      time.step += seconds_since(start);
    }
    const double step_seconds = seconds_since(step_start);
    time.total += step_seconds;
    train_loss = mean_over_ranks(loss);
    const bool evaluate = step % c.eval_every == 0 || step == last;
    if (evaluate) {
      e.load_weights();
      val = validation_loss(e.model, text, c);
    }
    const double tokens_per_s = tokens_per_step * (step - first) / time.total;
    if (csv) {
      std::fprintf(csv, "%d,%.9g,", step, train_loss);
      if (evaluate) std::fprintf(csv, "%.9g", val);
      std::fprintf(csv, ",%.6g,%.0f,%llu,%.1f,%.3f\n", e.opt.group(0).lr(), e.opt.loss_scale(),
                   static_cast<unsigned long long>(status.skipped_steps), tokens_per_s, time.total);
    }
    const bool line = c.print_every > 0 && (step % c.print_every == 0 || evaluate);
    if (speaker && (terminal || line)) {
      // One line updated in place on a terminal (kept when it shows a new validation loss);
      // plain lines in a log.
      std::printf("%sstep %5d/%d | loss %.4f | val %.4f | %6.0f tok/s | scale %-6g | skipped %llu | ETA %s%s",
                  terminal ? "\r\033[K" : "", step, last, train_loss, val, tokens_per_s, e.opt.loss_scale(),
                  static_cast<unsigned long long>(status.skipped_steps),
                  duration(time.total / (step - first) * (last - step)).c_str(), terminal && !evaluate ? "" : "\n");
      std::fflush(stdout);
    }
  }
  if (csv) std::fclose(csv);
  if (!c.save.empty()) {
    e.opt.finalize();  // with --steps 0: the state before any step
    e.opt.save(c.save);
    if (speaker) std::printf("saved %s\n", c.save.c_str());
  }
  if (speaker) {
    std::printf("validation loss %.4f -> %.4f, training loss %.4f, after %d steps in %.1f s (%.0f tokens/s, %llu skipped)\n",
                initial_val, val, train_loss, c.steps, time.total, c.steps ? tokens_per_step * c.steps / time.total : 0.0,
                static_cast<unsigned long long>(status.skipped_steps));
    std::printf("the optimizer's own memory on this rank: %.2f bytes per parameter (memory_report)\n",
                double(e.opt.memory_report().owned_bytes()) / double(n_params));
    if (time.total > 0)
      std::printf("time per step: forward %.0f%%, backward %.0f%%, opt.step() %.1f%%, batches and the rest %.1f%%\n",
                  100 * time.forward / time.total, 100 * time.backward / time.total, 100 * time.step / time.total,
                  100 * (time.total - time.forward - time.backward - time.step) / time.total);
    if (c.sample > 0) {
      e.load_weights();
      std::printf("sample:\n%s\n", generate(e.model, text, c).c_str());
    }
  }
  // Exit status: did training help? (Not asked of --steps 0.)
  return c.steps == 0 || val < initial_val ? 0 : 1;
}

int run(const config& c) {
  const corpus text = read_corpus(c.data, c.shape.context);
  const mpopt::deepspeed_config ds = optimizer_config(c);
  switch (ds.precision) {
    case mpopt::config_precision::fp16: return train<mpopt::half>(c, text, ds);
    case mpopt::config_precision::bf16: return train<mpopt::bfloat16>(c, text, ds);
    case mpopt::config_precision::fp32: break;
  }
  return train<float>(c, text, ds);
}

int train_main(int argc, char** argv) {
  config c;
  try {
    if (!parse_args(argc, argv, c)) {
      if (world_rank() == 0) std::fputs(usage.data(), stdout);
      return 0;
    }
    return run(c);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "train_gpt: %s (see --help)\n", e.message.c_str());
    return 2;
  } catch (const mpopt::error& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
  }
  return 1;
}

}  // namespace

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
