#!/usr/bin/env bash
# A CUDA test's or benchmark's source compiled as a check, where no GPU could run it (meson.build's
# gpu_here): nvcc builds its kernels as for the executable, with warnings as errors, and g++ reads
# its host code, templates instantiated, without generating any (-fsyntax-only). Nothing is linked.
# Usage: cuda_check.sh STAMP DEPFILE NVCC [ARGS...] SOURCE; an argument --mpi stands for MPI's
# include flags. Writes STAMP once the source compiles.
set -euo pipefail
stamp=$1 depfile=$2
shift 2
args=()
for a in "$@"; do
  if [ "$a" = --mpi ]; then
    read -r -a mpi_flags <<<"$(mpicxx --showme:compile)"
    args+=("${mpi_flags[@]}")
  else
    args+=("$a")
  fi
done
rm -f "$stamp"
"${args[@]}" -Xcompiler=-fsyntax-only -MD -MF "$depfile" -c -o "$stamp"
touch "$stamp"
