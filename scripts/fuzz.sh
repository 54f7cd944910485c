#!/usr/bin/env bash
# Runs the fuzz targets of tests/fuzz under libFuzzer (clang, with AddressSanitizer and
# UndefinedBehaviorSanitizer; leaks are findings too), each for a fixed time, and prints
# executions and coverage per target. Ends with "N passed, N failed" counting targets.
#
#   scripts/fuzz.sh                          # every target, 60 s each
#   scripts/fuzz.sh --seconds 600 --jobs 2   # 10 minutes each, two at a time
#   scripts/fuzz.sh --seconds 20 recipe tokenizer
#
# Each target starts from its seed corpus (tests/fuzz/corpus/<target>) plus what earlier
# runs on this machine found worth keeping (~/.cache/fsdp.cpp/fuzz/corpus/<target>). An
# input that crashes, leaks, hangs or breaks a target's property is saved under
# ~/.cache/fsdp.cpp/fuzz/findings/<target>/; copy it into tests/fuzz/corpus/<target>/ with
# the fix, where <target>_corpus_test replays it in every test run.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

seconds=60 jobs=1 targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "error: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
ALL_TARGETS=(recipe safetensors metadata llmc_shard megatron_idx tokenizer tokenize_jsonl rendezvous)
[ ${#targets[@]} -eq 0 ] && targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
  [ -d "tests/fuzz/corpus/$t" ] || { echo "error: no fuzz target \"$t\" (${ALL_TARGETS[*]})" >&2; exit 2; }
done

# clang and its libFuzzer runtime.
PACKAGES=(clang libclang-rt-14-dev)
install_missing_packages

FUZZ_DIR="$CACHE_DIR/fuzz"
FUZZ_BAZEL=(bazel --output_base="$CACHE_DIR/bazel-fuzz")
claim_output_base "$CACHE_DIR/bazel-fuzz" || exit 1
# No bazel-* links in the checkout (scripts/sanitize.sh says why).
FUZZ_FLAGS=(--disk_cache="$CACHE_DIR/bazel-disk" --config=fuzz --symlink_prefix=/)
labels=()
for t in "${targets[@]}"; do labels+=("//tests/fuzz:${t}_fuzzer"); done
"${FUZZ_BAZEL[@]}" build "${FUZZ_FLAGS[@]}" "${labels[@]}"
bin_dir="$("${FUZZ_BAZEL[@]}" info "${FUZZ_FLAGS[@]}" bazel-bin 2>/dev/null)/tests/fuzz"

# One target: fuzz for $seconds, then summarize its log in one line of $FUZZ_DIR/<t>.result.
run_target() {
  set +e  # a finding is reported below, not by ending the script
  local t="$1" work="$FUZZ_DIR/corpus/$1" findings="$FUZZ_DIR/findings/$1" log="$FUZZ_DIR/$1.log"
  mkdir -p "$work" "$findings"
  rm -f "$findings"/* "$FUZZ_DIR/$t.result"
  local rc
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$bin_dir/${t}_fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2560 \
      -print_final_stats=1 -artifact_prefix="$findings/" "$work" "tests/fuzz/corpus/$t" \
      >"$log" 2>&1
  rc=$?
  local execs cov ft corp
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  cov=$(grep -o ' cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  ft=$(grep -o ' ft: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  corp=$(grep -o ' corp: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  local found
  found=$(find "$findings" -type f | wc -l)
  echo "$t ${execs:-0} ${cov:-0} ${ft:-0} ${corp:-0} $found $rc" >"$FUZZ_DIR/$t.result"
}

mkdir -p "$FUZZ_DIR"
echo "fuzzing ${#targets[@]} targets for ${seconds} s each, $jobs at a time"
running=0
for t in "${targets[@]}"; do
  run_target "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
done
wait || true

passed=0 failed=0
printf '%-14s %12s %10s %8s %8s %8s  %s\n' target executions exec/s edges features corpus result
for t in "${targets[@]}"; do
  if [ ! -f "$FUZZ_DIR/$t.result" ]; then
    echo "$t: no result (see $FUZZ_DIR/$t.log)"; failed=$((failed + 1)); continue
  fi
  read -r _ execs cov ft corp found rc <"$FUZZ_DIR/$t.result"
  verdict="ok"
  if [ "$found" -gt 0 ] || [ "$rc" -ne 0 ]; then
    verdict="FAILED: $found finding(s) in $FUZZ_DIR/findings/$t/, log $FUZZ_DIR/$t.log"
    failed=$((failed + 1))
  else
    passed=$((passed + 1))
  fi
  printf '%-14s %12s %10s %8s %8s %8s  %s\n' "$t" "$execs" "$((execs / seconds))" "$cov" "$ft" "$corp" "$verdict"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
