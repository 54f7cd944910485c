#!/usr/bin/env bash
# A save that runs out of disk, end to end with a 2-rank job: the save directory is a small
# tmpfs that holds one checkpoint but not two (where mounting is not allowed, a file-size
# limit, ulimit -f, makes every shard write fail instead).
#   1. A job saves step 2 there.
#   2. Resumed with saves every 2 steps (checkpoint.continue_on_save_failure=false, the
#      default), the save of step 4 fails: the job exits non-zero with a message naming the
#      shard file and the system's reason; `latest` still names step 2, and the failed
#      attempt left nothing behind.
#   3. With checkpoint.continue_on_save_failure=true, the same job warns and trains on to its
#      last step (every step logged); the last step's save fails, and that ends it non-zero.
#   4. Copied to a roomy disk, the step-2 checkpoint resumes to the end: every step's loss
#      equals an uninterrupted run's, so nothing of it was damaged.
#   5. The run's resolved recipe (run_config.json) cannot be written (ENOSPC): the error names
#      the file and the reason, and its temporary file is taken back.
# Usage: full_disk_test.sh TRAIN_BINARY   (run from the workspace root)
set -u
train="$1"
source tests/sh_test_support.sh full_disk

mnt="$work/small_disk"
mkdir -p "$mnt"
cleanup() { [ "${mounted:-0}" -eq 1 ] && umount "$mnt" 2>/dev/null; }
trap cleanup EXIT


head -c 40000 third_party/text/austen.txt > "$work/text.txt"
common=(--config configs/tiny.json model.n_layer=2 model.d_model=32 model.n_head=2
        model.seq_length=16 train.micro_batch_size=1 train.global_batch_size=4
        train.train_iters=6 train.eval_interval=0 dataset.train_path="$work/text.txt"
        dataset.val_fraction=0 logger.log_interval=1 dist.device=cpu checkpoint.load=latest
        checkpoint.most_recent_k=0)
run2() { mpirun --oversubscribe -np 2 "$train" "${common[@]}" "$@"; }

"$train" "${common[@]}" run.output_dir="$work/ref" checkpoint.save=null > "$work/ref.log" 2>&1 ||
  fail "the reference run failed"
losses "$work/ref/metrics.jsonl" > "$work/ref.losses"

# 1. Step 2 saved on a roomy disk first, to learn a checkpoint's size.
run2 train.train_iters=2 run.output_dir="$work/run" checkpoint.save="$work/sized" > "$work/sized.log" 2>&1 ||
  fail "the first run failed"
kib=$(du -sk "$work/sized/step_000002" | cut -f1)
# A disk for one checkpoint and a half, or else a per-file limit below a shard's size.
limit=()
if mount -t tmpfs -o size=$((kib * 3 / 2))k tmpfs "$mnt" 2>/dev/null; then
  mounted=1
  echo "save directory: a tmpfs of $((kib * 3 / 2)) KiB (one checkpoint: $kib KiB)"
  run2 train.train_iters=2 run.output_dir="$work/run" checkpoint.save="$mnt" > "$work/first.log" 2>&1 ||
    fail "saving step 2 on the small disk failed"
  reason="No space left on device"
else
  echo "save directory: cannot mount a tmpfs here; writes limited to $((kib / 4)) KiB a file instead"
  cp -r "$work/sized/." "$mnt/"
  limit=(ulimit -f $((kib / 4)))
  reason="File too large"
fi
cp -r "$mnt/step_000002" "$work/step_000002.copy"
[ "$(cat "$mnt/latest")" = step_000002 ] || fail "latest is not step_000002 after the first save"

# Runs the 2-rank job with writes limited as chosen above (train ignores SIGXFSZ, so a write
# past the limit fails with EFBIG instead of killing the rank).
limited_run2() {
  ( [ ${#limit[@]} -gt 0 ] && "${limit[@]}"; run2 "$@" )
}

# 2. The save of step 4 fails and ends the run.
limited_run2 checkpoint.save="$mnt" checkpoint.save_interval=2 run.output_dir="$work/run_stop" \
  > "$work/stop.log" 2>&1 && fail "the run whose save failed exited 0"
grep -q "$reason" "$work/stop.log" || fail "the failure does not give the reason ($reason)"
grep -q "model_shard" "$work/stop.log" || grep -q "\.safetensors" "$work/stop.log" ||
  fail "the failure does not name the file"
[ "$(cat "$mnt/latest")" = step_000002 ] || fail "latest moved: $(cat "$mnt/latest")"
! compgen -G "$mnt/.tmp_*" > /dev/null || fail "the failed save left its temporary directory"
! compgen -G "$mnt/step_000004" > /dev/null || fail "a step_000004 directory exists"
[ "$(losses "$work/run_stop/metrics.jsonl" | tail -1 | cut -d' ' -f1)" = 4 ] ||
  fail "the stopping run did not end at step 4"

# 3. With continue_on_save_failure, the run trains to the end, then its final save fails.
limited_run2 checkpoint.save="$mnt" checkpoint.save_interval=2 checkpoint.continue_on_save_failure=true \
  run.output_dir="$work/run_continue" > "$work/continue.log" 2>&1 &&
  fail "the run whose last save failed exited 0"
grep -q "warning: saving step 4 failed, training goes on" "$work/continue.log" ||
  fail "no warning for the failed save of step 4"
[ "$(losses "$work/run_continue/metrics.jsonl" | cut -d' ' -f1 | tr '\n' ' ')" = "3 4 5 6 " ] ||
  fail "the continuing run did not log steps 3 to 6"
[ "$(cat "$mnt/latest")" = step_000002 ] || fail "latest moved: $(cat "$mnt/latest")"
diff -r "$mnt/step_000002" "$work/step_000002.copy" > /dev/null || fail "step_000002 changed"

# 4. The kept checkpoint resumes to the end on a roomy disk, on the uninterrupted curve.
mkdir -p "$work/roomy"
cp -r "$mnt/step_000002" "$work/roomy/" && cp "$mnt/latest" "$work/roomy/"
cp -r "$work/run" "$work/run_roomy"
run2 checkpoint.save="$work/roomy" run.output_dir="$work/run_roomy" > "$work/roomy.log" 2>&1 ||
  fail "resuming the kept checkpoint failed"
losses "$work/run_roomy/metrics.jsonl" > "$work/roomy.losses"
cmp -s "$work/roomy.losses" "$work/ref.losses" || fail "the resumed curve differs: $(diff "$work/roomy.losses" "$work/ref.losses" | head -5)"

# 5. The run's own output on a full disk: run_config.json's temporary file is /dev/full
# (writes to it fail with ENOSPC). The run ends naming the file and the reason, and takes
# its temporary file back.
mkdir -p "$work/full_out"
ln -s /dev/full "$work/full_out/run_config.json.tmp"
"$train" "${common[@]}" checkpoint.save=null run.output_dir="$work/full_out" > "$work/full_out.log" 2>&1 &&
  fail "the run whose output disk is full exited 0"
grep -q "run_config.json.tmp'.*No space left on device" "$work/full_out.log" ||
  fail "the error does not say why run_config.json could not be written: $(tail -2 "$work/full_out.log")"
[ -e "$work/full_out/run_config.json.tmp" ] || [ -L "$work/full_out/run_config.json.tmp" ] &&
  fail "run_config.json.tmp was left behind"
echo "PASS: a full disk fails the save clearly, keeps the previous checkpoint, and stops or trains on as configured; the run's own files say why and leave nothing"
