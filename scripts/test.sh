#!/usr/bin/env bash
# Installs the dependencies, builds chorus and runs every test: unit (gtest),
# integration (multi-process jobs under chorus-run), cluster (network
# namespaces as hosts; needs root, or CHORUS_SKIP_CLUSTER=1 to skip) and
# install (an outside C and C++ program against an installed tree).
#
#   bash scripts/test.sh                 # everything
#   bash scripts/test.sh -L integration  # extra arguments go to ctest
#
# Exits with ctest's status.  Build directory: $CHORUS_BUILD_DIR (default build/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build_dir=${CHORUS_BUILD_DIR:-build}
jobs=${CHORUS_JOBS:-2}

bash scripts/setup.sh
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build_dir" -j "$jobs"

status=0
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 600 "$@" || status=$?
exit "$status"
