#!/usr/bin/env bash
# Runs a bundle made by scripts/gpu_bundle.sh on a GPU machine (no Bazel needed there):
# every test binary's GPU cases (the multi-process ones under mpirun with their rank counts),
# writing one log per binary to LOG_DIR and one summary line per binary as it finishes, with
# the collective backend it ran over (also appended to LOG_DIR/summary.txt, so a run stopped
# early keeps the lines of what finished). Multi-process runs with more ranks than GPUs use
# the staged backend (the ranks share the GPUs); nothing is skipped for lack of GPUs.
#
#   [ONLY=REGEX] [SPEC='[gpu]'] [TEST_TIMEOUT=S] scripts/gpu_run.sh [BUNDLE_DIR] [LOG_DIR]
#
# SPEC is the Catch test spec every binary runs: by default its [gpu] cases only, since the
# CPU cases are the CI's (SPEC= runs every case). ONLY keeps the binaries whose names match
# (e.g. 'kernel_twins' or 'parallel|train'), to split the run over several calls. Each
# binary stops after TEST_TIMEOUT seconds (default 400); its line then says rc=124.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh" "${1:-.device}"
logs="${2:-${OUT:-/tmp}/gpu-logs}"
mkdir -p "$logs"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
spec=("${SPEC-[gpu]}")
[ -z "${spec[0]}" ] && spec=()
only="${ONLY:-}"
limit="${TEST_TIMEOUT:-400}"
trap 'pkill -TERM -P $$; exit 143' TERM INT  # runs started with `waited` (gpu_env.sh) stop too

line() { echo "$1" | tee -a "$logs/summary.txt"; }
run_one() {  # name, backend, command...
  local name="$1" backend="$2"; shift 2
  local start=$SECONDS
  FSDP_TEST_GPU_BACKEND="$backend" waited timeout "$limit" "$@" "${spec[@]}" > "$logs/$name.log" 2>&1
  local rc=$?
  local cases
  cases=$(grep -E "^(test cases|All tests passed)" "$logs/$name.log" | tail -1)
  line "$(printf '%-50s %-7s rc=%-3d %4ds  %s' "$name" "$backend" "$rc" $((SECONDS - start)) "$cases")"
}

for t in "$bundle"/tests/*; do
  name=$(basename "$t")
  [ -n "$only" ] && ! [[ "$name" =~ $only ]] && continue
  run_one "$name" nccl "$t"
  # The same binary under mpirun, for each rank count its sh_tests declare: over NCCL with
  # one GPU per rank where there are enough GPUs, otherwise over the staged backend with the
  # ranks sharing the GPUs (NCCL refuses two ranks on one device).
  for n in $(awk -v f="$name" '$1 == f { print $2 }' "$bundle/mpi.txt" 2>/dev/null); do
    backend=nccl
    [ "$n" -gt "$ngpu" ] && backend=staged
    run_one "${name}_np$n" "$backend" mpirun --allow-run-as-root --oversubscribe -np "$n" \
      -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x FSDP_TEST_GPU_BACKEND "$t"
  done
done
