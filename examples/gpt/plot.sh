#!/usr/bin/env bash
# Plots train_gpt's --csv files on one PNG (gnuplot): each run's training loss as a line and its
# validation loss as points joined by a dashed line, titled by the file's name.
#
#   examples/gpt/plot.sh OUT.png RUN.csv [RUN.csv ...]
set -euo pipefail
if (($# < 2)); then
  echo "usage: plot.sh OUT.png RUN.csv [RUN.csv ...]" >&2
  exit 2
fi
out=$1
shift
colors=(1f77b4 d62728 2ca02c 9467bd ff7f0e 8c564b)
plots=()
i=0
for f in "$@"; do
  [ -r "$f" ] || { echo "plot.sh: cannot read $f" >&2; exit 1; }
  head -1 "$f" | grep -q '^step,loss,val_loss' || { echo "plot.sh: $f is not a train_gpt --csv file" >&2; exit 1; }
  name=$(basename "$f" .csv)
  c=${colors[i % ${#colors[@]}]}
  plots+=("'$f' using 1:2 with lines lw 1.2 lc rgb '#$c' title '$name training'")
  # Validation rows only: the others leave val_loss empty.
  plots+=("'< grep -E \"^[0-9]+,[^,]*,[^,]+,\" $f' using 1:3 with linespoints dt 2 pt 7 ps 0.8 lw 1.5 lc rgb '#$c' title '$name validation'")
  i=$((i + 1))
done
joined=$(printf '%s, ' "${plots[@]}")
gnuplot <<GNUPLOT
set terminal pngcairo size 900,520 noenhanced
set output '$out'
set datafile separator ','
set key top right
set grid
set xlabel 'step'
set ylabel 'loss (nats per character)'
set title 'train_gpt: training and validation loss'
plot ${joined%, }
GNUPLOT
echo "wrote $out"
