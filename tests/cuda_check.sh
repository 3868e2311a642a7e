#!/usr/bin/env bash
# A CUDA test's or benchmark's source compiled as a check, where no GPU could run it (meson.build's
# cuda_check): nvcc's front end reads the whole source, instantiating every template its host and
# device code use, and makes its kernels' PTX, warnings as errors. Neither ptxas nor g++ runs: their
# share of nvcc's time was half, and g++ builds the same sources for Thrust's OpenMP system.
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
"${args[@]}" --ptx -o "$work/check.ptx"
echo "compiles: ${*: -1}"
