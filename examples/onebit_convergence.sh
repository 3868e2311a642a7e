#!/usr/bin/env bash
# Convergence of the compressing rules against their uncompressed counterparts: the MLP example
# trained with Adam, 1-bit Adam, 0/1 Adam, LAMB and 1-bit LAMB on 2 MPI ranks, on the same data,
# initial weights, batches and learning-rate schedule; each run writes its loss per step as CSV,
# gnuplot draws the five curves into one PNG, and a table gives each rule's final training loss
# (the whole training set, evaluated after the last step), its mean comm_ratio (bytes sent per step
# over an fp32 all-reduce of the gradients) and its difference from its counterpart. With --seeds N
# every rule runs on seeds 1..N (data, initial weights, batches), and a second table gives per rule
# the final losses, the worst ratio to its counterpart on the same seed, and the largest |parameter|
# of any run: a diverging run shows in both.
#
#   examples/onebit_convergence.sh [--exe build/examples/train_mlp] [--out DIR] [--seeds N]
#                                  [--compressed "train_mlp flags"] [-- train_mlp args]
#
# --compressed passes flags to the compressing rules only (--compression-scale global, say).
#
# The task is the example's teacher-labelled data with 2^18 training samples: 2000 steps of 64
# samples on 2 ranks see each sample about once, as in pretraining, so every optimizer fits the
# same function rather than memorizing a small set. Adam and LAMB run without bias correction, which
# the compressing rules do not have either; they compress (0/1 Adam: ends its variance updates)
# after 20% of the steps. Exits nonzero if a compressed rule's final loss is more than 5% above its
# counterpart's on any seed, or a run fails.
set -euo pipefail

exe=build/examples/train_mlp
out=build/onebit_convergence
seeds=1
compressed=""
while (($#)); do
  case "$1" in
    --exe) exe=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --compressed) compressed=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "onebit_convergence.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
command -v gnuplot >/dev/null || { echo "onebit_convergence.sh: needs gnuplot (apt-get install gnuplot-nox)" >&2; exit 2; }
[ -x "$exe" ] || { echo "onebit_convergence.sh: $exe not built (meson compile -C build)" >&2; exit 2; }
mkdir -p "$out"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
steps=2000
# (each run is compared with its counterpart, not with an fp32 run of itself: --compare-fp32 off)
task=(--steps "$steps" --train-samples 262144 --schedule linear --print-every 500 --compare-fp32 off "$@")

rules=(adam onebit_adam zero_one_adam lamb onebit_lamb)
declare -A title=([adam]="Adam" [onebit_adam]="1-bit Adam" [zero_one_adam]="0/1 Adam" [lamb]="LAMB"
                  [onebit_lamb]="1-bit LAMB")
declare -A counterpart=([onebit_adam]=adam [zero_one_adam]=adam [onebit_lamb]=lamb)
declare -A colour=([adam]="#1f4fa0" [onebit_adam]="#c0401a" [zero_one_adam]="#2a8a3a" [lamb]="#7a3fa0"
                   [onebit_lamb]="#d08a10")
declare -A loss comm big  # by "rule seed"

for seed in $(seq 1 "$seeds"); do
  for rule in "${rules[@]}"; do
    extra=()
    case "$rule" in
      adam|lamb) extra=(--bias-correction off) ;;
      *) read -r -a extra <<< "$compressed" ;;
    esac
    run="$out/$rule.seed$seed"
    echo "== $rule, seed $seed"
    # A run whose loss went up exits nonzero after its report: it counts as a result (a divergence).
    mpirun -np 2 "$exe" --rule "$rule" "${extra[@]}" --seed "$seed" "${task[@]}" --csv "$run.csv" > "$run.log" 2>&1 ||
      grep -q "^done:" "$run.log" || { cat "$run.log"; echo "onebit_convergence.sh: $rule failed on seed $seed" >&2; exit 1; }
    sed -n '/^step\|^done/p' "$run.log"
    loss[$rule $seed]=$(sed -n 's/^done: train loss [0-9.]* -> \([0-9.]*\),.*/\1/p' "$run.log")
    comm[$rule $seed]=$(sed -n 's/^communication: comm_ratio \([0-9.]*\) .*/\1/p' "$run.log")
    big[$rule $seed]=$(sed -n 's/^largest |parameter| \(.*\)$/\1/p' "$run.log")
    [ -n "${loss[$rule $seed]}" ] && [ -n "${comm[$rule $seed]}" ] && [ -n "${big[$rule $seed]}" ] ||
      { echo "onebit_convergence.sh: $rule printed no final loss" >&2; exit 1; }
    ! grep -q "in fp32 without loss scaling" "$run.log" || { echo "onebit_convergence.sh: $rule ran in fp32 too" >&2; exit 1; }
  done
done

# The plot: seed 1. One step's batch loss is noisy: it shows its mean over the last 50 steps.
for rule in "${rules[@]}"; do
  awk -F, 'NR > 1 { sum += $2; q[NR] = $2; if (NR > 51) sum -= q[NR - 50]; print $1 "," sum / (NR > 51 ? 50 : NR - 1) }' \
    "$out/$rule.seed1.csv" > "$out/$rule.mean.csv"
done

plot=""
for rule in "${rules[@]}"; do
  plot+="${plot:+, }\"$out/$rule.mean.csv\" using 1:2 with lines lw 2 lc rgb \"${colour[$rule]}\" title \"${title[$rule]} (final ${loss[$rule 1]})\""
done
freeze=$((steps / 5))
gnuplot <<EOF
set terminal pngcairo size 900,560
set output "$out/onebit_convergence.png"
set datafile separator ","
set title "MLP on 2 ranks: batch loss per step, averaged over ranks and the last 50 steps"
set xlabel "step"
set ylabel "training loss"
set logscale y
set yrange [0.25:4]
set ytics (0.3, 0.4, 0.5, 0.7, 1, 2, 3)
set key top right
set arrow from $freeze, graph 0 to $freeze, graph 1 nohead dashtype 2 lc rgb "#808080"
set label "variance frozen (0/1 Adam: local steps)" at $freeze, graph 0.05 offset 1, 0
plot $plot
EOF
echo "plot: $out/onebit_convergence.png"

printf "\nseed 1: final training loss (whole training set, after the last step) and mean comm_ratio:\n"
printf "  %-12s %8s %10s   %s\n" rule loss comm_ratio "vs counterpart"
for rule in "${rules[@]}"; do
  vs=""
  if [ -n "${counterpart[$rule]:-}" ]; then
    base=${counterpart[$rule]}
    vs=$(awk -v a="${loss[$base 1]}" -v b="${loss[$rule 1]}" -v t="${title[$base]}" 'BEGIN { printf "%+.1f%% vs %s", 100 * (b / a - 1), t }')
  fi
  printf "  %-12s %8s %10s   %s\n" "${title[$rule]}" "${loss[$rule 1]}" "${comm[$rule 1]}" "$vs"
done

# Per rule over the seeds: the losses, the worst ratio to the counterpart on the same seed, the
# largest |parameter| of any run. A compressed run more than 5% above its counterpart fails.
status=0
printf "\nseeds 1-%s${compressed:+ (compressing rules: $compressed)}:\n\n" "$seeds"
printf "| rule | final loss per seed | worst vs counterpart | largest \\|parameter\\| |\n|---|---|---|---|\n"
for rule in "${rules[@]}"; do
  losses="" worst="" most=0
  for seed in $(seq 1 "$seeds"); do
    losses+="${losses:+ }${loss[$rule $seed]}"
    most=$(awk -v a="$most" -v b="${big[$rule $seed]}" 'BEGIN { print (b + 0 > a + 0) ? b : a }')
    if [ -n "${counterpart[$rule]:-}" ]; then
      base=${counterpart[$rule]}
      r=$(awk -v a="${loss[$base $seed]}" -v b="${loss[$rule $seed]}" 'BEGIN { printf "%.4f", b / a }')
      worst=$(awk -v w="$worst" -v r="$r" 'BEGIN { print (w == "" || r > w) ? r : w }')
      awk -v r="$r" 'BEGIN { exit !(r > 1.05) }' && {
        echo "onebit_convergence.sh: ${title[$rule]} ends more than 5% above ${title[$base]} on seed $seed" >&2
        status=1
      }
    fi
  done
  vs=""
  [ -n "$worst" ] && vs=$(awk -v r="$worst" -v t="${title[${counterpart[$rule]}]}" 'BEGIN { printf "%+.1f%% vs %s", 100 * (r - 1), t }')
  printf "| %s | %s | %s | %s |\n" "${title[$rule]}" "$losses" "$vs" "$most"
done
exit $status
