// Shared by the suites of the compressing rules on W MPI ranks (mpi_onebit.cpp: 1-bit LAMB,
// mpi_onebit_adam.cpp: 1-bit Adam, mpi_zero_one_adam.cpp: 0/1 Adam): tensors of a few sizes,
// gradients with a part every rank shares and noise of each rank's own, a model over one group, a
// communicator that misdelivers, and the checks every compressing rule must pass.
#pragma once

#include <doctest/doctest.h>

#include "error_of.hpp"
#include "mpi_harness.hpp"
#include "threads.hpp"

namespace {

const std::vector<std::size_t> onebit_sizes{1, 13, 70001, 2000};

/// Rank r's true gradient at step s: a part all ranks share plus noise of their own. With
/// `silent`, tensor 1's gradient is zero throughout (a frozen layer): its momentum stays zero.
grads_t local_gradient(int step, int rank, bool silent = false) {
  const std::uint64_t shared = key_prefix(0x1B, std::uint64_t(step), 0),
                      own = key_prefix(0x1B, std::uint64_t(step), std::uint64_t(rank) + 1);
  grads_t g(onebit_sizes.size());
  for (std::size_t i = 0; i < onebit_sizes.size(); ++i) {
    const double f = silent && i == 1 ? 0.0 : i == 2 ? 0.01 : 0.1;
    g[i].resize(onebit_sizes[i]);
    for (std::size_t k = 0; k < onebit_sizes[i]; ++k)
      g[i][k] = f * (unit(mix(shared ^ (k + 7 * i))) + 0.7 * unit(mix(own ^ (k + 7 * i))));
  }
  return g;
}

/// The index of tensor i's element 0 among all of onebit_sizes.
inline std::size_t flat_index(std::size_t i) {
  std::size_t at = 0;
  for (std::size_t j = 0; j < i; ++j) at += onebit_sizes[j];
  return at;
}

/// The compression options of a step-by-step test: per-tensor scales with the elements of zero
/// variance excluded, or DeepSpeed's one scale over every tensor with nothing excluded.
template <class Options>
Options compressing(Options o, bool per_tensor) {
  o.compression = {.exclude_zero_variance = per_tensor,
                   .scale = per_tensor ? mpopt::compression_scale::per_tensor : mpopt::compression_scale::global};
  return o;
}

/// Tensor 3's exp_avg_mask in the tests: every third element 0.
inline std::vector<float> test_mask() {
  std::vector<float> mask(onebit_sizes[3]);
  for (std::size_t k = 0; k < mask.size(); ++k) mask[k] = k % 3 == 0 ? 0.0f : 1.0f;
  return mask;
}

/// With per-tensor compression, tensor 3's test_mask on the library (which it finalizes) and the
/// reference, and the reference's exclusion of zero variance as the options say.
template <class Opt, class Ref>
void keep_alike(Opt& opt, Ref& ref, bool per_tensor) {
  opt.finalize();
  ref.kept.exclude_zero_variance = per_tensor;
  ref.kept.ratio = mpopt::compression_options{}.zero_variance_ratio;
  if (!per_tensor) return;
  opt.set_exp_avg_mask(3, test_mask());
  const std::size_t at = flat_index(3);
  ref.kept.mask.assign(flat_index(onebit_sizes.size()), 1);
  const auto mask = test_mask();
  for (std::size_t k = 0; k < mask.size(); ++k) ref.kept.mask[at + k] = mask[k] != 0.0f;
}

/// An optimizer over one group of onebit_sizes tensors, parameters from a fixed seed.
template <class Opt>
struct model {
  using P = typename Opt::param_type;
  using G = typename Opt::grad_type;
  Opt opt;
  std::vector<std::vector<P>> p;
  std::vector<std::vector<G>> g;

  template <class... A>
  model(const typename Opt::group_options& o, A&&... args) : opt(std::forward<A>(args)...) {
    auto& group = opt.add_group(o);
    for (std::size_t i = 0; i < onebit_sizes.size(); ++i) {
      p.emplace_back(onebit_sizes[i]);
      g.emplace_back(onebit_sizes[i]);
      for (std::size_t k = 0; k < p[i].size(); ++k) p[i][k] = to<P>(0.5 * unit(key(0xA1, i, k, 3)));
    }
    for (std::size_t i = 0; i < p.size(); ++i) group.add(p[i], g[i], std::string("t") + std::to_string(i));
  }
  /// Writes the gradient (times the loss scale) and returns what the optimizer reads, unscaled.
  grads_t write(const grads_t& truth) {
    grads_t seen;
    const double s = opt.loss_scale();
    for (std::size_t i = 0; i < truth.size(); ++i) {
      seen.emplace_back();
      for (std::size_t k = 0; k < truth[i].size(); ++k) {
        g[i][k] = to<G>(truth[i][k] * s);
        seen.back().push_back(double(float(g[i][k])) / s);
      }
    }
    return seen;
  }
  std::vector<std::vector<double>> initial() const {
    std::vector<std::vector<double>> out;
    for (const auto& t : p) {
      out.emplace_back();
      for (auto x : t) out.back().push_back(double(float(x)));
    }
    return out;
  }
  /// Masters, the rule's state, parameters, LAMB's coefficients and this rank's errors, as bits.
  std::vector<std::uint32_t> state_bits() const {
    std::vector<std::uint32_t> out;
    for (std::size_t i = 0; i < p.size(); ++i) {
      append_bits(out, p[i]);
      append_bits(out, opt.master(i));
      for (std::size_t k = 0; k < Opt::rule::state.size(); ++k) append_bits(out, opt.moment(k, i));
    }
    if constexpr (requires { opt.lamb_coeffs(); })
      for (double c : opt.lamb_coeffs()) out.push_back(std::uint32_t(std::bit_cast<std::uint64_t>(c) >> 20));
    if (world_size() > 1) {
      append_bits(out, opt.compression().worker_error());
      append_bits(out, opt.compression().server_error());
    }
    return out;
  }
};

/// Delivers the all-to-all's blocks to the wrong ranks (rotated by one).
struct misdelivering_mpi : mpopt::mpi {
  using mpopt::mpi::mpi;
  static constexpr std::string_view name = "misdelivering_mpi";
  using mpopt::mpi::all_to_all;
  void all_to_all(std::span<const std::uint8_t> in, std::span<std::uint8_t> out) {
    mpopt::mpi::all_to_all(in, out);
    std::rotate(out.begin(), out.begin() + 1, out.end());
  }
};
static_assert(mpopt::communicator<misdelivering_mpi>);

/// The compression stage's traffic: a step hands the communicator at most 1/16 of the bytes of an
/// fp32 all-reduce of the parameters (the compressed exchange, the overflow flag and the norm);
/// warm-up all-reduces the gradients. `o` compresses from step 4 on.
template <class Rule>
void check_compressed_traffic(const typename Rule::options& o) {
  using opt_t = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, Rule, test_backend, counting_mpi>;
  const int w = world_size(), rank = world_rank();
  CAPTURE(w);
  REQUIRE(o.freeze_step == 3);
  model<opt_t> m(o, counting_mpi{MPI_COMM_WORLD});
  m.opt.finalize();  // its own collectives (layout check, preflight) are not a step's
  std::size_t params = 0;
  for (std::size_t n : onebit_sizes) params += n;
  const double fp32_allreduce = 4.0 * double(params);
  for (int s = 0; s < 6; ++s) {
    CAPTURE(s);
    m.write(local_gradient(s, rank));
    auto& comm = m.opt.communicator();
    const std::size_t before = comm.bytes;
    const auto st = m.opt.step();
    const std::size_t bytes = comm.bytes - before;
    CHECK(st.comm_bytes == bytes);
    CHECK(st.comm_ratio == doctest::Approx(double(bytes) / fp32_allreduce));
    if (s < 3) {
      CHECK(st.compression_step == 0);
      if (w > 1) CHECK(double(bytes) >= fp32_allreduce);  // warm-up: the fp32 gradient all-reduce
    } else {
      CHECK(st.compression_step == 4);
      CHECK(double(bytes) <= fp32_allreduce / 16);
      if (w > 1) CHECK(bytes == m.opt.compression().bytes_per_exchange() + 1 + 8);  // + overflow flag and norm
      if (rank == 0 && s == 5)
        MESSAGE("W " << w << ": " << Rule::title << "'s compression stage hands " << bytes << " bytes per step, "
                     << st.comm_ratio << " of an fp32 all-reduce (" << fp32_allreduce << " bytes); the bound is 1/16");
    }
  }
}

/// fp16 with the dynamic scaler: an overflow on one rank in the compression stage (from step 3 of
/// `o`) skips the step on every rank, leaving parameters, moments and error buffers bit-identical.
template <class Rule>
void check_overflow_skips(const typename Rule::options& o) {
  using opt_t = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::replicated, Rule, test_backend, mpopt::mpi>;
  const int w = world_size(), rank = world_rank();
  CAPTURE(w);
  REQUIRE(o.freeze_step == 2);
  model<opt_t> m(o, mpopt::mpi{MPI_COMM_WORLD}, mpopt::optimizer_options{},
                 mpopt::dynamic_scale_options{.init_scale = 1024, .hysteresis = 1});
  for (int s = 0; s < 4; ++s) {
    m.write(local_gradient(s, rank));
    CHECK(m.opt.step().applied);
  }
  const auto before = m.state_bits();
  const double scale = m.opt.loss_scale();
  auto g = local_gradient(4, rank);
  if (rank == w - 1) g[2][12345] = 1e5 / scale;  // overflows fp16 on this rank only
  m.write(g);
  const auto st = m.opt.step();
  CHECK(st.result == mpopt::step_result::skipped_nonfinite);
  CHECK(st.compression_step == 3);
  CHECK(m.opt.loss_scale() == scale / 2);
  CHECK(m.state_bits() == before);
  m.write(local_gradient(5, rank));
  CHECK(m.opt.step().applied);
}

/// Tensor i of every rank, concatenated in rank order.
[[maybe_unused]] std::vector<float> from_every_rank(std::span<const float> mine) {
  std::vector<float> all(mine.size() * std::size_t(world_size()));
  MPI_Allgather(mine.data(), int(mine.size()), MPI_FLOAT, all.data(), int(mine.size()), MPI_FLOAT, MPI_COMM_WORLD);
  return all;
}

/// Rank r's part of from_every_rank's result, as doubles.
[[maybe_unused]] std::vector<double> part(const std::vector<float>& all, std::size_t r, std::size_t n) {
  return {all.begin() + std::ptrdiff_t(r * n), all.begin() + std::ptrdiff_t((r + 1) * n)};
}

/// The simulated compressed all-reduce `sim` (onebit_reference.hpp) holding every rank's error
/// buffers as the library has them, its ties cleared: the reference's step starts where the
/// library's does.
template <class Sim, class Opt>
void start_from(Sim& sim, const Opt& opt) {
  if (world_size() > 1) {
    const auto we = from_every_rank(opt.compression().worker_error());
    const auto se = from_every_rank(opt.compression().server_error());
    for (std::size_t r = 0; r < std::size_t(world_size()); ++r) {
      sim.worker_error[r] = part(we, r, sim.padded);
      sim.server_error[r] = part(se, r, sim.chunk);
    }
  }
  sim.tie.assign(sim.padded, 0);  // ties of this step only
}

/// Steps s0..s1-1 of local_gradient on this rank; every step must apply.
template <class M>
void train_steps(M& m, int s0, int s1) {
  for (int s = s0; s < s1; ++s) {
    m.write(local_gradient(s, world_rank()));
    CHECK(m.opt.step().applied);
  }
}

/// Saves `a` (trained up to step `at`) to `path`, loads the file into `b` (other options: the file's
/// win) and steps both on the same gradients up to `end`: the same state bits after the load and
/// after every step.
template <class Opt>
void check_resume(model<Opt>& a, model<Opt>& b, const std::filesystem::path& path, int at, int end) {
  const int rank = world_rank();
  a.opt.save(path);
  b.opt.load(path);
  CHECK(b.state_bits() == a.state_bits());
  for (int s = at; s < end; ++s) {
    CAPTURE(s);
    a.write(local_gradient(s, rank));
    b.write(local_gradient(s, rank));
    const auto sa = a.opt.step(), sb = b.opt.step();
    CHECK(sa.compression_step == sb.compression_step);
    CHECK(b.state_bits() == a.state_bits());
  }
}

/// A checkpoint saved in the compression stage on every rank, loaded on half of them (when that is
/// still more than one): refused, changing nothing, then accepted with reset_compression_errors.
template <class Opt>
void check_other_world(const std::filesystem::path& path, const typename Opt::group_options& o, int next_step) {
  if (world_size() < 4) return;
  const int rank = world_rank();
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &sub);
  {
    model<Opt> c(o, mpopt::mpi{sub});
    c.opt.finalize();
    const auto before = c.state_bits();
    std::string message;
    try {
      c.opt.load(path);
    } catch (const mpopt::error& e) {
      message = e.what();
    }
    CHECK(message.find("reset_compression_errors") != std::string::npos);
    CHECK(c.state_bits() == before);
    c.opt.load(path, {.reset_compression_errors = true});
    for (float e : c.opt.compression().worker_error()) CHECK(e == 0.0f);
    c.write(local_gradient(next_step, rank));
    CHECK(c.opt.step().applied);
  }
  MPI_Comm_free(&sub);
}

/// Tensor 1's gradient is 0 throughout (local_gradient's `silent`), so its variance is 0 when
/// compression starts, and one scale serves every tensor. Without exclude_zero_variance its average
/// is ±that scale (a 1-bit code has no zero) and it moves by about lr s / eps a step; with it (the
/// default) it moves by weight decay alone. Every rank ends with the same parameters.
template <class Rule>
void check_zero_variance_excluded(typename Rule::options o, int steps) {
  using opt_t = mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, Rule, test_backend, mpopt::mpi>;
  if (world_size() == 1) return;  // nothing is compressed
  o.compression.scale = mpopt::compression_scale::global;
  for (bool exclude : {false, true}) {
    CAPTURE(exclude);
    o.compression.exclude_zero_variance = exclude;
    model<opt_t> m(o, mpopt::mpi{MPI_COMM_WORLD}, mpopt::optimizer_options{.clip_grad = 0});
    const auto start = m.initial();
    for (int s = 0; s < steps; ++s) {
      m.write(local_gradient(s, world_rank(), true));
      CHECK(m.opt.step().applied);
    }
    double moved = 0;
    for (std::size_t k = 0; k < onebit_sizes[1]; ++k) moved = std::max(moved, std::abs(double(m.p[1][k]) - start[1][k]));
    if (exclude) CHECK(moved <= steps * o.lr * o.weight_decay * 0.5 * 1.001);  // |p| <= 0.5
    else CHECK(moved > 1.0);
    std::vector<std::uint32_t> mine;
    append_bits(mine, m.p[1]);
    std::vector<std::uint32_t> first = mine;
    MPI_Bcast(first.data(), int(first.size()), MPI_UINT32_T, 0, MPI_COMM_WORLD);
    CHECK(first == mine);
  }
}

/// set_exp_avg_mask refuses, on every rank and changing nothing, a mask of the wrong size, a value
/// other than 0 or 1 (on one rank), masks that differ between ranks, and a tensor that does not exist.
template <class Rule>
void check_mask_refusals(const typename Rule::options& o) {
  using opt_t = mpopt::optimizer<mpopt::fp32, mpopt::no_scaling, mpopt::replicated, Rule, test_backend, mpopt::mpi>;
  const int rank = world_rank();
  model<opt_t> m(o, mpopt::mpi{MPI_COMM_WORLD});
  train_steps(m, 0, 2);
  const auto before = m.state_bits();
  auto mask = test_mask();
  CHECK(error_of([&] { m.opt.set_exp_avg_mask(3, std::vector<float>(5, 1.0f)); }).find("5 values for tensor 't3' of 2000") !=
        std::string::npos);
  for (float bad : {0.5f, -1.0f, std::numeric_limits<float>::quiet_NaN()}) {
    auto wrong = mask;
    if (rank == 0) wrong[7] = bad;
    const auto message = error_of([&] { m.opt.set_exp_avg_mask(3, wrong); });
    CHECK(message.find(rank == 0 ? "a mask holds 0 or 1" : "failed on rank 0") != std::string::npos);
  }
  if (world_size() > 1) {
    auto other = mask;
    if (rank == 1) other[4] = 1.0f - other[4];
    CHECK(error_of([&] { m.opt.set_exp_avg_mask(3, other); }).find("the ranks' masks differ") != std::string::npos);
  }
  CHECK(error_of([&] { m.opt.set_exp_avg_mask(9, mask); }).find("no tensor 9") != std::string::npos);
  CHECK(m.state_bits() == before);
  m.opt.set_exp_avg_mask(3, mask);
  train_steps(m, 2, 3);
}

}  // namespace
