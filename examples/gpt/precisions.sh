#!/usr/bin/env bash
# train_gpt in fp32, fp16 (dynamic loss scale) and bf16 from the same weights and batches, and their
# loss curves on one PNG.
#
#   examples/gpt/precisions.sh TRAIN_GPT OUT_DIR [train_gpt flags...]
# writes OUT_DIR/fp32.csv, fp16.csv, bf16.csv and OUT_DIR/precisions.png; exits nonzero if a run
# fails (train_gpt fails when its validation loss did not fall).
set -euo pipefail
if (($# < 2)); then
  echo "usage: precisions.sh TRAIN_GPT OUT_DIR [train_gpt flags...]" >&2
  exit 2
fi
exe=$1
out=$2
shift 2
mkdir -p "$out"
for p in fp32 fp16 bf16; do
  echo "== $p"
  "$exe" --precision "$p" --csv "$out/$p.csv" --sample 0 --print-every 0 "$@" | tail -2
done
"$(dirname "$0")/plot.sh" "$out/precisions.png" "$out/fp32.csv" "$out/fp16.csv" "$out/bf16.csv"
