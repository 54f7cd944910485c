#!/usr/bin/env bash
# SIGKILL during saves, end to end: a 2-rank job (mpirun -np 2) saving every step is killed
# (the ranks and mpirun, SIGKILL, nothing can clean up) while a save is in progress, at a
# random point of it, 24 times in a row; each time the job is started again and resumes from
# `latest`. After every kill:
#   - `latest` names a complete step directory (its metadata.json present),
#   - every loss any attempt logged equals the uninterrupted run's loss at that step
#     (exact on the CPU), so each resume loaded a checkpoint that continues the same curve.
# Finally the job runs to its last step, and its whole curve equals the uninterrupted one.
# Usage: kill_during_save_test.sh TRAIN_BINARY   (run from the workspace root)
set -u
train="$1"
source tests/sh_test_support.sh kill_during_save
TRIALS=24
STEPS=120


head -c 40000 third_party/text/austen.txt > "$work/text.txt"
common=(--config configs/tiny.json model.n_layer=2 model.d_model=32 model.n_head=2
        model.seq_length=16 train.micro_batch_size=1 train.global_batch_size=4
        train.train_iters=$STEPS train.eval_interval=0 dataset.train_path="$work/text.txt"
        dataset.val_fraction=0 logger.log_interval=1 dist.device=cpu checkpoint.load=latest)


# The uninterrupted reference (one process: the CPU result does not depend on the world size).
"$train" "${common[@]}" run.output_dir="$work/ref" checkpoint.save=null > "$work/ref.log" 2>&1 ||
  fail "the reference run failed"
losses "$work/ref/metrics.jsonl" > "$work/ref.losses"
[ "$(wc -l < "$work/ref.losses")" -eq "$STEPS" ] || fail "the reference run logged the wrong number of steps"

ckpt="$work/ckpt"
mkdir -p "$ckpt"
# A pause of about a millisecond without starting a process (a save can be a few ms long, and
# forking `sleep` on a loaded machine takes longer than that): read with a timeout from a
# pipe that never delivers.
exec {never}<> <(:)
pause() { read -r -t 0.001 -u "$never" _ || true; }
landed_in_save=0
near_end="step_$(printf %06d $((STEPS - 20)))"
for trial in $(seq "$TRIALS"); do
  setsid mpirun --oversubscribe -np 2 "$train" "${common[@]}" run.output_dir="$work/run" \
    checkpoint.save="$ckpt" checkpoint.save_interval=1 checkpoint.most_recent_k=2 \
    > "$work/trial.log" 2>&1 &
  job=$!
  # Let a random number of saves (0-4) go by, then kill during the next one: a save in
  # progress is a .tmp_ directory in the save directory; the kill lands a random 0-9 ms in.
  skip=$((RANDOM % 5)) seen=0 in_save=0
  for _ in $(seq 200000); do
    kill -0 "$job" 2>/dev/null || break
    if compgen -G "$ckpt/.tmp_*" > /dev/null; then
      if [ "$seen" -ge "$skip" ]; then in_save=1; break; fi
      seen=$((seen + 1))
      while compgen -G "$ckpt/.tmp_*" > /dev/null; do pause; done
    fi
    # Near the end, kill now (counted as a kill outside a save): the trials must not finish
    # the run.
    latest_now=""
    [ -f "$ckpt/latest" ] && read -r latest_now < "$ckpt/latest"
    [[ "$latest_now" > "$near_end" ]] && break
    pause
  done
  kill -0 "$job" 2>/dev/null || fail "trial $trial: the job ended before it was killed (exit: $(wait "$job"; echo $?))"
  for ((i = RANDOM % 10; i > 0; i--)); do pause; done
  kill -9 -- "-$job" 2>/dev/null  # the whole session: mpirun and both ranks
  wait "$job" 2>/dev/null
  # A kill that found the save finished is not counted as one inside a save.
  compgen -G "$ckpt/.tmp_*" > /dev/null && [ "$in_save" -eq 1 ] && landed_in_save=$((landed_in_save + 1))

  if [ -f "$ckpt/latest" ]; then
    latest=$(cat "$ckpt/latest")
    [ -f "$ckpt/$latest/metadata.json" ] || fail "trial $trial: latest names $latest, which is not complete"
  else
    # Killed during the very first save: nothing is complete, and nothing may claim to be.
    latest=none
    ! compgen -G "$ckpt/step_*" > /dev/null || fail "trial $trial: step directories but no latest marker"
  fi
  # Every loss logged so far, by any attempt, is the reference's at that step.
  while read -r step loss; do
    grep -qx "$step $loss" "$work/ref.losses" ||
      fail "trial $trial: step $step logged loss $loss; the uninterrupted run's is $(grep "^$step " "$work/ref.losses")"
  done < <(losses "$work/run/metrics.jsonl")
  echo "trial $trial: killed with latest = $latest"
done
echo "$landed_in_save of $TRIALS kills landed inside a save (a .tmp_ directory left behind)"
[ "$landed_in_save" -ge 20 ] || fail "only $landed_in_save kills landed inside a save"

# The job runs to the end from the last kill's `latest`: the whole curve is the reference's.
mpirun --oversubscribe -np 2 "$train" "${common[@]}" run.output_dir="$work/run" \
  checkpoint.save="$ckpt" checkpoint.save_interval=0 > "$work/final.log" 2>&1 ||
  fail "the final resume failed"
grep -q "resumed from" "$work/final.log" || fail "the final run did not resume"
losses "$work/run/metrics.jsonl" > "$work/run.losses"
cmp -s "$work/run.losses" "$work/ref.losses" || fail "the resumed curve differs: $(diff "$work/run.losses" "$work/ref.losses" | head -5)"
echo "PASS: $TRIALS kills during saves, latest always complete, every curve the uninterrupted one"
