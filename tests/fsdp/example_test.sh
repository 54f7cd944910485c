#!/usr/bin/env bash
# The embedding example (tools/example) is documentation that must keep working: it runs
# as one process and under `mpirun -np 2`, exits 0, and its loss falls; the first step's
# loss does not depend on how the same global batch is split over ranks and strategies;
# a bad flag is refused with exit code 2 before anything starts.
# Usage: example_test.sh EXAMPLE_BINARY
set -u
example="$1"
source tests/sh_test_support.sh example

fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log; do echo "---- $f"; tail -n 20 "$f"; done
  exit 1
}

# The losses of a log, one per line, in step order.
losses() { sed -n 's/^step [0-9]*\/[0-9]* loss \([0-9.]*\) .*/\1/p' "$1"; }

# check_falls LOG STEPS: STEPS loss lines, and the last is below 80% of the first.
check_falls() {
  [ "$(losses "$1" | wc -l)" -eq "$2" ] || fail "$1: expected $2 step lines"
  local first last
  first=$(losses "$1" | head -n 1)
  last=$(losses "$1" | tail -n 1)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.8 * a) }' \
    || fail "$1: the loss did not fall enough ($first -> $last)"
  echo "$(basename "$1"): loss $first -> $last"
}

# Global batch of 2 micro-batches of 4 sequences in every run: 1 rank x 2, or 2 ranks x 1.
small=(--layers 2 --d-model 32 --heads 2 --batch 4 --seq 16 --lr 1e-2)

"$example" "${small[@]}" --steps 12 --micro-batches 2 --strategy optim_grads_params \
  > "$work/single.log" 2>&1 || fail "one process (ZeRO-3) exited with status $?"
check_falls "$work/single.log" 12

mpirun --oversubscribe -np 2 "$example" "${small[@]}" --steps 12 --micro-batches 1 \
  --strategy optim_grads > "$work/np2.log" 2>&1 || fail "mpirun -np 2 (ZeRO-2) exited with status $?"
check_falls "$work/np2.log" 12

mpirun --oversubscribe -np 2 "$example" "${small[@]}" --steps 1 --micro-batches 1 \
  --strategy no_shard > "$work/np2_ddp.log" 2>&1 || fail "mpirun -np 2 (no_shard) exited with status $?"

# Step 1 runs on the same initial weights (initialization does not depend on sharding) and
# the same 8 sequences in each run: the same loss up to the order of the sums.
a=$(losses "$work/single.log" | head -n 1)
for log in np2 np2_ddp; do
  b=$(losses "$work/$log.log" | head -n 1)
  awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-3) }' \
    || fail "step 1 loss $b of $log differs from the single process's $a"
done

"$example" --strategy zero9 > "$work/bad_flag.log" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "an unknown strategy exited with status $rc, expected 2"
grep -q "unknown sharding strategy 'zero9'" "$work/bad_flag.log" || fail "no message naming the strategy"
grep -q "^step" "$work/bad_flag.log" && fail "a run with a bad flag trained"

# Flags out of range are refused by name (they used to divide by zero, read past the text,
# or wrap around).
for flags in "--seq 374" "--seq 100000" "--lr abc" "--lr -1" "--steps 4294967297" "--steps 0"; do
  # shellcheck disable=SC2086
  "$example" $flags > "$work/bad.log" 2>&1
  rc=$?
  [ $rc -eq 2 ] || fail "'$flags' exited with status $rc, expected 2"
  grep -q -- "${flags%% *}" "$work/bad.log" || fail "'$flags': the message does not name the flag"
  grep -q "^step" "$work/bad.log" && fail "'$flags' trained"
done
echo "PASS"
