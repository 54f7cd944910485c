# Shared set-up for scripts/train.sh and scripts/test.sh (sourced, not run).
# Installs what is missing on a Debian/Ubuntu machine, chooses the build configuration
# (CUDA when a toolkit is present, CPU-only otherwise) and the Bazel flags.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

PACKAGES=(bazel-bootstrap catch2 nlohmann-json3-dev libopenmpi-dev openmpi-bin g++ ca-certificates
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
BAZEL_FLAGS=(--disk_cache="$CACHE_DIR/bazel-disk")
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
