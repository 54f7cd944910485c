#!/bin/sh
# Bazel's workspace status (see .bazelrc): the git revision that `train --version` reports.
cd "$(dirname "$0")/.." || exit 0
rev=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [ "$rev" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  rev="$rev-dirty"
fi
echo "STABLE_GIT_REVISION $rev"
