#!/usr/bin/env bash
# Two builds' speed in one GPU call: runs `bench train` with the same arguments from bundle A
# and bundle B (each made by scripts/gpu_bundle.sh), alternating A, B, A, B, ... so drift of
# the machine falls on both, and prints each run's tokens/s per GPU and peak memory, then the
# ratio B / A of the median tokens/s. A speed claim against an earlier build is this ratio
# (docs/PERFORMANCE.md, "How speed is measured"). Run on the GPU machine from the repository
# root; each run's full output goes to --log-dir (default $OUT/ab-bench, else /tmp/ab-bench).
#
#   scripts/ab_bench.sh A_DIR B_DIR [--pairs N] [--log-dir DIR] -- BENCH_TRAIN_ARGS...
#   scripts/ab_bench.sh .device/before .device/after --pairs 2 -- --workload gpt2-124m \
#       --steps 8 --warmup 2 ddp.data_parallel_sharding_strategy=no_shard
set -uo pipefail
usage() { sed -n '2,11p' "$0"; }

[ $# -ge 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; } && { usage; exit 0; }
[ $# -ge 2 ] || { usage >&2; exit 2; }
dir_a="$1" dir_b="$2"
shift 2
pairs=2 logs="${OUT:-/tmp}/ab-bench"
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  case "$1" in
    --pairs) pairs="${2:-}"; shift 2 ;;
    --log-dir) logs="${2:-}"; shift 2 ;;
    *) echo "error: unknown argument $1 (bench arguments go after --)" >&2; exit 2 ;;
  esac
done
[ "${1:-}" = -- ] && shift
[[ "$pairs" =~ ^[1-9][0-9]*$ ]] || { echo "error: --pairs needs a positive count, got '$pairs'" >&2; exit 2; }
[ $# -gt 0 ] || { echo "error: no bench train arguments after --" >&2; exit 2; }
for d in "$dir_a" "$dir_b"; do
  [ -f "$d/bundle.tar.xz" ] || { echo "error: no bundle.tar.xz in $d (scripts/gpu_bundle.sh makes one)" >&2; exit 2; }
done
mkdir -p "$logs"

# Unpack each bundle into a folder of its own (gpu_env.sh unpacks into $TMPDIR/fsdp-bundle)
# and keep the library path it sets up, so each side runs with its own bundle's libraries.
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
declare -A bench libs
base_libs="${LD_LIBRARY_PATH:-}"
for side in A B; do
  src="$dir_a"; [ "$side" = B ] && src="$dir_b"
  mkdir -p "$root/$side"
  export LD_LIBRARY_PATH="$base_libs"
  # shellcheck source=scripts/gpu_env.sh
  TMPDIR="$root/$side" source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh" "$src" || exit 1
  bench[$side]="$bundle/tools/bench"
  libs[$side]="$LD_LIBRARY_PATH"
done

# "596k" / "1.13M" / "950" -> a plain number.
to_number() {
  awk -v v="$1" 'BEGIN { m = 1; if (v ~ /k$/) m = 1e3; else if (v ~ /M$/) m = 1e6;
                         sub(/[kM]$/, "", v); printf "%.0f\n", v * m }'
}
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2];
                                                else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

: > "$root/A.speeds"
: > "$root/B.speeds"
failed=0
for ((i = 1; i <= pairs; i++)); do
  for side in A B; do
    log="$logs/${side}_$i.txt"
    LD_LIBRARY_PATH="${libs[$side]}" "${bench[$side]}" train "$@" > "$log" 2>&1
    rc=$?
    speed="$(grep 'tokens/s per GPU' "$log" | tail -1 | awk '{ print $NF }')"
    peak="$(grep 'peak allocated' "$log" | tail -1 | sed 's/^ *peak allocated *//')"
    printf '%s run %d: rc=%d  tokens/s per GPU %s  peak allocated %s\n' "$side" "$i" "$rc" \
      "${speed:-?}" "${peak:-?}"
    if [ "$rc" -ne 0 ] || [ -z "$speed" ]; then failed=1; continue; fi
    to_number "$speed" >> "$root/$side.speeds"
  done
done
[ "$failed" -eq 0 ] || { echo "error: a run failed; its output is in $logs" >&2; exit 1; }
a="$(median < "$root/A.speeds")" b="$(median < "$root/B.speeds")"
awk -v a="$a" -v b="$b" -v n="$pairs" 'BEGIN {
  printf "median tokens/s per GPU over %d runs each: A %.0f, B %.0f; B / A = %.3f\n", n, a, b, b / a }'
