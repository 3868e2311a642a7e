#!/usr/bin/env bash
# CUDA tests' and benchmarks' sources compiled as a check, where no GPU could run them (meson.build's
# cuda_check): nvcc's front end reads them whole, instantiating every template their host and device
# code use, and makes their kernels' PTX, warnings as errors. Neither ptxas nor g++ runs: their share
# of nvcc's time was half, and g++ builds the same sources for Thrust's OpenMP system, each on its
# own. The sources compile as one unit: they instantiate mostly the same kernels, which cicc then
# makes once (five sources: 119 s apart, 63 s as one). Each one's main is renamed, as nothing links.
# Usage: cuda_check.sh NVCC [ARGS...] -- SOURCE...; an argument --mpi stands for MPI's include flags.
set -euo pipefail
args=()
while (($#)) && [ "$1" != -- ]; do
  if [ "$1" = --mpi ]; then
    read -r -a mpi_flags <<<"$(mpicxx --showme:compile)"
    args+=("${mpi_flags[@]}")
  else
    args+=("$1")
  fi
  shift
done
(($# > 1)) || { echo "usage: $0 NVCC [ARGS...] -- SOURCE..." >&2; exit 2; }
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
n=0
for source in "$@"; do
  n=$((n + 1))
  printf '#define main cuda_check_main_%d\n#include "%s"\n#undef main\n' "$n" "$(realpath "$source")"
done >"$work/unit.cu"
"${args[@]}" --ptx -o "$work/check.ptx" "$work/unit.cu"
echo "compiles as one unit: $*"
