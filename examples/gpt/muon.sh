#!/usr/bin/env bash
# train_gpt in bf16 with AdamW alone, and with Muon for the blocks' matrices beside AdamW for the
# rest (--rule muon), from the same weights and batches: validation loss by step and by training
# time on one PNG, and what share of each run's step time opt.step() took.
#
#   examples/gpt/muon.sh TRAIN_GPT OUT_DIR [train_gpt flags...]
# writes OUT_DIR/adamw.csv, muon.csv, summary.txt and muon.png; exits nonzero if a run fails
# (train_gpt fails when its validation loss did not fall).
set -euo pipefail
if (($# < 2)); then
  echo "usage: muon.sh TRAIN_GPT OUT_DIR [train_gpt flags...]" >&2
  exit 2
fi
exe=$1
out=$2
shift 2
mkdir -p "$out"
for run in adamw muon; do
  rule=$([ "$run" = muon ] && echo muon || echo adam)
  echo "== $run"
  "$exe" --precision bf16 --rule "$rule" --csv "$out/$run.csv" --sample 0 --print-every 0 "$@" >"$out/$run.txt"
  tail -3 "$out/$run.txt" | head -2
done

# Each run's last validation loss, training time and opt.step() share; the loss AdamW reached last,
# and when Muon first reached it.
validation() { grep -E '^[0-9]+,[^,]*,[^,]+,' "$1"; }
{
  for run in adamw muon; do
    share=$(grep -o 'opt.step() [0-9.]*%' "$out/$run.txt" | cut -d' ' -f2)
    validation "$out/$run.csv" | tail -1 |
      awk -F, -v run="$run" -v share="$share" '{ printf "%-6s validation loss %.4f at step %d, %.1f s of training; opt.step() %s of the step time\n", run, $3, $1, $8, share }'
  done
  target=$(validation "$out/adamw.csv" | tail -1 | cut -d, -f3)
  validation "$out/muon.csv" | awk -F, -v t="$target" 'NR > 1 && $3 <= t { printf "muon reaches AdamW'"'"'s last validation loss (%.4f) at step %d, %.1f s\n", t, $1, $8; found = 1; exit }
    END { if (!found) printf "muon does not reach AdamW'"'"'s last validation loss (%.4f)\n", t }'
} | tee "$out/summary.txt"

gnuplot <<GNUPLOT
set terminal pngcairo size 1200,520 noenhanced
set output '$out/muon.png'
set datafile separator ','
set grid
set ylabel 'validation loss (nats per character)'
set key top right
set multiplot layout 1,2 title "train_gpt, bf16: AdamW alone, and Muon for the blocks' matrices beside AdamW"
set title 'by step'
set xlabel 'step'
plot '< grep -E "^[0-9]+,[^,]*,[^,]+," $out/adamw.csv' using 1:3 with linespoints pt 7 ps 0.6 lc rgb '#1f77b4' title 'AdamW', \
     '< grep -E "^[0-9]+,[^,]*,[^,]+," $out/muon.csv' using 1:3 with linespoints pt 7 ps 0.6 lc rgb '#d62728' title 'Muon + AdamW'
set title 'by training time (evaluation apart)'
set xlabel 'seconds'
plot '< grep -E "^[0-9]+,[^,]*,[^,]+," $out/adamw.csv' using 8:3 with linespoints pt 7 ps 0.6 lc rgb '#1f77b4' title 'AdamW', \
     '< grep -E "^[0-9]+,[^,]*,[^,]+," $out/muon.csv' using 8:3 with linespoints pt 7 ps 0.6 lc rgb '#d62728' title 'Muon + AdamW'
unset multiplot
GNUPLOT
echo "wrote $out/muon.png"
