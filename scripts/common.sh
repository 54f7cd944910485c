# Shared set-up for scripts/train.sh and scripts/test.sh (sourced, not run).
# Installs what is missing on a Debian/Ubuntu machine, chooses the build configuration
# (CUDA when a toolkit is present, CPU-only otherwise) and the Bazel flags.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

PACKAGES=(bazel-bootstrap catch2 nlohmann-json3-dev libopenmpi-dev openmpi-bin libopenblas-openmp-dev g++ ca-certificates
          zlib1g-dev cmake make pkg-config)

install_missing_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "Installing missing packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || {
      echo "error: need root (or sudo) to install: ${missing[*]}" >&2
      exit 1
    }
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

install_missing_packages

CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export CUDA_HOME
CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/fsdp.cpp"
mkdir -p "$CACHE_DIR"

# Bazel's disk cache never shrinks by itself: keep it under FSDP_DISK_CACHE_GIB (default 12)
# by deleting its least recently used entries (Bazel refreshes an entry's mtime on each hit),
# so repeated builds cannot fill the disk.
prune_disk_cache() {
  local dir="$1" limit_kib=$(( $2 * 1024 * 1024 ))
  [ -d "$dir" ] || return 0
  local used_kib
  # (A concurrent build may remove entries while du reads: its complaints are not errors.)
  used_kib="$(du -sk "$dir" 2>/dev/null | cut -f1 || true)"
  [ "${used_kib:-0}" -le "$limit_kib" ] && return 0
  local target_kib=$(( limit_kib * 3 / 4 )) freed_kib=0 size path
  echo "notice: Bazel disk cache $dir holds $((used_kib / 1024)) MiB; pruning its oldest entries to $((target_kib / 1024)) MiB."
  while read -r _ size path; do
    [ $(( used_kib - freed_kib )) -le "$target_kib" ] && break
    rm -f -- "$path" && freed_kib=$(( freed_kib + size / 1024 ))
  done < <(find "$dir" -type f -printf '%T@ %s %p\n' 2>/dev/null | sort -n)
}
prune_disk_cache "$CACHE_DIR/bazel-disk" "${FSDP_DISK_CACHE_GIB:-12}"
free_mib="$(df -Pm "$CACHE_DIR" | awk 'NR == 2 {print $4}')"
if [ "${free_mib:-0}" -lt 4096 ]; then
  echo "warning: only ${free_mib} MiB free on the disk holding $CACHE_DIR; a full build and test run needs about 10 GiB." >&2
fi
BAZEL_FLAGS=(--disk_cache="$CACHE_DIR/bazel-disk")

# The sanitizers and fuzzers build in output bases of their own under $CACHE_DIR, which every
# checkout on this machine shares. Bazel keeps a test's runfiles tree while the files in it
# are unchanged, and the tree links each source file by its absolute path in the checkout
# that built it: after another checkout (a CI machine's next clean clone), tests would read
# data through links into the old one, or into nothing when it is gone. BASE.checkout names
# the checkout that last built in BASE; any other (or none recorded) cleans BASE first, and
# its outputs come back from the disk cache.
claim_output_base() {
  local base="$1" owner
  owner="$(cat "$base.checkout" 2>/dev/null || true)"
  if [ -d "$base" ] && [ "$owner" != "$REPO_ROOT" ]; then
    echo "notice: cleaning $base (last used from ${owner:-an unrecorded checkout}) for $REPO_ROOT."
    bazel --output_base="$base" clean >/dev/null 2>&1 ||
      { echo "error: bazel clean of $base failed" >&2; return 1; }
  fi
  echo "$REPO_ROOT" > "$base.checkout"
}
# The git revision `train --version` reports (Bazel needs the script's absolute path).
BAZEL_FLAGS+=(--workspace_status_command="$REPO_ROOT/scripts/workspace_status.sh")
if [ -x "$CUDA_HOME/bin/nvcc" ]; then
  BAZEL_CONFIG="cuda"
  BAZEL_FLAGS+=(--config=cuda)
else
  BAZEL_CONFIG="cpu"
  BAZEL_FLAGS+=(--config=cpu)
  echo "notice: no CUDA toolkit at $CUDA_HOME (set CUDA_HOME to use one); building the CPU-only configuration."
fi

# Tests and training runs use every core, as root too (containers, CI).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# OpenBLAS (the CPU matmul) picks its kernels by the CPU's model number and falls back to its
# oldest ones (Prescott, SSE3) on a model it does not know, as virtual machines often report.
# Those are slower, and their sums depend on the operands' layout in the last bit, which the
# exact-equality tests see (two sharding layouts of the same run). Name the kernels by the
# instruction sets the CPU reports instead; the tests receive it (.bazelrc).
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -r /proc/cpuinfo ]; then
  cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo) "
  if [[ $cpu_flags == *" avx512f "* && $cpu_flags == *" avx512bw "* && $cpu_flags == *" avx512vl "* &&
        $cpu_flags == *" avx512dq "* ]]; then
    export OPENBLAS_CORETYPE=SkylakeX
  elif [[ $cpu_flags == *" avx2 "* && $cpu_flags == *" fma "* ]]; then
    export OPENBLAS_CORETYPE=Haswell
  fi
fi

# Test cases of the given test labels, from each one's JUnit XML under `testlogs` (written
# by our test main, or by Bazel itself for a test that crashed): prints "passed failed
# skipped". A test that did not build or did not run counts as one failure, and is named.
count_test_cases() {
  local testlogs="$1"; shift
  local passed=0 failed=0 skipped=0 label path xml t f e s
  for label in "$@"; do
    path="${label#//}"
    xml="$testlogs/${path/://}/test.xml"
    if [ ! -f "$xml" ]; then
      echo "no result for $label (did not build or did not run)" >&2
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
    passed=$((passed + t - f - e - s))
    failed=$((failed + f + e))
    skipped=$((skipped + s))
  done
  echo "$passed $failed $skipped"
}
