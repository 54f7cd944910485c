#!/usr/bin/env bash
# A training job with a stuck rank must end on every rank, non-zero, with the watchdog's
# message, within the collective timeout (plus a short grace): never a silent hang.
#
# Starts `mpirun -np 2 TRAIN ARGS... dist.distributed_timeout_minutes=0.2 run.output_dir=DIR`,
# waits until rank 0 has logged two steps, then freezes one of the two processes
# (SIGSTOP: alive, but taking part in nothing, like a rank stuck in a hung kernel or a
# deadlock). The other rank's next collective must time out after 12 s, print which
# operation, group and step hung, and end the job.
#
#   [STUCK_LIMIT=180] [NAME_STUCK=1] scripts/stuck_rank.sh WORK_DIR TRAIN_BINARY [MPIRUN_ARGS -- ] TRAIN_ARGS...
# (STUCK_LIMIT: seconds after which the whole job counts as hung; NAME_STUCK=1: the message
# must also name the frozen rank, as the MPI and staged backends do)
# e.g. scripts/stuck_rank.sh /tmp/stuck bazel-bin/tools/train/train --config configs/tiny.json
set -u
work="$1"; train="$2"; shift 2
mpi_args=()
if [[ " $* " == *" -- "* ]]; then
  while [ "$1" != "--" ]; do mpi_args+=("$1"); shift; done
  shift
fi
rm -rf "$work"; mkdir -p "$work"
log="$work/job.log"
fail() { echo "FAIL: $*"; tail -n 25 "$log"; exit 1; }

timeout "${STUCK_LIMIT:-180}" mpirun --oversubscribe "${mpi_args[@]}" -np 2 "$train" "$@" \
  dist.distributed_timeout_minutes=0.2 run.output_dir="$work/run" checkpoint.save=null \
  checkpoint.load=null train.train_iters=100000 logger.log_interval=1 > "$log" 2>&1 &
job=$!
steps() { if [ -f "$work/run/metrics.jsonl" ]; then wc -l < "$work/run/metrics.jsonl"; else echo 0; fi; }
for _ in $(seq 600); do
  [ "$(steps)" -ge 2 ] && break
  kill -0 "$job" 2>/dev/null || fail "the job ended before training two steps"
  sleep 0.2
done
[ "$(steps)" -ge 2 ] || fail "no progress"
# The two training processes are mpirun's children; freeze the newer one.
victim=$(pgrep -P "$(pgrep -P "$job" -x mpirun || echo "$job")" | sort -n | tail -1)
[ -n "$victim" ] || victim=$(pgrep -f -- "$train" | sort -n | tail -1)
[ -n "$victim" ] || fail "no training process found"
rank=$(tr '\0' '\n' < "/proc/$victim/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
kill -STOP "$victim"
echo "$(date +%T) stopped pid $victim (rank ${rank:-?}) after $(steps) steps"
start=$SECONDS
wait "$job"
rc=$?
elapsed=$((SECONDS - start))
kill -KILL "$victim" 2>/dev/null
echo "$(date +%T) the job ended with status $rc ${elapsed}s later"
[ "$rc" -ne 124 ] || fail "the job hung"
[ "$rc" -ne 0 ] || fail "the job succeeded with a stuck rank"
[ "$elapsed" -le 60 ] || fail "the job took ${elapsed}s to end after the rank stopped"
grep -q "did not finish within 12 s" "$log" || fail "no watchdog message naming the timeout"
if [ "${NAME_STUCK:-0}" = 1 ]; then
  grep -q "rank ${rank:-?} has not reached it" "$log" || fail "the message does not name rank ${rank:-?}"
fi
grep -E "did not finish within" "$log" | head -1
echo "PASS"
