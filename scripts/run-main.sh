#!/usr/bin/env bash
# The first thing to try: installs the dependencies, builds the tools and runs
# a 4-rank allreduce sweep from 8 B to 64 MB on this machine (shared memory),
# printing chorus-bench's nccl-tests-style table (every element checked).
#
#   bash scripts/run-main.sh
#
# Build directory: $CHORUS_BUILD_DIR (default build/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build_dir=${CHORUS_BUILD_DIR:-build}

bash scripts/setup.sh
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build_dir" -j "${CHORUS_JOBS:-2}" --target chorus-run chorus-bench

"$build_dir/tools/chorus-run" -n 4 --no-prefix --timeout 600 -- \
  "$build_dir/tools/chorus-bench" allreduce -b 8 -e 64M -f 4 -w 5 -n 20
