#!/usr/bin/env bash
# train_gpt in bf16 with AdamW's moments stored in fp32, bf16, 8-bit and 4-bit blocks (the master as
# remainder16 in all but fp32), over several seeds: each state's final validation loss against the
# spread of the fp32 runs', and every run's curves on one PNG.
#
#   examples/gpt/states.sh TRAIN_GPT OUT_DIR SEEDS [train_gpt flags...]
# writes OUT_DIR/STATE-seedS.csv for each run, OUT_DIR/summary.txt and OUT_DIR/states.png; exits
# nonzero if a run fails (train_gpt fails when its validation loss did not fall).
set -euo pipefail
if (($# < 3)); then
  echo "usage: states.sh TRAIN_GPT OUT_DIR SEEDS [train_gpt flags...]" >&2
  exit 2
fi
exe=$1
out=$2
seeds=$3
shift 3
states=(fp32 bf16 blockwise8 blockwise4)
mkdir -p "$out"
for ((seed = 1; seed <= seeds; seed++)); do
  for s in "${states[@]}"; do
    echo "== $s, seed $seed"
    "$exe" --precision bf16 --state "$s" --seed "$seed" --csv "$out/$s-seed$seed.csv" --sample 0 --print-every 0 "$@" |
      tail -3 | head -2
  done
done

# The last validation loss of each run; each state's mean and range, against fp32's range.
final() { grep -E '^[0-9]+,[^,]*,[^,]+,' "$1" | tail -1 | cut -d, -f3; }
{
  echo "final validation loss over $seeds seed(s) (mean [min, max]), against the fp32-state runs' range:"
  for s in "${states[@]}"; do
    for ((seed = 1; seed <= seeds; seed++)); do final "$out/$s-seed$seed.csv"; done |
      awk -v s="$s" 'NR == 1 || $1 < lo { lo = $1 } NR == 1 || $1 > hi { hi = $1 } { sum += $1 }
        END { printf "%s %.4f %.4f %.4f\n", s, sum / NR, lo, hi }'
  done | awk 'NR == 1 { flo = $3; fhi = $4 }
    { where = $2 < flo ? sprintf("%.4f below", flo - $2) : $2 > fhi ? sprintf("%.4f above", $2 - fhi) : "within"
      printf "  %-11s %.4f [%.4f, %.4f]  mean %s the fp32 range\n", $1, $2, $3, $4, where }'
} | tee "$out/summary.txt"

# Left: training loss as a running mean over 20 steps, validation loss as points. Right: the
# validation loss over the second half, where the storages would part. One color per state, one dash
# pattern per seed.
colors=(1f77b4 d62728 2ca02c 9467bd)
left=()
right=()
for i in "${!states[@]}"; do
  for ((seed = 1; seed <= seeds; seed++)); do
    f="$out/${states[i]}-seed$seed.csv"
    style="dt $seed lc rgb '#${colors[i]}' $([ "$seed" = 1 ] && echo "title '${states[i]}'" || echo notitle)"
    validation="'< grep -E \"^[0-9]+,[^,]*,[^,]+,\" $f'"
    left+=("'< awk -F, \"NR > 2 { w[NR % 20] = \\\$2; n = NR - 2 < 20 ? NR - 2 : 20; t = 0; for (k in w) t += w[k]; print \\\$1 \\\",\\\" t / n }\" $f' using 1:2 with lines lw 1 $style")
    left+=("$validation using 1:3 with points pt 7 ps 0.5 lc rgb '#${colors[i]}' notitle")
    right+=("$validation using 1:3 with linespoints pt 7 ps 0.6 lw 1.2 $style")
  done
done
last=$(tail -1 "$out/fp32-seed1.csv" | cut -d, -f1)
joined_left=$(printf '%s, ' "${left[@]}")
joined_right=$(printf '%s, ' "${right[@]}")
gnuplot <<GNUPLOT
set terminal pngcairo size 1200,520 noenhanced
set output '$out/states.png'
set datafile separator ','
set grid
set xlabel 'step'
set ylabel 'loss (nats per character)'
set multiplot layout 1,2 title "train_gpt, bf16 AdamW, by how its moments are stored ($seeds seed(s), a dash pattern each)"
set title 'training loss (mean of 20 steps); validation loss (points)'
set key top right
plot ${joined_left%, }
set title 'validation loss, second half'
set xrange [$last / 2:$last]
set autoscale y
plot ${joined_right%, }
unset multiplot
GNUPLOT
echo "wrote $out/states.png"
