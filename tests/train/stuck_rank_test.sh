#!/usr/bin/env bash
# A two-rank training job (MPI backend, CPU) whose rank 1 or 0 freezes (SIGSTOP) after two
# steps must end non-zero on every rank, with the watchdog's message, within the 12 s
# collective timeout plus a short grace (scripts/stuck_rank.sh does the work; the same
# script runs on the GPUs from scripts/gpu_validate.sh).
#
# Usage: stuck_rank_test.sh STUCK_RANK_SH TRAIN_BINARY   (from the workspace root)
set -u
export OMPI_MCA_btl="self,vader,tcp" OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
exec bash "$1" "${TEST_TMPDIR:-$(mktemp -d)}/stuck_rank" "$2" "${root[@]}" -- \
  --config configs/tiny.json train.eval_interval=0 dataset.val_fraction=0 \
  train.global_batch_size=16
