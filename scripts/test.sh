#!/usr/bin/env bash
# Builds everything and runs every test: unit tests and the multi-process tests under
# mpirun. Ends with one line "N passed, N failed" counting test cases (GPU test cases on a
# machine without a GPU are counted apart, as skipped).
#
#   scripts/test.sh                 # all tests
#   scripts/test.sh //tests/core/...  # some of them
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(//...)

set +e
bazel test "${BAZEL_FLAGS[@]}" --test_output=errors --keep_going "${targets[@]}"
bazel_rc=$?
set -e

testlogs="$(bazel info "${BAZEL_FLAGS[@]}" bazel-testlogs 2>/dev/null)"
mapfile -t labels < <(bazel query "tests(set(${targets[*]}))" 2>/dev/null | sort)
read -r passed failed skipped < <(count_test_cases "$testlogs" "${labels[@]}")

if [ "$bazel_rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "bazel test exited with status $bazel_rc"
  failed=1
fi
[ "$skipped" -gt 0 ] && echo "$skipped skipped (GPU tests without a GPU, or a CPU-only build)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
