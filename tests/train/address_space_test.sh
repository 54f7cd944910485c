#!/usr/bin/env bash
# An address-space limit (ulimit -v) too small for the run ends it at start-up with a message
# that names the limit and the setting that fits, instead of a run that spins in OpenBLAS or
# dies inside MPI without a word:
#   1. below what the runtime itself maps (2 GiB + 128 MiB per hardware thread): refused
#      before MPI starts (far below, under about 1 GiB plus 128 MiB per thread, OpenBLAS's
#      own initializer loops before main runs: not tested, docs/RELIABILITY.md says so);
#   2. above that but below it plus the run's predicted memory: refused once the prediction
#      is known, before the model is allocated;
#   3. a limit with room for both: the run trains.
# Usage: address_space_test.sh TRAIN_BINARY   (run from the workspace root)
set -u
train="$1"
source tests/sh_test_support.sh address_space

head -c 40000 third_party/text/austen.txt > "$work/text.txt"
common=(--config configs/tiny.json train.train_iters=2 train.eval_interval=0
        dataset.train_path="$work/text.txt" dataset.val_fraction=0 dist.device=cpu)
runtime_kib=$(( (2048 + 128 * $(nproc)) * 1024 ))
limited() {  # KiB, log name, args...: the train binary under that address-space limit
  local kib="$1" name="$2"; shift 2
  ( ulimit -v "$kib"; exec timeout 120 "$train" "${common[@]}" run.output_dir="$work/$name" "$@" ) \
    > "$work/$name.log" 2>&1
}

limited $((runtime_kib - 512 * 1024)) below_runtime && fail "a run below the runtime's needs went on"
grep -q "the address-space limit (ulimit -v) is .*ulimit -v [0-9]*" "$work/below_runtime.log" ||
  fail "no message naming the limit: $(tail -3 "$work/below_runtime.log")"
echo "ok: below the runtime's own needs: $(grep -o 'the address-space limit.*' "$work/below_runtime.log" | head -1)"

limited $((runtime_kib + 100 * 1024)) below_model && fail "a run without room for its model went on"
grep -q "the predicted .* and about .* for the runtime" "$work/below_model.log" ||
  fail "no message naming the prediction: $(tail -3 "$work/below_model.log")"
[ -s "$work/below_model/metrics.jsonl" ] && fail "steps ran under a limit too small for the model"
echo "ok: below the runtime plus the model: refused before any step"

limited $((runtime_kib + 1024 * 1024)) roomy || fail "the run with room failed: $(tail -3 "$work/roomy.log")"
echo "PASS"
