# Sourced by the shell tests (from the workspace root):
#   source tests/sh_test_support.sh NAME
# sets $work to a fresh, empty directory NAME under the test's scratch space, and keeps
# Open MPI on this machine (loopback only, no shared-memory single copy, oversubscription
# allowed), as Bazel's sandbox needs.
# Also defines fail (a message, the logs, exit 1) and losses (a metrics file's "STEP LOSS" lines).
work="${TEST_TMPDIR:-$(mktemp -d)}/$1"
rm -rf "$work"
mkdir -p "$work"
export OMPI_MCA_btl="self,vader,tcp" OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1

# Ends the test with a message and the last lines of every log under $work.
fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log; do echo "---- $f"; tail -n 20 "$f"; done
  exit 1
}

# "STEP LOSS" of every record of a train metrics file (metrics.jsonl).
losses() { sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1"; }
