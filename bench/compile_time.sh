#!/usr/bin/env bash
# What a header-only library costs its users at every build: for each representative translation
# unit, the seconds and peak memory (cc1plus's maximum resident set) of an -O2 compile to an object
# file, and the preprocessed lines of <mpopt/mpopt.hpp>; header-only, then in the separately compiled
# mode (MPOPT_SEPARATE_COMPILATION: the same units, and the one unit that includes <mpopt/src.hpp>).
# Run from anywhere, on an idle machine:
#   bench/compile_time.sh [CXX]        (default g++; MPI through mpicxx, with that compiler)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cxx=${1:-g++}
cccl=/usr/local/cuda/include/cccl
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(-std=c++20 -O2 -fopenmp -ffp-contract=off -Wno-psabi -DNDEBUG -I"$root/include")

# Runs a compiler command; prints "seconds peak_MB".
measure() {
  python3 - "$@" <<'PY'
import resource, subprocess, sys, time
t0 = time.perf_counter()
rc = subprocess.run(sys.argv[1:]).returncode
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB -> MiB, cc1plus included
print(f"{seconds:.1f} {peak:.0f}")
sys.exit(rc)
PY
}

row() {  # name, then the compile command
  local name=$1
  shift
  read -r seconds mb < <(measure "$@" -c -o "$work/tu.o")
  printf '| %s | %s | %s |\n' "$name" "$seconds" "$mb"
}

lines=$(echo '#include <mpopt/mpopt.hpp>' | "$cxx" "${flags[@]}" -E -x c++ - | wc -l)
echo "$($cxx --version | head -1); $(nproc) cores; <mpopt/mpopt.hpp> preprocesses to $lines lines"
units() {  # the rows, with "$@" added to every compile
  row "examples/quickstart.cpp" "$cxx" "${flags[@]}" "$@" "$root/examples/quickstart.cpp"
  row "examples/train_mlp.cpp" "$cxx" "${flags[@]}" "$@" "$root/examples/train_mlp.cpp"
  row "examples/configured_optimizer.cpp (make_optimizer)" "$cxx" "${flags[@]}" "$@" "$root/examples/configured_optimizer.cpp"
  if command -v mpicxx >/dev/null; then
    row "one zero2 optimizer over MPI that steps and saves (mpicxx)" env OMPI_CXX="$cxx" mpicxx "${flags[@]}" "$@" "$work/zero2_mpi.cpp"
    row "tests/mpi_zero.cpp (mpicxx)" env OMPI_CXX="$cxx" mpicxx "${flags[@]}" "$@" -I"$root/tests" "$root/tests/mpi_zero.cpp"
  else
    echo "| tests/mpi_zero.cpp | skipped: no mpicxx | |"
  fi
  if [ -f "$cccl/thrust/version.h" ]; then
    row "examples/train_mlp.cpp, device backend on Thrust-OMP" "$cxx" "${flags[@]}" "$@" -isystem "$cccl" \
      -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP -DMPOPT_EXAMPLE_DEVICE=1 "$root/examples/train_mlp.cpp"
  else
    echo "| train_mlp, device backend | skipped: no CCCL at $cccl | |"
  fi
}
# What a data-parallel trainer's unit holds: one ZeRO-2 optimizer over MPI that steps and saves.
cat > "$work/zero2_mpi.cpp" <<'CPP'
#include <mpopt/adam.hpp>
#include <mpopt/checkpoint.hpp>
#include <mpopt/mpi.hpp>
#include <mpopt/optimizer.hpp>

#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    using optimizer = mpopt::optimizer<mpopt::fp16, mpopt::dynamic_scale, mpopt::zero2, mpopt::adam, mpopt::host, mpopt::mpi>;
    optimizer opt{mpopt::mpi{MPI_COMM_WORLD}};
    std::vector<mpopt::half> w(1024), g(1024);
    opt.add_group({.lr = 1e-3}).add(w, g, "w");
    for (int i = 0; i < 3; ++i) {
      opt.grad_ready(0);
      opt.step();
    }
    opt.save("zero2.safetensors");
  }
  MPI_Finalize();
}
CPP
echo
echo '| translation unit (-O2) | seconds | peak MiB |'
echo '|---|---|---|'
units
echo
echo 'The separately compiled mode (-DMPOPT_SEPARATE_COMPILATION in every unit):'
echo
echo '| translation unit (-O2) | seconds | peak MiB |'
echo '|---|---|---|'
row "src/mpopt.cpp (<mpopt/src.hpp>: once per program)" "$cxx" "${flags[@]}" -DMPOPT_SEPARATE_COMPILATION "$root/src/mpopt.cpp"
for part in fp16 fp32 bf16; do  # the standard optimizer types and make_optimizer's parts: once per program
  row "src/optimizers_$part.cpp (once per program)" "$cxx" "${flags[@]}" -DMPOPT_SEPARATE_COMPILATION \
    "$root/src/optimizers_$part.cpp"
done
echo '#include <mpopt/src_optimizers.hpp>' >"$work/optimizers.cpp"
row "<mpopt/src_optimizers.hpp> in one unit instead" "$cxx" "${flags[@]}" -DMPOPT_SEPARATE_COMPILATION "$work/optimizers.cpp"
units -DMPOPT_SEPARATE_COMPILATION
