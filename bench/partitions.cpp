// Memory, traffic and step time per rank under each partition, for the weight matrices of a small
// GPT (protocol and fields: bench/README.md). Run under MPI:
//
//   mpirun -np W partitions [--steps S] [--quick]
//
// The model: L blocks of d = 512 (qkv 512 x 1536, proj 512 x 512, fc 512 x 2048, fc2 2048 x 512;
// L = 4, or 1 with --quick), bf16 parameters with fp32 masters. AdamW under replicated, zero1, zero2
// and layerwise; Muon (bf16 iteration) under the same four (zero1 and zero2 lay its matrices out as
// layerwise does, whole and balanced by their cost). Per configuration and rank, one line: the
// optimizer's bytes (memory_report), its state (masters and moments), the bytes it sent per step,
// the median step time over S steps, and the share of Muon's orthogonalization cost (matrix_cost)
// whose tensors the rank holds.
#define OMPI_SKIP_MPICXX 1  // Open MPI's deprecated C++ bindings: the C API only
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <mpopt/mpi.hpp>
#include <mpopt/muon.hpp>
#include <mpopt/mpopt.hpp>

namespace {

struct shape {
  std::size_t rows, cols;
};

std::vector<shape> model_shapes(int blocks) {
  std::vector<shape> s;
  for (int b = 0; b < blocks; ++b)
    for (shape m : {shape{512, 1536}, shape{512, 512}, shape{512, 2048}, shape{2048, 512}}) s.push_back(m);
  return s;
}

/// What one configuration measured on this rank.
struct measured {
  double optimizer_bytes, state_bytes, sent_bytes, step_seconds, cost_share;
};

template <class Partition, class Rule>
measured run(const std::vector<shape>& shapes, int steps) {
  using opt_t = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, Partition, Rule, mpopt::host, mpopt::mpi>;
  opt_t opt(mpopt::mpi{MPI_COMM_WORLD}, {.clip_grad = 0});
  typename Rule::options o;
  o.lr = 1e-3;
  if constexpr (std::is_same_v<Rule, mpopt::muon>) o.ns_precision = mpopt::muon::iteration_precision::bf16;
  std::vector<mpopt::tensor_spec> specs;
  for (std::size_t i = 0; i < shapes.size(); ++i)
    specs.push_back({std::string("w").append(std::to_string(i)),  // ("w" + ...: a false -Wrestrict in g++ 12)
                     shapes[i].rows * shapes[i].cols,
                     mpopt::tensor_shape{std::int64_t(shapes[i].rows), std::int64_t(shapes[i].cols)}});
  auto& g = opt.add_flat_group(o, specs);
  for (std::size_t t = 0; t < specs.size(); ++t) {
    auto p = g.param(t);
    for (std::size_t k = 0; k < p.size(); ++k) p[k] = mpopt::bfloat16(0.02f * float(int(k % 17) - 8) / 8.0f);
  }
  std::vector<double> seconds;
  double sent = 0;
  for (int s = 0; s < steps; ++s) {
    for (std::size_t t = 0; t < specs.size(); ++t) {
      auto gr = g.grad(t);
      for (std::size_t k = 0; k < gr.size(); ++k) gr[k] = mpopt::bfloat16(0.001f * float(int((k + s) % 13) - 6));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    const auto st = opt.step();
    seconds.push_back(MPI_Wtime() - start);
    sent = double(st.comm_bytes);
  }
  std::sort(seconds.begin(), seconds.end());
  const auto report = opt.memory_report();
  double state = 0;
  for (const auto& b : report.buffers)
    if (b.name == "master" || b.name == "momentum_buffer" || b.name == "exp_avg" || b.name == "exp_avg_sq")
      state += double(b.bytes);
  double held = 0, total = 0;
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    const double c = mpopt::muon::matrix_cost(shapes[t].rows, shapes[t].cols);
    total += c;
    if (opt.owned(t).count) held += c;
  }
  return {double(report.owned_bytes()), state, sent, seconds[seconds.size() / 2], held / total};
}

/// Rank 0 prints every rank's line of one configuration.
void print(const char* rule, const char* partition, const measured& m) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::vector<measured> all(static_cast<std::size_t>(world));
  MPI_Gather(&m, sizeof m, MPI_BYTE, all.data(), sizeof m, MPI_BYTE, 0, MPI_COMM_WORLD);
  if (rank != 0) return;
  for (int r = 0; r < world; ++r) {
    const measured& x = all[std::size_t(r)];
    std::printf("%-6s %-11s rank=%d optimizer_MiB=%.2f state_MiB=%.2f sent_MiB_per_step=%.2f step_ms=%.1f "
                "orthogonalization_share=%.2f\n",
                rule, partition, r, x.optimizer_bytes / (1 << 20), x.state_bytes / (1 << 20),
                x.sent_bytes / (1 << 20), 1e3 * x.step_seconds, x.cost_share);
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  bool quick = false;
  int steps = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--steps" && i + 1 < argc) steps = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: partitions [--steps S] [--quick]\n");
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (steps == 0) steps = quick ? 2 : 5;
  const auto shapes = model_shapes(quick ? 1 : 4);
  print("adamw", "replicated", run<mpopt::replicated, mpopt::adam>(shapes, steps));
  print("adamw", "zero1", run<mpopt::zero1, mpopt::adam>(shapes, steps));
  print("adamw", "zero2", run<mpopt::zero2, mpopt::adam>(shapes, steps));
  print("adamw", "layerwise", run<mpopt::layerwise, mpopt::adam>(shapes, steps));
  print("muon", "replicated", run<mpopt::replicated, mpopt::muon>(shapes, steps));
  print("muon", "zero1", run<mpopt::zero1, mpopt::muon>(shapes, steps));
  print("muon", "zero2", run<mpopt::zero2, mpopt::muon>(shapes, steps));
  print("muon", "layerwise", run<mpopt::layerwise, mpopt::muon>(shapes, steps));
  MPI_Finalize();
}
