#!/usr/bin/env bash
# The scaling measurements (1, 2, 4 and 8 GPUs): run on a GPU machine from the bundle that
# scripts/gpu_bundle.sh makes (no Bazel there), from the repository root. Prints one line per run and keeps the full
# outputs in LOG_DIR. Runs whatever fits the GPUs the machine has.
#
#   scripts/scaling.sh [BUNDLE_DIR] [LOG_DIR]
#
# Rows: GPT-2 124M and GPT 1.3B at ZeRO-1 and ZeRO-3 on 1, 2, 4, 8 GPUs (tokens/s per GPU;
# scaling efficiency = per-GPU tokens/s at N / at 1), a 7B Llama-style model at ZeRO-3 on 8
# GPUs, and HSDP (2 replicas x 4 shards) against full sharding on 8 GPUs. Each `bench train`
# line also prints peak memory per GPU, to compare with the printed prediction.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh" "${1:-.device}"
logs="${2:-${OUT:-/tmp}/scaling}"
mkdir -p "$logs"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
bench="$bundle/tools/bench"

run() {  # name, ranks, bench args...
  local name="$1" n="$2"; shift 2
  [ "$n" -le "$ngpu" ] || return 0
  "${MPIRUN[@]}" -np "$n" "$bench" train "$@" > "$logs/$name.txt" 2>&1
  printf '%-40s rc=%d  %s | %s | %s\n' "$name" $? \
    "$(grep 'tokens/s per GPU' "$logs/$name.txt")" "$(grep '^MFU' "$logs/$name.txt")" \
    "$(grep 'peak allocated' "$logs/$name.txt")"
}

for n in 1 2 4 8; do
  for st in optim optim_grads_params; do
    run "gpt2-124m_${st}_${n}gpu" "$n" --workload gpt2-124m --steps 10 --warmup 2 \
      ddp.data_parallel_sharding_strategy=$st train.global_batch_size=$((64 * n))
    run "gpt-1.3b_${st}_${n}gpu" "$n" --workload gpt-1.3b --steps 6 --warmup 2 \
      ddp.data_parallel_sharding_strategy=$st train.global_batch_size=$((16 * n))
  done
done
run "llama-7b_zero3_8gpu" 8 --config configs/llama-7b.json --steps 5 --warmup 2 --compute-baseline \
  train.global_batch_size=16
run "gpt-1.3b_hsdp_2x4" 8 --workload gpt-1.3b --steps 6 --warmup 2 --compute-baseline \
  dist.dp_outer=2 dist.dp_shard=4 train.global_batch_size=128
run "gpt-1.3b_fsdp_1x8" 8 --workload gpt-1.3b --steps 6 --warmup 2 --compute-baseline \
  dist.dp_outer=1 dist.dp_shard=8 train.global_batch_size=128
