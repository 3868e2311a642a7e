#!/usr/bin/env bash
# train_mlp --config with configurations mpopt must refuse: each run must fail with the exit code
# and the message given (the key's path first), and change nothing (it stops before training).
#   examples/config_errors.sh build/examples/train_mlp examples/configs
set -u
exe=$1
configs=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# expect NAME CODE NEEDLE ARGS...: runs train_mlp ARGS, which must exit with CODE and print NEEDLE.
expect() {
  local name=$1 code=$2 needle=$3
  shift 3
  local out rc
  out=$("$exe" --steps 2 "$@" 2>&1)
  rc=$?
  if [ "$rc" -eq "$code" ] && grep -qF -- "$needle" <<<"$out"; then
    echo "ok:   $name"
  else
    echo "FAIL: $name (exit $rc, expected $code and: $needle)"
    echo "$out" | sed 's/^/      /'
    failures=$((failures + 1))
  fi
}

# write NAME JSON: a configuration file in the work directory.
write() { printf '%s\n' "$2" >"$work/$1.json"; }

write stage3 '{"optimizer": {"type": "AdamW"}, "fp16": {"enabled": true}, "zero_optimization": {"stage": 3}}'
expect "ZeRO stage 3" 1 "stage3.json: zero_optimization.stage: 3 is not supported (mpopt has stages 0, 1 and 2" \
  --config "$work/stage3.json"

write betaz '{"optimizer": {"type": "Adam", "params": {"lr": 0.001, "betaz": [0.9, 0.999]}}}'
expect "misspelt optimizer parameter" 1 "optimizer.params.betaz: unknown key (Adam reads lr, betas" --config "$work/betaz.json"

write both '{"optimizer": {"type": "Adam"}, "fp16": {"enabled": true}, "bf16": {"enabled": true}}'
expect "fp16 and bf16 both enabled" 1 "bf16.enabled: fp16.enabled is true too" --config "$work/both.json"

write auto '{"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}'
expect "a Hugging Face placeholder" 1 'optimizer.params.lr: "auto" is a placeholder' --config "$work/auto.json"

write scheduler '{"optimizer": {"type": "Adam"}, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": 10}}}'
expect "a misspelt scheduler parameter" 1 "scheduler.params.warmup_num_step: unknown key (WarmupLR reads warmup_min_lr" \
  --config "$work/scheduler.json"

write torch_scheduler '{"optimizer": {"type": "Adam"}, "scheduler": {"type": "CosineAnnealingLR", "params": {"T_max": 10}}}'
expect "a torch.optim scheduler" 1 'scheduler.type: "CosineAnnealingLR" is not a schedule mpopt reads here' \
  --config "$work/torch_scheduler.json"

expect "--schedule beside a scheduler block" 2 "--schedule conflicts with --config" \
  --config "$configs/bf16_adamw_cosine.json" --schedule linear

write onebit_zero '{"optimizer": {"type": "OneBitLamb"}, "zero_optimization": {"stage": 2}}'
expect "OneBitLamb under ZeRO" 1 "zero_optimization.stage: 2 does not go with optimizer.type OneBitLamb" \
  --config "$work/onebit_zero.json"

write offload '{"optimizer": {"type": "Adam"}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}}'
expect "optimizer offload to NVMe" 1 'zero_optimization.offload_optimizer.device: "nvme" is not supported' \
  --config "$work/offload.json"

write two '{"optimizer": {"type": "Adam", "params": {"lr": "auto"}}, "zero_optimization": {"stage": 2, "overlap_com": true}}'
expect "two problems, one run" 1 "2 problems:" --config "$work/two.json"
expect "... the second named too" 1 "zero_optimization.overlap_com: unknown key" --config "$work/two.json"

write broken '{"optimizer": {"type": "Adam"}'
expect "not JSON" 1 "broken.json: not valid JSON" --config "$work/broken.json"

expect "a missing file" 1 "cannot open the DeepSpeed configuration" --config "$work/none.json"

expect "--precision beside --config" 2 "--precision conflicts with --config: the configuration decides it (fp16.enabled and bf16.enabled)" \
  --config "$configs/fp16_adamw.json" --precision bf16
expect "--rule beside --config" 2 "--rule conflicts with --config: the configuration decides it (optimizer.type)" \
  --config "$configs/fp16_adamw.json" --rule lamb
expect "--batch beside train_micro_batch_size_per_gpu" 2 "--batch conflicts with --config" \
  --config "$configs/fp16_adamw.json" --batch 8
expect "--compare-fp32 with a value it does not know" 2 "--compare-fp32" --compare-fp32 maybe

# And the shipped configurations are all accepted (two steps each).
for f in "$configs"/*.json; do
  expect "$(basename "$f") is accepted" 0 "done: train loss" --config "$f"
done

[ "$failures" -eq 0 ] || { echo "$failures case(s) failed"; exit 1; }
echo "all cases passed"
