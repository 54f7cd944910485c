#!/usr/bin/env bash
# Runs the tests under the sanitizers (CPU-only builds, in an output base of their own):
# AddressSanitizer + UndefinedBehaviorSanitizer over every test, and ThreadSanitizer over
# the tests of the threaded parts (thread pool, watchdog, rendezvous, overlapped offload).
# Any report fails its test. Ends with "N passed, N failed" counting test cases.
#
#   scripts/sanitize.sh            # ASan+UBSan on every test, then TSan
#   scripts/sanitize.sh --ci       # ASan+UBSan on the unit tests and the 2-rank tests
#   scripts/sanitize.sh asan //tests/data/...
#   scripts/sanitize.sh tsan
#
# Leaks inside Open MPI are suppressed (tests/sanitizers/lsan.supp says why); nothing else is.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

mode=all ci=0 targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --ci) ci=1; shift ;;
    asan|tsan|all) mode="$1"; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    //*) targets+=("$1"); shift ;;
    *) echo "error: unknown argument $1" >&2; exit 2 ;;
  esac
done

SAN_BAZEL=(bazel --output_base="$CACHE_DIR/bazel-sanitize")
claim_output_base "$CACHE_DIR/bazel-sanitize" || exit 1
# No bazel-* links in the checkout: they would point into this output base, and the main
# build's `//...` would then wander into them (scripts/test.sh after this script failed).
COMMON=(--disk_cache="$CACHE_DIR/bazel-disk" --symlink_prefix=/
        --workspace_status_command="$REPO_ROOT/scripts/workspace_status.sh")
# Sanitized code runs several times slower: longer timeouts for every test size.
TIMEOUTS=(--test_timeout=1200,2400,4800,9600)
# Left out: tests that need a GPU; benchmarks (timing, not correctness); and the consumer
# test, which links the installed shared library and a CMake project outside Bazel's flags
# (without the sanitizer runtime they cannot link).
EXCLUDED="attr(tags, 'gpu', tests(//tests/...)) + attr(name, 'bench_', tests(//tests/...)) + //tests/consumer:consumer_test"

# The tests to run in one mode, one label per line.
select_tests() {
  local universe="tests(//tests/...)"
  [ ${#targets[@]} -gt 0 ] && universe="tests(set(${targets[*]}))"
  local query="$universe except ($EXCLUDED)"
  # The CI subset: unit tests and 2-rank tests. Left to the full run: the 4-rank copies, the
  # whole-run shell tests, and the long numerics tests whose code the subset runs anyway
  # (finite differences over whole models, the golden curve, the kernel twins at GPU shapes,
  # the FP8 recipes' 2-rank layouts, whose training code fp8_train_test runs on one rank and
  # fp8_param_test_np2 on two; Muon's layouts, whose step and exchange sharded_parity_test_np2
  # runs), each several minutes under ASan on two cores; and the memory plan's measured
  # peaks (a minute under ASan), whose FP8, offload and recompute steps the FP8, offload and
  # recompute tests run.
  local slow="set(//tests/nn:gradcheck_test //tests/train:golden_curve_test //tests/train:golden_curve_test_np2 //tests/kernels:kernel_twins_test //tests/train:fp8_train_test_np2 //tests/train:muon_layouts_test_np2 //tests/train:memory_plan_test)"
  [ "$ci" -eq 1 ] && query="$query except attr(name, '_np4$', $universe) except kind('sh_test', attr(name, '_test$', $universe)) except $slow"
  "${SAN_BAZEL[@]}" query "$query" 2>/dev/null | sort
}

total_passed=0 total_failed=0
run_mode() {
  local config="$1"; shift
  local labels=("$@")
  echo "== $config: ${#labels[@]} tests"
  set +e
  "${SAN_BAZEL[@]}" test "${COMMON[@]}" --config="$config" "${TIMEOUTS[@]}" --keep_going \
    --test_env=LSAN_OPTIONS="suppressions=$REPO_ROOT/tests/sanitizers/lsan.supp:fast_unwind_on_malloc=0" \
    --test_output=errors "${labels[@]}"
  local rc=$?
  set -e
  local testlogs
  testlogs="$("${SAN_BAZEL[@]}" info "${COMMON[@]}" --config="$config" bazel-testlogs 2>/dev/null)"
  local p f skipped
  read -r p f skipped < <(count_test_cases "$testlogs" "${labels[@]}")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then echo "bazel test exited with status $rc"; f=1; fi
  echo "$config: $p passed, $f failed"
  total_passed=$((total_passed + p)); total_failed=$((total_failed + f))
}

if [ "$mode" = asan ] || [ "$mode" = all ]; then
  mapfile -t asan_tests < <(select_tests)
  run_mode asan "${asan_tests[@]}"
fi
if { [ "$mode" = tsan ] || [ "$mode" = all ]; } && [ "$ci" -eq 0 ]; then
  run_mode tsan //tests/core:core_test //tests/collectives:watchdog_test \
    //tests/collectives:bootstrap_test //tests/optim:offload_test
fi
echo "$total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ]
