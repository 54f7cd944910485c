#!/usr/bin/env bash
# The memory plan against the device, mode by mode: for each memory mode of one model, the
# dry run's predicted peak (`train --dry-run`) and the peak `bench train` measures (the
# caching allocator's high-water mark over a short run), as a Markdown table with the
# difference and the GPU's memory the allocator does not hold (what the plan cannot give the
# model), ending with "N passed, N failed" (a row passes within LIMIT_PCT, default 3%).
# From the repository root of a GPU machine, with the bundle of scripts/gpu_bundle.sh:
#
#   scripts/memory_table.sh [BUNDLE_DIR] [LOG_DIR]
#
# CONFIG (default configs/llama3-8b.json) and BASE (its overrides) choose the model; MODES
# lists "label:key=value,key=value" rows, one per line (default: the 8B's modes on one GPU:
# FP8 with CPU offload in step and overlapped, full recompute of the first 8 and 16 blocks
# and of all 32, selective recompute, and bf16; then recompute of 4 blocks and of none,
# the plan's limit on an 80 GB GPU). FP8 weight gathers (fp8_param) are refused
# with CPU offload, so their row needs a model that fits without it: e.g. CONFIG=
# configs/llama-1b.json BASE="ddp.data_parallel_sharding_strategy=optim_grads_params
# mixed_precision.fp8=hybrid" MODES="fp8_param:mixed_precision.fp8_param=true". Each row
# runs 2 steps after 1 warm-up step (BASE's global batch: 2 micro-batches of 1 × 8192).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh" "${1:-.device}"
L="${2:-${OUT:-/tmp}/memory-table}"
mkdir -p "$L"
CONFIG="${CONFIG:-configs/llama3-8b.json}"
LIMIT_PCT="${LIMIT_PCT:-3}"
read -r -a base <<< "${BASE:-model.seq_length=8192 train.micro_batch_size=1 train.global_batch_size=2 \
optimizer.cpu_offload=true optimizer.moments_dtype=bf16 ddp.grad_reduce_in_fp32=false \
ddp.data_parallel_sharding_strategy=optim_grads_params mixed_precision.fp8=hybrid \
mixed_precision.fp8_recipe=delayed model.activation_recompute=full}"
MODES="${MODES:-offload_n8:model.recompute_num_layers=8
overlapped_n8:model.recompute_num_layers=8,optimizer.overlap_cpu_offload=true
offload_n16:model.recompute_num_layers=16
offload_all:model.recompute_num_layers=-1
selective:model.activation_recompute=selective
bf16_n8:model.recompute_num_layers=8,mixed_precision.fp8=null
offload_n4:model.recompute_num_layers=4
offload_n0:model.recompute_num_layers=0}"
trap 'pkill -TERM -P $$; exit 143' TERM INT

# "64.7 GiB" / "512 MiB" / "12 KiB" / "7 B" -> bytes (awk, as a number)
bytes() { awk '{v=$1; u=$2; m=1; if(u=="KiB")m=1024; if(u=="MiB")m=1048576; if(u=="GiB")m=1073741824; if(u=="TiB")m=1099511627776; printf "%.0f", v*m}'; }

rows=() passed=0 failed=0
while IFS= read -r mode; do
  [ -z "$mode" ] && continue
  label="${mode%%:*}"
  IFS=, read -r -a extra <<< "${mode#*:}"
  args=(--config "$CONFIG" "${base[@]}" "${extra[@]}")
  RANK=0 WORLD_SIZE=1 "$bundle/tools/train" "${args[@]}" --dry-run dist.device=cuda > "$L/$label.dry.txt" 2>&1
  predicted="$(grep -m1 "predicted peak" "$L/$label.dry.txt" | awk '{print $3, $4}')"
  waited timeout "${RUN_LIMIT:-240}" "$bundle/tools/bench" train "${args[@]}" --steps 2 --warmup 1 \
    > "$L/$label.bench.txt" 2>&1
  rc=$?
  measured="$(grep -m1 "peak allocated" "$L/$label.bench.txt" | awk '{print $3, $4}')"
  outside="$(grep -m1 "outside allocator" "$L/$label.bench.txt" | awk '{print $3, $4}')"
  echo "== $label rc=$rc predicted ${predicted:-?} measured ${measured:-?} outside ${outside:-?} ($(date +%T))"
  if [ -z "$predicted" ] || [ -z "$measured" ]; then
    reason="$(grep -h -m1 -iE "error|out of memory" "$L/$label.bench.txt" "$L/$label.dry.txt" | cut -c1-160)"
    rows+=("| $label | ${predicted:-?} | ${measured:-no result (rc $rc): ${reason:-see $label.bench.txt}} | | FAIL | ${outside:-?} |")
    failed=$((failed + 1))
    continue
  fi
  p="$(echo "$predicted" | bytes)" m="$(echo "$measured" | bytes)"
  diff="$(awk -v p="$p" -v m="$m" 'BEGIN {printf "%+.1f%%", 100 * (p - m) / m}')"
  ok="$(awk -v p="$p" -v m="$m" -v l="$LIMIT_PCT" 'BEGIN {d = 100 * (p - m) / m; print (d <= l && d >= -l) ? "pass" : "FAIL"}')"
  rows+=("| $label | $predicted | $measured | $diff | $ok | ${outside:-?} |")
  if [ "$ok" = pass ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done <<< "$MODES"

{
  echo "| mode | predicted (dry run) | measured peak allocated | predicted − measured | within ${LIMIT_PCT}% | GPU memory outside the allocator |"
  echo "|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$L/memory_table.md"
echo "$passed passed, $failed failed"
