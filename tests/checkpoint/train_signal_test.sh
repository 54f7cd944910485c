#!/usr/bin/env bash
# Preemption, end to end with the train binary:
#   1. SIGUSR1 sent to mpirun (-np 2) mid-run: every rank agrees at the next step boundary,
#      saves a checkpoint, moves `latest` and exits 0 with a message;
#   2. the run resumes from it on 4 ranks, then on 1 process: every step's loss equals an
#      uninterrupted single-process run's (exact on the CPU, whatever the world size);
#   3. SIGTERM sent to a single-process run does the same;
#   4. inside a step of a million micro-batches (hours long), SIGTERM is honoured between
#      micro-batches: the step is dropped, step 0 is saved with the data position of its
#      start, and the process exits 0;
#   5. a second SIGTERM ends the process at once (killed by the signal, nothing saved);
#   6. SIGTERM sent to mpirun, launched as README says (`--mca odls_base_sigkill_timeout`,
#      here 15 s: mpirun passes the signal on that late and kills the ranks as long after):
#      the ranks save a checkpoint that takes longer than Open MPI's default grace of one
#      second (without the setting mpirun kills them mid-save), and rank 0 warns at start-up
#      when the setting is missing.
# Usage: train_signal_test.sh TRAIN_BINARY   (run from the workspace root: configs/, third_party/)
set -u
train="$1"
source tests/sh_test_support.sh train_signal


# A small corpus (fast to tokenize) and a tiny model; a constant learning rate, so that the
# schedule does not depend on train.train_iters and runs of different lengths agree.
head -c 40000 third_party/text/austen.txt > "$work/text.txt"
common=(--config configs/tiny.json model.n_layer=2 model.d_model=32 model.n_head=2
        model.seq_length=16 train.micro_batch_size=1 train.global_batch_size=4
        train.eval_interval=0 scheduler.lr_decay_style=constant scheduler.lr_warmup_iters=0
        dataset.train_path="$work/text.txt" dataset.val_fraction=0 logger.log_interval=1
        dist.device=cpu checkpoint.load=latest checkpoint.save_interval=0)


# Waits until a metrics file holds at least $2 records (at most 120 s).
wait_for_steps() {
  for _ in $(seq 1200); do
    [ "$(losses "$1" 2>/dev/null | wc -l)" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}

# Checks that a checkpoint directory's `latest` names a complete step directory; prints its step.
saved_step() {
  local latest
  latest=$(cat "$1/latest" 2>/dev/null) || fail "no latest marker in $1"
  [ -f "$1/$latest/metadata.json" ] || fail "$1/latest names $latest, which has no metadata.json"
  echo $((10#${latest#step_}))
}

# 0. The uninterrupted reference: one process, 12 steps.
"$train" "${common[@]}" train.train_iters=12 run.output_dir="$work/ref" checkpoint.save=null \
  > "$work/ref.log" 2>&1 || fail "the reference run failed"
losses "$work/ref/metrics.jsonl" > "$work/ref.losses"
[ "$(wc -l < "$work/ref.losses")" -eq 12 ] || fail "the reference run logged $(wc -l < "$work/ref.losses") steps"

# 1. SIGUSR1 to mpirun after a few steps.
mpirun --oversubscribe -np 2 "$train" "${common[@]}" train.train_iters=100000 \
  run.output_dir="$work/run" checkpoint.save="$work/ckpt" > "$work/usr1.log" 2>&1 &
pid=$!
wait_for_steps "$work/run/metrics.jsonl" 2 || { kill -KILL $pid; fail "the run did not start"; }
kill -USR1 $pid
wait $pid
rc=$?
[ $rc -eq 0 ] || fail "mpirun exited with status $rc after SIGUSR1"
grep -qE "stop requested: ending (after|during) step" "$work/usr1.log" || fail "no stop message"
grep -q "checkpoint saved: $work/ckpt/step_" "$work/usr1.log" || fail "no checkpoint message"
stop=$(saved_step "$work/ckpt")
echo "SIGUSR1: 2 ranks saved step $stop and exited 0"
[ "$stop" -ge 2 ] && [ "$stop" -le 8 ] || fail "stopped at step $stop, expected 2..8"

# 2. Resume on 4 ranks for two steps, then on one process for two more, into the same
# output directory: the metrics file must then equal the reference's first stop+4 records.
mpirun --oversubscribe -np 4 "$train" "${common[@]}" train.train_iters=$((stop + 2)) \
  run.output_dir="$work/run" checkpoint.save="$work/ckpt" > "$work/resume4.log" 2>&1 \
  || fail "resuming on 4 ranks failed"
grep -q "resumed from $work/ckpt/step_" "$work/resume4.log" || fail "the 4-rank run did not resume"
[ "$(saved_step "$work/ckpt")" -eq $((stop + 2)) ] || fail "the 4-rank run did not save step $((stop + 2))"
"$train" "${common[@]}" train.train_iters=$((stop + 4)) run.output_dir="$work/run" \
  checkpoint.save="$work/ckpt" > "$work/resume1.log" 2>&1 || fail "resuming on one process failed"
grep -q "resumed from $work/ckpt/step_" "$work/resume1.log" || fail "the 1-process run did not resume"
losses "$work/run/metrics.jsonl" > "$work/run.losses"
head -n $((stop + 4)) "$work/ref.losses" > "$work/ref_prefix.losses"
if ! diff "$work/ref_prefix.losses" "$work/run.losses"; then
  fail "losses of the interrupted and resumed run differ from the uninterrupted run's"
fi
echo "resumed on 4 ranks and on 1 process: $((stop + 4)) losses equal the reference's"

# 3. SIGTERM to a single process.
"$train" "${common[@]}" train.train_iters=100000 run.output_dir="$work/term" \
  checkpoint.save="$work/ckpt_term" > "$work/term.log" 2>&1 &
pid=$!
wait_for_steps "$work/term/metrics.jsonl" 2 || { kill -KILL $pid; fail "the SIGTERM run did not start"; }
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 0 ] || fail "train exited with status $rc after SIGTERM"
grep -qE "stop requested: ending (after|during) step" "$work/term.log" || fail "no stop message after SIGTERM"
echo "SIGTERM: saved step $(saved_step "$work/ckpt_term") and exited 0"

# 4. SIGTERM inside a step that would take hours: it ends between micro-batches.
long=("${common[@]}" train.train_iters=1 train.global_batch_size=1000000)
"$train" "${long[@]}" run.output_dir="$work/long" checkpoint.save="$work/ckpt_long" \
  > "$work/long.log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q "predicted peak" "$work/long.log" && break; sleep 0.1; done
sleep 2
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 0 ] || fail "train exited with status $rc after SIGTERM inside a long step"
grep -q "stop requested: ending during step 1, which is dropped" "$work/long.log" \
  || fail "no mid-step stop message"
[ "$(saved_step "$work/ckpt_long")" -eq 0 ] || fail "the mid-step stop did not save step 0"
grep -q '"consumed_samples": 0' "$work/ckpt_long/step_000000/metadata.json" \
  || fail "the dropped step's samples were counted as consumed"
echo "SIGTERM inside a step: dropped the step, saved step 0 at data position 0, exited 0"

# 5. A second SIGTERM ends the process at once.
"$train" "${long[@]}" run.output_dir="$work/twice" checkpoint.save="$work/ckpt_twice" \
  > "$work/twice.log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q "predicted peak" "$work/twice.log" && break; sleep 0.1; done
sleep 1
kill -TERM $pid
# The second signal only once the first was handled (two sent back to back may reach the
# process as one): the stop is announced, then the checkpoint is written, during which the
# second signal arrives.
for _ in $(seq 3000); do grep -q "stop requested" "$work/twice.log" && break; sleep 0.01; done
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 143 ] || fail "after two SIGTERMs train exited with status $rc, not 143 (killed by SIGTERM)"
echo "a second SIGTERM ended the process at once (status 143)"

# 6. SIGTERM to mpirun. A model whose checkpoint (about 190 MB on two ranks) takes seconds to
# write, trained with tiny batches so that its steps are quick.
big=("${common[@]}" model.n_layer=4 model.d_model=256 train.train_iters=100000)
mpirun --mca odls_base_sigkill_timeout 15 --oversubscribe -np 2 "$train" "${big[@]}" \
  run.output_dir="$work/mpirun_term" checkpoint.save="$work/ckpt_mpirun" > "$work/mpirun_term.log" 2>&1 &
pid=$!
wait_for_steps "$work/mpirun_term/metrics.jsonl" 2 || { kill -KILL $pid; fail "the mpirun SIGTERM run did not start"; }
kill -TERM $pid
wait $pid
grep -q "checkpoint saved: $work/ckpt_mpirun/step_" "$work/mpirun_term.log" \
  || fail "SIGTERM to mpirun (with odls_base_sigkill_timeout) did not save the checkpoint"
echo "SIGTERM to mpirun: saved step $(saved_step "$work/ckpt_mpirun") ($(sed -n 's/.*checkpoint saved: .*(\(.*\)).*/\1/p' "$work/mpirun_term.log"))"
# Launched without the setting, a run that saves says how to launch.
mpirun --oversubscribe -np 2 "$train" "${common[@]}" train.train_iters=1 \
  run.output_dir="$work/warn" checkpoint.save="$work/ckpt_warn" > "$work/warn.log" 2>&1 \
  || fail "the short run without the grace setting failed"
grep -q "mpirun --mca odls_base_sigkill_timeout 120" "$work/warn.log" || fail "no warning about mpirun's kill grace"
echo "PASS"
