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

# Count test cases from each test target's JUnit XML (written by our test main, or by
# Bazel itself for a test that crashed). A test that did not build or run counts as failed.
testlogs="$(bazel info "${BAZEL_FLAGS[@]}" bazel-testlogs 2>/dev/null)"
passed=0 failed=0 skipped=0
while read -r label; do
  [ -z "$label" ] && continue
  path="${label#//}"
  xml="$testlogs/${path/://}/test.xml"
  if [ ! -f "$xml" ]; then
    echo "no result for $label (did not build or did not run)"
    failed=$((failed + 1))
    continue
  fi
  read -r t f e s < <(awk '
    /<testsuite[ >]/ {
      line = $0
      if (match(line, /tests="[0-9]+"/))    t += substr(line, RSTART + 7, RLENGTH - 8)
      if (match(line, /failures="[0-9]+"/)) f += substr(line, RSTART + 10, RLENGTH - 11)
      if (match(line, /errors="[0-9]+"/))   e += substr(line, RSTART + 8, RLENGTH - 9)
      if (match(line, /skipped="[0-9]+"/))  s += substr(line, RSTART + 9, RLENGTH - 10)
    }
    END { print t + 0, f + 0, e + 0, s + 0 }' "$xml")
  bad=$((f + e))
  passed=$((passed + t - bad - s))
  failed=$((failed + bad))
  skipped=$((skipped + s))
done < <(bazel query "tests(set(${targets[*]}))" 2>/dev/null | sort)

if [ "$bazel_rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "bazel test exited with status $bazel_rc"
  failed=1
fi
[ "$skipped" -gt 0 ] && echo "$skipped skipped (GPU tests without a GPU, or a CPU-only build)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
