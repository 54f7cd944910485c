#!/usr/bin/env bash
# Installs fsdp.cpp as a library under PREFIX, for programs built without Bazel:
#
#   scripts/install.sh PREFIX
#
#   PREFIX/include/fsdp/...                  headers, at their paths in this repository
#   PREFIX/lib/libfsdp.so, libfsdp.a         the whole runtime, shared and static
#   PREFIX/lib/pkgconfig/fsdp.pc             pkg-config --cflags --libs fsdp (shared)
#   PREFIX/lib/pkgconfig/fsdp-static.pc      ... fsdp-static (the archive and its libraries)
#   PREFIX/lib/cmake/fsdp/fsdpConfig.cmake   find_package(fsdp): fsdp::fsdp, fsdp::fsdp_static
#
# The CUDA configuration when a toolkit is present, the CPU-only one otherwise (as
# scripts/train.sh). The installed files are relocatable: move PREFIX anywhere.
# tests/consumer shows a program built against it with CMake and with make.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

[ $# -eq 1 ] || { echo "usage: scripts/install.sh PREFIX" >&2; exit 2; }
mkdir -p "$1"
prefix="$(cd "$1" && pwd)"

bazel build "${BAZEL_FLAGS[@]}" //:fsdp_install
tree="$(bazel info "${BAZEL_FLAGS[@]}" bazel-bin 2>/dev/null)/fsdp_install"
# Replace what an earlier install put there, and nothing else of PREFIX.
rm -rf "$prefix/include/fsdp" "$prefix/lib/cmake/fsdp"
rm -f "$prefix/lib/libfsdp.so" "$prefix/lib/libfsdp.a" "$prefix/lib/pkgconfig/fsdp.pc" \
  "$prefix/lib/pkgconfig/fsdp-static.pc"
mkdir -p "$prefix"
cp -r "$tree/." "$prefix/"
chmod -R u+w "$prefix/include/fsdp" "$prefix/lib"
echo "installed fsdp.cpp ($BAZEL_CONFIG configuration) in $prefix"
