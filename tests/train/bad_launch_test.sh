#!/usr/bin/env bash
# Bad launches fail at start, on every rank, with exit code 2 and a message naming the key:
# an impossible mesh (dist.dp_outer=3, dist.dp_shard=3 or model.tensor_model_parallel_size=3
# on 2 or 4 ranks), a global batch that is not a multiple of
# micro-batch x data-parallel size, an unknown sharding strategy. Each run of the train
# binary under `mpirun -np 2` and `-np 4` must end quickly (no hang), train nothing and
# leave no output directory behind. A valid run with the same settings succeeds, so the
# failures are the bad keys' doing.
#
# Every case runs twice: as users launch it (mpirun's status must be 2), and with mpirun
# told not to end the job when one rank exits non-zero, so that each rank's own status is
# seen: every rank must fail by itself (none may wait for, or be killed after, another).
#
# Usage: bad_launch_test.sh TRAIN_BINARY   (run from the workspace root: configs/, third_party/)
set -u
train="$1"
source tests/sh_test_support.sh bad_launch

fail() {
  echo "FAIL: $*"
  [ -f "$work/run.log" ] && tail -n 30 "$work/run.log"
  exit 1
}

# A small corpus (fast to tokenize) and a tiny model: a valid run takes a few seconds.
head -c 8000 third_party/text/austen.txt > "$work/text.txt"
common=(--config configs/tiny.json model.n_layer=1 model.d_model=32 model.n_head=2
        model.seq_length=16 train.train_iters=1 train.micro_batch_size=1
        train.global_batch_size=4 train.eval_interval=0 dataset.train_path="$work/text.txt"
        dataset.val_fraction=0 dist.device=cpu logger.log_interval=1)

# launch NP OVERRIDE...: runs the train binary on NP ranks into $work/out, each rank
# appending "RANK STATUS" to $work/ranks.txt. Sets $rc (mpirun's status; 124: timed out).
# With $keep_going set, mpirun lets every rank run to its own end.
launch() {
  local np="$1"; shift
  rm -rf "$work/out" "$work/ranks.txt"
  OMPI_MCA_orte_abort_on_non_zero_status=$([ -n "${keep_going:-}" ] && echo 0 || echo 1) \
  timeout 120 mpirun --oversubscribe -np "$np" sh -c \
    '"$0" "$@"; s=$?; echo "${OMPI_COMM_WORLD_RANK:-?} $s" >> "$RANKS_FILE"; exit $s' \
    "$train" "${common[@]}" run.output_dir="$work/out" "$@" > "$work/run.log" 2>&1
  rc=$?
}
export RANKS_FILE="$work/ranks.txt"

# expect_refused NP KEY OVERRIDE...
expect_refused() {
  local np="$1" key="$2"; shift 2
  local what="-np $np $*"
  local t0=$SECONDS
  local keep_going
  for keep_going in "" 1; do
    launch "$np" "$@"
    [ $rc -ne 124 ] || fail "$what: still running after 120 s (a hang)"
    if [ -z "$keep_going" ]; then
      [ $rc -eq 2 ] || fail "$what: mpirun exited with status $rc, expected 2 (configuration error)"
    else
      [ "$(awk '$2 == 2' "$work/ranks.txt" 2>/dev/null | wc -l)" -eq "$np" ] \
        || fail "$what: not every rank exited 2 by itself: $(tr '\n' ' ' < "$work/ranks.txt" 2>/dev/null)"
      # Every rank says why it stops.
      [ "$(grep -c "^\[rank [0-9]*\] configuration error: .*$key" "$work/run.log")" -eq "$np" ] \
        || fail "$what: not every rank printed the configuration error"
    fi
    grep -q "configuration error: .*$key" "$work/run.log" \
      || fail "$what: no 'configuration error' message naming '$key'"
    grep -qE "^training:|^step " "$work/run.log" && fail "$what: the run started"
    [ -e "$work/out" ] && fail "$what: left $work/out behind: $(ls -A "$work/out" | tr '\n' ' ')"
  done
  echo "ok: $what -> status 2 on every rank, message names $key ($((SECONDS - t0)) s for both runs)"
}

for np in 2 4; do
  expect_refused "$np" "dist.dp_outer" dist.dp_outer=3
  expect_refused "$np" "dist.dp_shard" dist.dp_shard=3
  expect_refused "$np" "model.tensor_model_parallel_size" model.tensor_model_parallel_size=3
  # 3 sequences cannot be split into micro-batches of 1 over 2 or 4 ranks.
  expect_refused "$np" "train.global_batch_size" train.global_batch_size=3
  expect_refused "$np" "ddp.data_parallel_sharding_strategy" ddp.data_parallel_sharding_strategy=zero9
done

# The control: the same settings without a bad key train and write their output.
launch 2 ddp.data_parallel_sharding_strategy=optim_grads_params
[ $rc -eq 0 ] || fail "the valid run exited with status $rc"
grep -q "^step 1/1" "$work/run.log" || fail "the valid run printed no step line"
[ -f "$work/out/run_config.json" ] || fail "the valid run wrote no run_config.json"
[ "$(awk '$2 == 0' "$work/ranks.txt" | wc -l)" -eq 2 ] || fail "not every rank of the valid run exited 0"
echo "ok: the valid run trained and exited 0 on both ranks"
echo "PASS"
