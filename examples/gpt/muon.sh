#!/usr/bin/env bash
# train_gpt in bf16 with AdamW alone, and with Muon for the blocks' matrices beside AdamW for the
# rest (--rule muon), from the same weights and batches: validation loss by step and by training
# time on one PNG, and what share of each run's step time opt.step() took. AdamW runs at each rate
# of ADAMW_LRS (default: train_gpt's --lr), and Muon is compared with the best of them.
#
#   [ADAMW_LRS="1e-3 2e-3 4e-3"] examples/gpt/muon.sh TRAIN_GPT OUT_DIR [train_gpt flags...]
# writes OUT_DIR/adamw-lrX.csv per rate, muon.csv, summary.txt and muon.png; exits nonzero if a run
# fails (train_gpt fails when its validation loss did not fall).
set -euo pipefail
if (($# < 2)); then
  echo "usage: [ADAMW_LRS=\"1e-3 2e-3\"] muon.sh TRAIN_GPT OUT_DIR [train_gpt flags...]" >&2
  exit 2
fi
exe=$1
out=$2
shift 2
mkdir -p "$out"
read -r -a rates <<<"${ADAMW_LRS:-2e-3}"
runs=()
for lr in "${rates[@]}"; do runs+=("adamw-lr$lr"); done
runs+=(muon)
for run in "${runs[@]}"; do
  echo "== $run"
  if [ "$run" = muon ]; then flags=(--rule muon); else flags=(--rule adam --lr "${run#adamw-lr}"); fi
  "$exe" --precision bf16 "${flags[@]}" --csv "$out/$run.csv" --sample 0 --print-every 0 "$@" >"$out/$run.txt"
  tail -3 "$out/$run.txt" | head -2
done

# Each run's last validation loss, training time and opt.step() share; the best AdamW run's last
# loss, and when Muon first reached it.
validation() { grep -E '^[0-9]+,[^,]*,[^,]+,' "$1"; }
last_loss() { validation "$1" | tail -1 | cut -d, -f3; }
best=${runs[0]}
for run in "${runs[@]:0:${#rates[@]}}"; do
  awk -v a="$(last_loss "$out/$run.csv")" -v b="$(last_loss "$out/$best.csv")" 'BEGIN { exit !(a < b) }' && best=$run
done
{
  for run in "${runs[@]}"; do
    share=$(grep -o 'opt.step() [0-9.]*%' "$out/$run.txt" | cut -d' ' -f2)
    validation "$out/$run.csv" | tail -1 | awk -F, -v run="$run" -v share="$share" \
      '{ printf "%-13s validation loss %.4f at step %d, %.1f s of training; opt.step() %s of the step time\n", run, $3, $1, $8, share }'
  done
  validation "$out/muon.csv" | awk -F, -v t="$(last_loss "$out/$best.csv")" -v best="$best" \
    'NR > 1 && $3 <= t { printf "muon reaches %s'"'"'s last validation loss (%.4f) at step %d, %.1f s\n", best, t, $1, $8; found = 1; exit }
     END { if (!found) printf "muon does not reach %s'"'"'s last validation loss (%.4f)\n", best, t }'
} | tee "$out/summary.txt"

# One line per run: AdamW's in blues (the best one solid), Muon's red.
plots() {  # $1: the x column (1: step, 8: seconds)
  local lines=() i=0
  for run in "${runs[@]}"; do
    local style
    if [ "$run" = muon ]; then style="lc rgb '#d62728' lw 2 title 'Muon + AdamW'"
    else style="lc rgb '#1f77b4' dt $([ "$run" = "$best" ] && echo 1 || echo $((i + 2))) title 'AdamW, lr ${run#adamw-lr}'"; fi
    lines+=("'< grep -E \"^[0-9]+,[^,]*,[^,]+,\" $out/$run.csv' using $1:3 with linespoints pt 7 ps 0.5 $style")
    i=$((i + 1))
  done
  printf '%s, ' "${lines[@]}" | sed 's/, $//'
}
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
plot $(plots 1)
set title 'by training time (evaluation apart)'
set xlabel 'seconds'
plot $(plots 8)
unset multiplot
GNUPLOT
echo "wrote $out/muon.png"
