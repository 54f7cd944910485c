#!/usr/bin/env bash
# fsdp.cpp as an installed library: the install tree (what scripts/install.sh copies to a
# prefix) is copied to a fresh prefix, tests/consumer is built against it with CMake
# (find_package(fsdp): fsdp::fsdp and fsdp::fsdp_static) and with its plain Makefile
# (pkg-config: fsdp and fsdp-static), and the four programs train under mpirun -np 2: each
# one's loss falls, and all four print the same losses, bit for bit.
# Usage: consumer_test.sh INSTALL_TREE CONSUMER_DIR
set -u
tree="$1"
sources="$2"
source tests/sh_test_support.sh consumer

fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log; do echo "---- $f"; tail -n 30 "$f"; done
  exit 1
}

# A prefix elsewhere than where Bazel wrote the tree: the package files must be relocatable.
cp -r "$tree" "$work/prefix"
chmod -R u+w "$work/prefix"
mkdir "$work/src"
cp "$sources/main.cc" "$sources/CMakeLists.txt" "$sources/Makefile" "$work/src/"

cmake -S "$work/src" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$work/prefix" \
  > "$work/cmake_configure.log" 2>&1 || fail "cmake configure"
cmake --build "$work/cmake" > "$work/cmake_build.log" 2>&1 || fail "cmake build"
make -C "$work/src" FSDP_PREFIX="$work/prefix" > "$work/make.log" 2>&1 || fail "make"
# The shared builds find libfsdp.so in the prefix by themselves (rpath).
ldd "$work/src/consumer" | grep -q "$work/prefix/.*libfsdp.so" || fail "make's consumer: no libfsdp.so"
ldd "$work/src/consumer_static" | grep -q "libfsdp.so" && fail "consumer_static links libfsdp.so"

losses() { sed -n 's/^step [0-9]*\/20 loss \([0-9.]*\)$/\1/p' "$1"; }
for program in cmake/consumer cmake/consumer_static src/consumer src/consumer_static; do
  log="$work/$(echo "$program" | tr / _).log"
  mpirun --oversubscribe -np 2 "$work/$program" > "$log" 2>&1 || fail "$program exited with status $?"
  [ "$(losses "$log" | wc -l)" -eq 20 ] || fail "$program: expected 20 step lines"
  first=$(losses "$log" | head -n 1)
  last=$(losses "$log" | tail -n 1)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.8 * a) }' \
    || fail "$program: the loss did not fall enough ($first -> $last)"
  echo "$program under mpirun -np 2: loss $first -> $last"
  losses "$log" > "$log.losses"
done
for other in cmake_consumer_static src_consumer src_consumer_static; do
  cmp -s "$work/cmake_consumer.log.losses" "$work/$other.log.losses" \
    || fail "$other printed other losses than cmake/consumer"
done
# One process trains too.
"$work/cmake/consumer" > "$work/single.log" 2>&1 || fail "one process exited with status $?"
[ "$(losses "$work/single.log" | wc -l)" -eq 20 ] || fail "one process: expected 20 step lines"
echo "PASS"
