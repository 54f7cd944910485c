#!/usr/bin/env bash
# The train binary's losses do not depend on how many ranks train or how the state is
# sharded: one process, `mpirun -np 2` under ZeRO-3 and `mpirun -np 4` under ZeRO-1 (the
# same global batch of 16 sequences and micro-batch of 4, so 4, 2 and 1 micro-batches per
# rank) must write bit-identical training and validation losses to metrics.jsonl.
#
# Usage: rank_invariance_test.sh TRAIN_BINARY   (run from the workspace root)
set -u
train="$1"
source tests/sh_test_support.sh rank_invariance

fail() {
  echo "FAIL: $*"
  exit 1
}

head -c 60000 third_party/text/austen.txt > "$work/text.txt"
common=(--config configs/tiny.json model.n_layer=2 model.d_model=32 model.n_head=2
        model.seq_length=16 train.train_iters=6 train.micro_batch_size=4
        train.global_batch_size=16 train.eval_interval=3 train.eval_iters=2
        dataset.train_path="$work/text.txt" dataset.val_fraction=0.1 dist.device=cpu
        logger.log_interval=1 optimizer.lr=1e-2)

losses() {  # metrics.jsonl -> one "loss val_loss" line per record
  sed -e 's/.*"loss":\([^,}]*\).*/\1/' "$1" > "$1.loss"
  grep -o '"val_loss":[^,}]*' "$1" > "$1.val" || true
  cat "$1.loss" "$1.val"
}

"$train" "${common[@]}" run.output_dir="$work/np1" > "$work/np1.log" 2>&1 \
  || { tail -20 "$work/np1.log"; fail "the single-process run failed"; }
timeout 300 mpirun --oversubscribe -np 2 "$train" "${common[@]}" run.output_dir="$work/np2" \
  ddp.data_parallel_sharding_strategy=optim_grads_params > "$work/np2.log" 2>&1 \
  || { tail -20 "$work/np2.log"; fail "the 2-rank ZeRO-3 run failed"; }
timeout 300 mpirun --oversubscribe -np 4 "$train" "${common[@]}" run.output_dir="$work/np4" \
  ddp.data_parallel_sharding_strategy=optim > "$work/np4.log" 2>&1 \
  || { tail -20 "$work/np4.log"; fail "the 4-rank ZeRO-1 run failed"; }

want="$(losses "$work/np1/metrics.jsonl")"
[ "$(echo "$want" | wc -l)" -eq 8 ] || fail "expected 6 losses and 2 validation losses, got: $want"
first=$(head -1 "$work/np1/metrics.jsonl.loss"); last=$(sed -n 6p "$work/np1/metrics.jsonl.loss")
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "the loss did not fall: $first -> $last"
for n in 2 4; do
  got="$(losses "$work/np$n/metrics.jsonl")"
  [ "$got" = "$want" ] || fail "losses with $n ranks differ from one process:
$(diff <(echo "$want") <(echo "$got"))"
  echo "ok: $n ranks give the single-process losses bit for bit"
done
echo "PASS"
