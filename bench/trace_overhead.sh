#!/usr/bin/env bash
# CHORUS_TRACE's cost on allreduce: runs chorus-bench with and without
# tracing, interleaved (A B A B ...), and prints the median time of each and
# the ratio.  A noisy machine moves both alike; the ratio is the figure.
#
#   bash bench/trace_overhead.sh [BUILD_DIR] [RANKS] [BYTES] [REPS]
#   (defaults: build 2 1M 7; 300 iterations per run)
set -euo pipefail
build=${1:-build}
np=${2:-2}
bytes=${3:-1M}
reps=${4:-7}
iters=${CHORUS_TRACE_BENCH_ITERS:-300}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() {  # prints the out-of-place time (us) of one chorus-bench run
  "$build/tools/chorus-run" -n "$np" "$build/tools/chorus-bench" allreduce -b "$bytes" -e "$bytes" -n "$iters" -w 30 \
    --json "$tmp/row.json" >/dev/null
  python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["time_us"])' "$tmp/row.json"
}
off=() on=()
for i in $(seq "$reps"); do
  off+=("$(run)")
  rm -rf "$tmp/trace"
  on+=("$(CHORUS_TRACE=$tmp/trace CHORUS_CLOCK_SYNC_S=0 run)")
done
python3 - "${off[*]}" "${on[*]}" "$np" "$bytes" "$(du -sb "$tmp/trace" | cut -f1)" "$iters" <<'PY'
import statistics, sys
off = [float(x) for x in sys.argv[1].split()]
on = [float(x) for x in sys.argv[2].split()]
np_, size, trace_bytes, iters = sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
mo, mn = statistics.median(off), statistics.median(on)
print(f"allreduce {size} on {np_} ranks, {len(off)} interleaved runs of {iters} iterations each")
print(f"  untraced: median {mo:.1f} us  (runs: {' '.join(f'{x:.0f}' for x in off)})")
print(f"  traced:   median {mn:.1f} us  (runs: {' '.join(f'{x:.0f}' for x in on)})")
print(f"  overhead: {100 * (mn / mo - 1):+.1f} % of the medians, {100 * (min(on) / min(off) - 1):+.1f} % of the best runs"
      f"   trace size of the last run: {trace_bytes} bytes")
PY
