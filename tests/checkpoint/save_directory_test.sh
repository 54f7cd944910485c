#!/usr/bin/env bash
# Where a run saves, checked before its first step:
#   1. a run that starts fresh (--no-resume, or checkpoint.load=null) into a save directory
#      holding another run's checkpoints is refused, naming the directory, and leaves them as
#      they were; checkpoint.overwrite=true lets it replace them;
#   2. every rank checks its own checkpoint.save (the path may differ between nodes): a rank
#      whose directory cannot be made ends the job before step 1, naming the rank and the key.
# Usage: save_directory_test.sh TRAIN_BINARY   (run from the workspace root)
set -u
train="$1"
source tests/sh_test_support.sh save_directory

head -c 40000 third_party/text/austen.txt > "$work/text.txt"
common=(--config configs/tiny.json model.n_layer=2 model.d_model=32 model.n_head=2
        model.seq_length=16 train.micro_batch_size=1 train.global_batch_size=2
        train.train_iters=2 train.eval_interval=0 dataset.train_path="$work/text.txt"
        dataset.val_fraction=0 logger.log_interval=1 dist.device=cpu)

# 1. Another run's checkpoints.
"$train" "${common[@]}" run.output_dir="$work/a" checkpoint.save="$work/ck" > "$work/a.log" 2>&1 \
  || fail "the first run failed"
before=$(cd "$work/ck" && find . -type f -exec sha256sum {} + | sort)
for fresh in --no-resume checkpoint.load=null; do
  "$train" "${common[@]}" run.output_dir="$work/b" checkpoint.save="$work/ck" "$fresh" \
    train.train_iters=1 > "$work/b.log" 2>&1 && fail "a fresh run ($fresh) saved into another run's checkpoints"
  grep -q "checkpoint.save = \"$work/ck\" holds another run's checkpoints" "$work/b.log" \
    || fail "no message naming the save directory ($fresh)"
  grep -q "checkpoint.overwrite=true" "$work/b.log" || fail "the message does not name checkpoint.overwrite"
  [ "$(cd "$work/ck" && find . -type f -exec sha256sum {} + | sort)" = "$before" ] \
    || fail "the refused run changed the checkpoints ($fresh)"
done
echo "ok: a fresh run into another run's checkpoints is refused; they are unchanged"
"$train" "${common[@]}" run.output_dir="$work/c" checkpoint.save="$work/ck" checkpoint.load=null \
  checkpoint.overwrite=true train.train_iters=1 > "$work/c.log" 2>&1 \
  || fail "checkpoint.overwrite=true did not let the run save"
[ "$(cat "$work/ck/latest")" = step_000001 ] || fail "the overwriting run did not save step 1"
echo "ok: checkpoint.overwrite=true replaces them"

# 2. Rank 1's directory cannot be made (a file is in its way); rank 0's can.
touch "$work/a_file"
timeout 120 mpirun --oversubscribe \
  -np 1 "$train" "${common[@]}" run.output_dir="$work/d" checkpoint.save="$work/ck_rank0" : \
  -np 1 "$train" "${common[@]}" run.output_dir="$work/d" checkpoint.save="$work/a_file/ck" \
  > "$work/d.log" 2>&1 && fail "the job ran although rank 1 cannot save"
grep -q "rank 1 cannot create the directory" "$work/d.log" || fail "the message does not name rank 1"
grep -q "checkpoint.save" "$work/d.log" || fail "the message does not name checkpoint.save"
[ -s "$work/d/metrics.jsonl" ] && fail "steps ran before the save directory was checked"
echo "ok: a rank that cannot save ends the job before step 1, named"
echo "PASS"
