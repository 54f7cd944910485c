#!/usr/bin/env bash
# Builds the CUDA configuration and gathers what a GPU machine needs to run the tests, the
# tools and the benchmarks into one folder (default .device/), so that the folder can be
# copied to a machine without Bazel and run there with scripts/gpu_run.sh.
#
#   scripts/gpu_bundle.sh [OUT_DIR]
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

out="${1:-.device}"
[ "$BAZEL_CONFIG" = "cuda" ] || { echo "error: a CUDA toolkit is needed to build the GPU bundle" >&2; exit 1; }

tests=$(bazel query 'kind("cc_test", //tests/...)' 2>/dev/null)
tools=$(bazel query 'kind("cc_binary", //tools/...)' 2>/dev/null)
bazel build "${BAZEL_FLAGS[@]}" $tests $tools

rm -rf "$out"
mkdir -p "$out/tests" "$out/tools"
bin="$(bazel info "${BAZEL_FLAGS[@]}" bazel-bin 2>/dev/null)"
mpi_tests=$(bazel query 'kind("sh_test", //tests/...)' 2>/dev/null)
: > "$out/mpi.txt"
for t in $tests; do
  p="${t#//}"
  f="$(echo "${p%%:*}" | tr / _)__${p##*:}"
  # Only binaries with GPU test cases: the rest run (and are checked) on any machine.
  grep -q '\[gpu\]' "$bin/${p/://}" || continue
  cp "$bin/${p/://}" "$out/tests/$f"
  # Multi-process copies are declared as sh_tests named LABEL_npN: record "FILE N".
  for m in $(printf '%s\n' $mpi_tests | grep -E "^${t}_np[0-9]+$"); do
    echo "$f ${m##*_np}" >> "$out/mpi.txt"
  done
done
for t in $tools; do
  p="${t#//}"
  cp "$bin/${p/://}" "$out/tools/${p##*:}"
done
strip --strip-debug "$out"/tests/* "$out"/tools/* 2>/dev/null || true
du -sh "$out"
