#!/usr/bin/env bash
# A CUDA test's or benchmark's source compiled as a check, where no GPU could run it (meson.build's
# cuda_check): nvcc makes its kernels' PTX, warnings as errors, and g++ reads its host code,
# templates instantiated, without generating any (-fsyntax-only). Nothing is linked or run.
# Usage: cuda_check.sh NVCC [ARGS...] SOURCE; an argument --mpi stands for MPI's include flags.
set -euo pipefail
args=()
for a in "$@"; do
  if [ "$a" = --mpi ]; then
    read -r -a mpi_flags <<<"$(mpicxx --showme:compile)"
    args+=("${mpi_flags[@]}")
  else
    args+=("$a")
  fi
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"${args[@]}" -Xcompiler=-fsyntax-only -c -o "$work/check.o"
echo "compiles: ${*: -1}"
