#!/usr/bin/env bash
# Device time per kernel over a benchmark's timed steps (Nsight Compute, one metric, clocks
# left as they are): writes LOG_DIR/NAME.csv and LOG_DIR/NAME.txt, a table of the kernels
# by total time per step (tools/bench/kernel_table.py).
#
#   scripts/kernel_profile.sh BUNDLE_DIR LOG_DIR NAME STEPS [bench train arguments...]
# e.g. scripts/kernel_profile.sh .device logs gpt2 1 --workload gpt2-124m --steps 1 \
#        --warmup 1 train.global_batch_size=64 ddp.data_parallel_sharding_strategy=no_shard
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$here/scripts/gpu_env.sh" "$1"
log="$2" name="$3" steps="$4"
shift 4
mkdir -p "$log"
ncu="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"
"$ncu" --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
  --log-file "$log/$name.csv" "$bundle/tools/bench" train --profile "$@" > "$log/$name.bench.txt" 2>&1
python3 "$here/tools/bench/kernel_table.py" "$log/$name.csv" --steps "$steps" > "$log/$name.txt"
cat "$log/$name.txt"
