#!/usr/bin/env bash
# Runs a Catch2 test binary under `mpirun -np N` for Bazel. Rank 0 writes the merged
# per-test results to $XML_OUTPUT_FILE; if mpirun itself fails (a rank crashed or
# hung past the time limit), the failure is recorded there too so it is counted.
set -u
n="$1"; shift
bin="$1"; shift
# Bazel's test sandbox has no hostname resolution worth trusting; keep Open MPI local.
export OMPI_MCA_btl="self,vader,tcp" OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
export FSDP_TEST_MPI_RANKS="$n"
mpirun --oversubscribe -np "$n" "$bin" "$@"
rc=$?
if [ $rc -ne 0 ] && [ -n "${XML_OUTPUT_FILE:-}" ]; then
  cat > "$XML_OUTPUT_FILE" <<XML
<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="mpirun -np $n $(basename "$bin")" tests="1" failures="1" errors="0">
<testcase name="mpirun -np $n"><failure message="mpirun exited with status $rc"/></testcase>
</testsuite></testsuites>
XML
fi
exit $rc
