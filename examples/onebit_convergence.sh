#!/usr/bin/env bash
# Convergence of 1-bit LAMB against LAMB: the MLP example trained twice on 4 MPI ranks, on the
# same data, initial weights, batches and learning-rate schedule; each run writes its loss per
# step as CSV, gnuplot draws both curves into one PNG, and the final training losses (the whole
# training set, evaluated after the last step) are printed side by side.
#
#   examples/onebit_convergence.sh [--exe build/examples/train_mlp] [--out DIR] [-- train_mlp args]
#
# The task is the example's teacher-labelled data with 2^18 training samples, so 2000 steps of
# 64 samples on 4 ranks see each sample about twice, as in pretraining: both optimizers fit the
# same function rather than memorizing a small set. LAMB runs without bias correction, which
# 1-bit LAMB's warm-up does not have either; 1-bit LAMB compresses after 20% of the steps.
# Exits nonzero if 1-bit LAMB's final loss is more than 5% above LAMB's, or a run fails.
set -euo pipefail

exe=build/examples/train_mlp
out=build/onebit_convergence
while (($#)); do
  case "$1" in
    --exe) exe=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "onebit_convergence.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
command -v gnuplot >/dev/null || { echo "onebit_convergence.sh: needs gnuplot (apt-get install gnuplot-nox)" >&2; exit 2; }
[ -x "$exe" ] || { echo "onebit_convergence.sh: $exe not built (meson compile -C build)" >&2; exit 2; }
mkdir -p "$out"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
task=(--steps 2000 --train-samples 262144 --schedule linear --print-every 500 "$@")

final_loss() {  # the "done: train loss A -> B, ..." line of a run's log: B
  sed -n 's/^done: train loss [0-9.]* -> \([0-9.]*\),.*/\1/p' "$1"
}

for rule in lamb onebit_lamb; do
  extra=()
  [ "$rule" = lamb ] && extra=(--bias-correction off)
  echo "== $rule"
  mpirun -np 4 "$exe" --rule "$rule" "${extra[@]}" "${task[@]}" --csv "$out/$rule.csv" | tee "$out/$rule.log"
done

lamb=$(final_loss "$out/lamb.log")
onebit=$(final_loss "$out/onebit_lamb.log")
[ -n "$lamb" ] && [ -n "$onebit" ] || { echo "onebit_convergence.sh: a run printed no final loss" >&2; exit 1; }

# One step's batch loss is noisy: draw it faint, with its mean over the last 50 steps on top.
for rule in lamb onebit_lamb; do
  awk -F, 'NR > 1 { sum += $2; q[NR] = $2; if (NR > 51) sum -= q[NR - 50]; print $1 "," $2 "," sum / (NR > 51 ? 50 : NR - 1) }' \
    "$out/$rule.csv" > "$out/$rule.mean.csv"
done
start=$(sed -n 's/^step *\([0-9]*\) *1-bit LAMB: warm-up done.*/\1/p' "$out/onebit_lamb.log")
gnuplot <<EOF
set terminal pngcairo size 900,560
set output "$out/onebit_convergence.png"
set datafile separator ","
set title "MLP on 4 ranks: batch loss per step, averaged over ranks (thick: mean of the last 50 steps)"
set xlabel "step"
set ylabel "training loss"
set logscale y
set arrow from ${start:-0}, graph 0 to ${start:-0}, graph 1 nohead dashtype 2 lc rgb "#808080"
set label "1-bit compression starts" at ${start:-0}, graph 0.95 offset 1, 0
plot "$out/lamb.mean.csv" using 1:2 with lines lc rgb "#a0b8e0" notitle, \\
     "$out/onebit_lamb.mean.csv" using 1:2 with lines lc rgb "#f0b8a0" notitle, \\
     "$out/lamb.mean.csv" using 1:3 with lines lw 2 lc rgb "#1f4fa0" title "LAMB (final $lamb)", \\
     "$out/onebit_lamb.mean.csv" using 1:3 with lines lw 2 lc rgb "#c0401a" title "1-bit LAMB (final $onebit)"
EOF
echo "plot: $out/onebit_convergence.png"

awk -v a="$lamb" -v b="$onebit" 'BEGIN {
  r = b / a
  printf "\nfinal training loss (whole training set, after the last step):\n"
  printf "  %-12s %.4f\n  %-12s %.4f   (%+.1f%% vs LAMB)\n", "LAMB", a, "1-bit LAMB", b, 100 * (r - 1)
  if (r > 1.05) { print "1-bit LAMB is more than 5% above LAMB"; exit 1 }
}'
