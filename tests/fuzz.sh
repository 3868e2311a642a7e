#!/usr/bin/env bash
# Suite 'fuzz' (tests/meson.build). Writes the seed files into WORKDIR/seeds with FUZZ_SEEDS, then
#   regressions: runs FUZZ_LOAD once on each file of seeds/regressions and names every one that fails;
#   run:         fuzzes for MPOPT_FUZZ_SECONDS (default 30) from a fresh corpus of the seeds.
# Usage: fuzz.sh regressions|run FUZZ_SEEDS FUZZ_LOAD WORKDIR
set -euo pipefail
if [[ $# != 4 || ! $1 =~ ^(regressions|run)$ ]]; then
  echo "usage: $0 regressions|run FUZZ_SEEDS FUZZ_LOAD WORKDIR" >&2
  exit 2
fi
mode=$1 seeds=$2 fuzzer=$3 work=$4

rm -rf "$work"
mkdir -p "$work"
"$seeds" "$work/seeds"

# UBSan reports say where, not how it got there, without this.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

# What went wrong: the first report (a sanitizer's or the target's own) and its stack as file:line
# (the template names are pages long), else the end of the log.
report() {
  local at
  at=$(grep -m 1 -n -E 'runtime error|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|fuzz_load: BUG' "$1" | cut -d: -f1)
  if [ -z "$at" ]; then
    tail -n 20 "$1"
    return
  fi
  sed -n "${at}p" "$1"
  tail -n +"$((at + 1))" "$1" | grep -E '^ +#[0-9]+ ' | grep -v nlohmann |
    awk '$NF ~ /:[0-9]+(:[0-9]+)?$/ { print "  " $1 " " $NF }' | head -n 6
  grep 'Test unit written' "$1" || true
}

case $mode in
  regressions)
    failed=0
    for f in "$work"/seeds/regressions/*.safetensors; do
      if "$fuzzer" "$f" >"$work/log" 2>&1; then
        echo "ok      ${f##*/}"
      else
        echo "FAILED  ${f##*/}"
        report "$work/log" | sed 's/^/        /'
        failed=1
      fi
    done
    exit $failed
    ;;
  run)
    mkdir "$work/corpus"
    cp "$work"/seeds/*.safetensors "$work/corpus/"
    # A crashing input is written next to the log as crash-<sha1>: run FUZZ_LOAD on it to reproduce.
    if ! "$fuzzer" -max_total_time="${MPOPT_FUZZ_SECONDS:-30}" -dict="$(dirname "$0")/fuzz_load.dict" \
        -max_len=16384 -len_control=0 \
        -print_final_stats=1 -artifact_prefix="$work/" "$work/corpus" >"$work/log" 2>&1; then
      report "$work/log"
      exit 1
    fi
    grep -E '^Done|stat::(average_exec_per_sec|new_units_added)' "$work/log"
    ;;
esac
