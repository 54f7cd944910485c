#!/usr/bin/env bash
# A job whose rank dies must end on every rank with a non-zero status, well before the
# collective timeout (mpirun ends the others) and certainly not hang.
set -u
probe="$1"
wrapper="$2"
start=$(date +%s)
# The wrapper records mpirun's failure as a test failure in XML_OUTPUT_FILE; here failure
# is the expected outcome, so it must not write there.
XML_OUTPUT_FILE= timeout 120 bash "$wrapper" 2 "$probe"
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "mpirun exited with status $rc after ${elapsed}s"
if [ "$rc" -eq 0 ]; then echo "FAIL: the job succeeded although a rank died"; exit 1; fi
if [ "$rc" -eq 124 ]; then echo "FAIL: the job hung"; exit 1; fi
if [ "$elapsed" -ge 60 ]; then echo "FAIL: the job took ${elapsed}s to end"; exit 1; fi
echo "PASS"
