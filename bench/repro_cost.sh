#!/usr/bin/env bash
# The cost of reproducible reductions (CHORUS_REPRODUCIBLE, issue 19): allreduce (float32, sum,
# out of place) under off, canonical and exact side by side, in the same minutes.  Each repeat runs
# the three modes in a rotating order (off-canonical-exact, canonical-exact-off, exact-off-canonical)
# so that no mode always runs first on a noisy machine; the table gives each mode's median time over
# the repeats and the ratios canonical / off and exact / off (issue 19's goals at >= 1 MiB: canonical
# <= 1.3x, exact <= 4x).  Timings are reported, never asserted: not for CI.
#
#   bash bench/repro_cost.sh [BUILD] [--repeats N] [--np 2,4,8] [--sizes 1M,4M,16M] [--iters 10] [--out DIR]
#
# --iters: timed calls per size in each run (chorus-bench -n); small sizes on a noisy VM need more
# for a repeat's ratio to mean something.
#
# BUILD is a build directory holding tools/chorus-run and tools/chorus-bench (default: build).
# -c 1: chorus-bench fills the inputs with its pattern (and checks one call per size, untimed); with -c 0
# they are whatever the allocator gave, which exact mode's range agreement would take at face value.
# The pattern's values span ~12 binades, so exact carries one int64 word per float (its narrow layout);
# data over fp32's whole range would take five or six (docs/algorithms.md).
set -euo pipefail
build=build
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then build=$1; shift; fi
repeats=5 nps=2,4,8 sizes=1M,4M,16M iters=10 out=$(mktemp -d "${TMPDIR:-/tmp}/repro_cost.XXXXXX")
while [ $# -gt 0 ]; do
  case "$1" in
    --repeats) repeats=$2; shift ;;
    --np) nps=$2; shift ;;
    --sizes) sizes=$2; shift ;;
    --iters) iters=$2; shift ;;
    --out) out=$2; shift ;;
    *) echo "repro_cost.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$build/tools/chorus-run" ] && [ -x "$build/tools/chorus-bench" ] ||
  { echo "repro_cost.sh: no tools/chorus-run and tools/chorus-bench in $build" >&2; exit 2; }
mkdir -p "$out"
modes=(off canonical exact)
run() {  # mode np transport repeat size
  local mode=$1 np=$2 tr=$3 r=$4 size=$5
  local env=(CHORUS_REPRODUCIBLE="$mode")
  [ "$tr" = tcp ] && env+=(CHORUS_TRANSPORT=tcp)
  env "${env[@]}" "$build/tools/chorus-run" -n "$np" --no-prefix --timeout 600 -- "$build/tools/chorus-bench" allreduce \
    -b "$size" -e "$size" -n "$iters" -w 3 -c 1 --json "$out/$mode.np$np.$tr.$size.r$r.jsonl" >/dev/null
}
for r in $(seq 1 "$repeats"); do
  for np in ${nps//,/ }; do
    for tr in shm tcp; do
      for size in ${sizes//,/ }; do
        for k in 0 1 2; do run "${modes[$(((r + k) % 3))]}" "$np" "$tr" "$r" "$size"; done
      done
    done
  done
done
python3 - "$out" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
rows = {}  # (np, transport, bytes) -> mode -> {repeat: time}
for f in glob.glob(f"{out}/*.jsonl"):
    mode, npx, tr, _size, rep = f.split("/")[-1].split(".")[:5]
    for line in open(f):
        j = json.loads(line)
        if j.get("inplace"):
            continue
        rows.setdefault((int(npx[2:]), tr, j["bytes"]), {}).setdefault(mode, {})[rep] = j["time_us"]
print("median time (us) over repeats; out-of-place allreduce (float32, sum); ratio = mode / off;")
print("worst = the largest ratio of a single repeat (the three modes of a repeat run back to back)")
print(f"{'ranks':>5} {'transport':>9} {'size':>8} {'off':>10} {'canonical':>10} {'exact':>10} {'canon/off':>9} "
      f"{'exact/off':>9} {'worst c/o':>9} {'worst e/o':>9}")
for key in sorted(rows):
    d = rows[key]
    if not all(m in d for m in ("off", "canonical", "exact")):
        continue
    off, can, ex = (statistics.median(d[m].values()) for m in ("off", "canonical", "exact"))
    reps = [r for r in d["off"] if r in d["canonical"] and r in d["exact"]]
    wc = max(d["canonical"][r] / d["off"][r] for r in reps)
    we = max(d["exact"][r] / d["off"][r] for r in reps)
    np_, tr, size = key
    name = f"{size >> 20} MiB" if size >= (1 << 20) else f"{size >> 10} KiB"
    print(f"{np_:>5} {tr:>9} {name:>8} {off:>10.1f} {can:>10.1f} {ex:>10.1f} {can / off:>9.2f} {ex / off:>9.2f} "
          f"{wc:>9.2f} {we:>9.2f}")
PY
echo "raw rows: $out"
