#!/usr/bin/env bash
# Runs a bundle made by scripts/gpu_bundle.sh on a GPU machine (no Bazel needed there):
# every test binary (the multi-process ones under mpirun with their rank counts), writing one
# log per binary to LOG_DIR and printing a summary table last.
#
#   scripts/gpu_run.sh [BUNDLE_DIR] [LOG_DIR]
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh" "${1:-.device}"
logs="${2:-${OUT:-/tmp}/gpu-logs}"
mkdir -p "$logs"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)

summary=()
run_one() {  # name, command...
  local name="$1"; shift
  local start=$SECONDS
  "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  local cases
  cases=$(grep -E "^(test cases|All tests passed)" "$logs/$name.log" | tail -1)
  summary+=("$(printf '%-50s rc=%-3d %4ds  %s' "$name" "$rc" $((SECONDS - start)) "$cases")")
}

for t in "$bundle"/tests/*; do
  name=$(basename "$t")
  run_one "$name" "$t"
  # The same binary under mpirun, for each rank count its sh_tests declare (if GPUs allow).
  for n in $(awk -v f="$name" '$1 == f { print $2 }' "$bundle/mpi.txt" 2>/dev/null); do
    # One GPU per rank (NCCL refuses two ranks on one device).
    if [ "$n" -gt "$ngpu" ]; then
      summary+=("$(printf '%-50s skipped: needs %d GPUs' "${name}_np$n" "$n")")
      continue
    fi
    run_one "${name}_np$n" mpirun --allow-run-as-root -np "$n" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE "$t"
  done
done
printf '%s\n' "${summary[@]}"
