#!/usr/bin/env bash
# A job whose rank dies must end on every rank with a non-zero status, well before the
# collective timeout (mpirun ends the others), with a message naming the dead rank, and
# certainly not hang.
#   dead_rank_test.sh PROBE MPIRUN_WRAPPER [BACKEND]
set -u
probe="$1"
wrapper="$2"
backend="${3:-mpi}"
start=$(date +%s)
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# The wrapper records mpirun's failure as a test failure in XML_OUTPUT_FILE; here failure
# is the expected outcome, so it must not write there.
XML_OUTPUT_FILE= timeout 120 bash "$wrapper" 2 "$probe" "$backend" > "$log" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$log"
echo "mpirun exited with status $rc after ${elapsed}s (backend $backend)"
if [ "$rc" -eq 0 ]; then echo "FAIL: the job succeeded although a rank died"; exit 1; fi
if [ "$rc" -eq 124 ]; then echo "FAIL: the job hung"; exit 1; fi
if [ "$elapsed" -ge 60 ]; then echo "FAIL: the job took ${elapsed}s to end"; exit 1; fi
grep -qE "rank 1 .*(exited|signal)|process rank 1" "$log" || {
  echo "FAIL: no message names the dead rank (rank 1)"; exit 1; }
echo "PASS"
