#!/usr/bin/env bash
# A two-rank training job (MPI backend, CPU) whose rank 1 or 0 freezes (SIGSTOP) after two
# steps must end non-zero on every rank, with the watchdog's message, within the 12 s
# collective timeout plus a short grace (scripts/stuck_rank.sh does the work; the same
# script runs on the GPUs from scripts/gpu_validate.sh).
#
# The message must name the frozen rank. A third argument names the backend (mpi by
# default; staged runs the same job through the staged backend's worker threads).
#
# Usage: stuck_rank_test.sh STUCK_RANK_SH TRAIN_BINARY [BACKEND]   (from the workspace root)
set -u
source tests/sh_test_support.sh stuck_rank
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
NAME_STUCK=1 exec bash "$1" "$work" "$2" "${root[@]}" -- \
  --config configs/tiny.json train.eval_interval=0 dataset.val_fraction=0 \
  train.global_batch_size=16 dist.device=cpu dist.backend="${3:-mpi}"
