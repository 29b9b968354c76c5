#!/usr/bin/env bash
# The always-on mismatch check's cost on the shared-memory board (8-byte
# allreduce, 2 ranks): the HEAD commit against itself with the board's signature
# word and its compare removed (bench/patches/no-board-check.patch; a
# measuring aid, not a library option), both built apart in Release-like
# RelWithDebInfo, then timed in interleaved pairs by bench/pair_latency.py.
#
#   bash bench/board_check_ab.sh [--blocks 3] [--pairs 30]   (other arguments go to pair_latency.py)
#
# Needs a quiet machine: the figure is a median of pair ratios per block, and
# a goal counts when every block agrees.  Work folder: $CHORUS_AB_DIR (default
# a fresh temporary one), removed at the end unless CHORUS_AB_KEEP=1.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${CHORUS_AB_DIR:-$(mktemp -d)}
cleanup() {
  for side in with without; do git -C "$here" worktree remove --force "$work/$side" >/dev/null 2>&1 || true; done
  [[ ${CHORUS_AB_KEEP:-0} == 1 ]] || rm -rf "$work"
}
trap cleanup EXIT
# Both sides from the same commit (HEAD; uncommitted changes are not measured).
git -C "$here" worktree add --detach "$work/with" HEAD >/dev/null
git -C "$here" worktree add --detach "$work/without" HEAD >/dev/null
git -C "$work/without" apply "$here/bench/patches/no-board-check.patch"
for side in with without; do
  src=$work/$side
  cmake -S "$src" -B "$work/build-$side" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCHORUS_BUILD_TESTS=OFF >/dev/null
  cmake --build "$work/build-$side" -j "${CHORUS_JOBS:-2}" --target chorus-run chorus-bench >/dev/null
done
python3 "$here/bench/pair_latency.py" --a "$work/build-without/tools" --b "$work/build-with/tools" "$@"
