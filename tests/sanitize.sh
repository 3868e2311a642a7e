#!/usr/bin/env bash
# The suites that read files and untrusted input or pass data between ranks (state, bad_input,
# loss_scale, pipeline, mpi), built by clang++ with AddressSanitizer and UndefinedBehaviorSanitizer
# in their own build directory and run there; any report fails its test.
# Usage: tests/sanitize.sh [BUILD_DIR]   (default build-sanitize; extra `meson test` options after it)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-sanitize}
shift || true
suites=(state bad_input loss_scale pipeline mpi)

# With OpenMP (clang's needs libomp-dev): the host backend's threads split the work, and their
# chunk boundaries are where an out-of-bounds access would hide.
options=(-Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false
         "-Dcpp_args=['-fsanitize=float-cast-overflow','-fno-sanitize-recover=all']"
         -Dexamples=false -Dbench=false -Dcuda=disabled)
if [ -f "$dir/meson-private/coredata.dat" ]; then
  meson setup --reconfigure "$dir" "${options[@]}" >/dev/null
else
  CXX=clang++ meson setup "$dir" "${options[@]}" >/dev/null
fi

# Open MPI leaks by design; a UBSan report stops the process with its stack.
export ASAN_OPTIONS=detect_leaks=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
suite_args=()
for s in "${suites[@]}"; do suite_args+=(--suite "$s"); done
# meson test builds only the executables of the tests it runs: the rest would take long under the
# sanitizers. These run 2-5 times slower than usual: bad_input's file and byte-flip tests need more time.
meson test -C "$dir" --print-errorlogs --timeout-multiplier 3 "${suite_args[@]}" "$@"
