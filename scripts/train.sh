#!/usr/bin/env bash
# README command (a): installs what is missing, builds, and trains. Without arguments it
# trains the embedded default, configs/tiny.json (a small GPT on Jane Austen's novels: a few
# minutes on two CPU cores), ending with a generated sample and runs/tiny/loss.svg.
# With arguments they go to the train binary, e.g.
#   scripts/train.sh --config configs/gpt2-124m.json train.train_iters=100
#   scripts/train.sh --config configs/tiny.json --dry-run
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

bazel build "${BAZEL_FLAGS[@]}" //tools/train
bin="$(bazel info "${BAZEL_FLAGS[@]}" bazel-bin 2>/dev/null)/tools/train/train"
[ $# -eq 0 ] && set -- --config configs/tiny.json
exec "$bin" "$@"
