#!/usr/bin/env bash
# The public headers compile on their own with -Wall -Wextra -Wpedantic -Werror and no CUDA or MPI
# directory on the include path (mpi.hpp and nccl.hpp get MPI's, nccl.hpp CUDA's, cuda.hpp, offload.hpp
# and cuda_matrix.hpp CCCL's for their Thrust-OMP build, muon.hpp, matrix_rule.hpp and cuda_matrix.hpp
# the CBLAS's, nothing more): mpopt.hpp with every given compiler, unoptimized (the scalar lanes
# alone) and, but for the first, whose release builds compile the vector lanes (layout.cpp,
# convert.cpp), optimized (the vector lanes, for x86-64 without -march: -march=native would only let
# their intrinsics be called from anywhere); every other public header with the first compiler.
# The separately compiled mode (src.hpp): mpopt.hpp declares without defining, src.hpp includes every
# .ipp file, and src_optimizers.hpp compiles with every other compiler (with the first, the build's
# libmpopt compiles both, warnings as errors: src/*.cpp); header-only, two units that include
# everything link (each definition there is inline). MPOPT_X86_SIMD=0 keeps to the scalar lanes.
set -u
include_dir="$1"
shift
jobs=()  # (the first compiler's check of mpopt.hpp: the two units, below)
for cxx in "${@:2}"; do
  for mode in unoptimized optimized; do jobs+=("$cxx $mode mpopt.hpp"); done
done
for h in "$include_dir"/mpopt/*.hpp; do
  case "$(basename "$h")" in
    mpopt.hpp | make_optimizer.hpp | src.hpp | src_optimizers.hpp) ;;  # (make_optimizer.hpp: the two units)
    *) jobs+=("$1 unoptimized $(basename "$h")") ;;
  esac
done
jobs+=("$1 compiled mpopt.hpp")
# The standard optimizer types with every member, by every compiler (clang 14 instantiates members
# whose constraints fail where g++ does not).
for cxx in "${@:2}"; do jobs+=("$cxx compiled src_optimizers.hpp"); done
# g++ collects garbage from 1 GiB of heap on, as meson.build has it for our own builds: faster.
heap_args() { case "$(basename "$1")" in g++*) echo --param=ggc-min-heapsize=1048576 ;; esac; }
check() {
  read -r cxx mode header <<<"$1"
  flags=(-std=c++20 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$include_dir")
  [ "$mode" = optimized ] && flags+=(-O2)
  [ "$mode" = compiled ] && flags+=(-DMPOPT_SEPARATE_COMPILATION)
  read -r -a heap <<<"$(heap_args "$cxx")"
  flags+=("${heap[@]}")
  cuda=/usr/local/cuda/include
  case "$header" in  # the headers that need another library's include path
    mpi.hpp | nccl.hpp)
      command -v mpicxx >/dev/null || { echo "skip: $header (no mpicxx)"; return 0; }
      read -r -a mpi_flags <<<"$(mpicxx --showme:compile)"
      flags+=("${mpi_flags[@]}")
      if [ "$header" = nccl.hpp ]; then
        [ -f "$cuda/nccl.h" ] || { echo "skip: nccl.hpp (no NCCL)"; return 0; }
        flags+=(-I"$cuda")
      fi
      ;;
  esac
  case "$header" in
    muon.hpp | matrix_rule.hpp | cuda_matrix.hpp)  # the host's CBLAS
      blas=$(pkg-config --cflags openblas 2>/dev/null || pkg-config --cflags blis 2>/dev/null) ||
        { echo "skip: $header (no CBLAS)"; return 0; }
      read -r -a blas_flags <<<"$blas"
      flags+=("${blas_flags[@]}")
      ;;
  esac
  case "$header" in
    cuda.hpp | offload.hpp | cuda_matrix.hpp)  # the Thrust-OMP build of the device backend
      [ -d "$cuda/cccl" ] || { echo "skip: $header (no CCCL)"; return 0; }
      flags+=(-fopenmp -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP -isystem "$cuda/cccl")
      ;;
  esac
  if ! echo "#include <mpopt/$header>" | "$cxx" "${flags[@]}" -x c++ - 2>&1; then
    echo "FAIL: $1"
    return 1
  fi
}
export -f check heap_args
export include_dir
printf '%s\n' "${jobs[@]}" | xargs -P "$(nproc)" -I{} bash -c 'check "{}"'
status=$?
echo "${#jobs[@]} header compilations checked with: $*"

for f in $(cd "$include_dir/mpopt" && find . -name '*.ipp' | sed 's|^\./||' | sort); do
  grep -q "^#include \"$f\"" "$include_dir/mpopt/src.hpp" || { echo "FAIL: src.hpp does not include $f"; status=1; }
done
# MPOPT_X86_SIMD=0 keeps an optimized build to the scalar lanes (no vector entry point is declared);
# any other value stops with a message.
printf '#include <mpopt/host_passes.hpp>\n#ifdef MPOPT_TARGET_ENTRY\n#error vector lanes\n#endif\n' |
  "$1" -std=c++20 -O2 -DMPOPT_X86_SIMD=0 -fsyntax-only -I"$include_dir" -x c++ - ||
  { echo "FAIL: MPOPT_X86_SIMD=0 did not keep to the scalar lanes"; status=1; }
echo '#include <mpopt/host_passes.hpp>' | "$1" -std=c++20 -O2 -DMPOPT_X86_SIMD=1 -fsyntax-only -I"$include_dir" -x c++ - 2>&1 |
  grep -q 'MPOPT_X86_SIMD may be defined only as 0' ||
  { echo "FAIL: MPOPT_X86_SIMD=1 compiled or stopped without its message"; status=1; }
echo "MPOPT_X86_SIMD=0 keeps to the scalar lanes; =1 is refused"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unit='#include <mpopt/make_optimizer.hpp>
#include <mpopt/mpopt.hpp>'
# Two units of the same text make the same object: linking it twice finds what two units would. The
# unit is also the first compiler's check, warning-free, that make_optimizer.hpp stands alone (it
# comes first) and that every header compiles beside the others (mpopt.hpp holds only includes: it
# stands alone where each header does, the checks above).
read -r -a heap <<<"$(heap_args "$1")"
echo "$unit" | "$1" -std=c++20 -O0 -Wall -Wextra -Wpedantic -Werror "${heap[@]}" -I"$include_dir" -x c++ -c - -o "$work/unit.o" ||
  { echo "FAIL: $1 make_optimizer.hpp, then mpopt.hpp (compiled)"; status=1; }
echo 'int main() {}' | "$1" -x c++ - -x none "$work/unit.o" "$work/unit.o" -o "$work/two_units" ||
  { echo "FAIL: two header-only units that include mpopt.hpp and make_optimizer.hpp do not link"; status=1; }
echo "src.hpp includes every .ipp; two header-only units link"
exit $status
