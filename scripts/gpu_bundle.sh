#!/usr/bin/env bash
# Builds the CUDA configuration and packs what a GPU machine needs to run the GPU tests, the
# tools and the benchmarks into OUT_DIR/bundle.tar.xz (default .device/; xz keeps it a few
# MB), to be copied to a machine without Bazel and used there by scripts/gpu_run.sh (the GPU
# tests), scripts/gpu_validate.sh (parity, training and benchmark checks) and
# scripts/scaling.sh.
#
#   scripts/gpu_bundle.sh [OUT_DIR]
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

out="${1:-.device}"
[ "$BAZEL_CONFIG" = "cuda" ] || { echo "error: a CUDA toolkit is needed to build the GPU bundle" >&2; exit 1; }

tests=$(bazel query 'kind("cc_test", //tests/...)' 2>/dev/null)
tools=$(bazel query 'kind("cc_binary", //tools/...)' 2>/dev/null)
bazel build "${BAZEL_FLAGS[@]}" $tests $tools

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
final="$out"
out="$stage"
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
# The GPU machine may lack OpenBLAS's OpenMP build (the CPU matmul's, kernels/cpu/matmul.h):
# it travels in lib/ with the Fortran runtime it loads, and gpu_env.sh puts lib/ first on
# LD_LIBRARY_PATH (ahead of the binaries' run path and of any other OpenBLAS build there).
mkdir -p "$out/lib"
libs=$(ldd "$out/tools/train" | awk '$1 ~ /^lib(openblas|gfortran|quadmath)\./ { print $3 }')
[ "$(echo "$libs" | wc -w)" -eq 3 ] || {
  echo "error: expected libopenblas, libgfortran and libquadmath in ldd tools/train, got: $libs" >&2
  exit 1
}
for l in $libs; do cp -L "$l" "$out/lib/$(basename "$l")"; done
mkdir -p "$final"
tar cJf "$final/bundle.tar.xz" -C "$stage" tests tools lib mpi.txt
ls -la "$final/bundle.tar.xz"
