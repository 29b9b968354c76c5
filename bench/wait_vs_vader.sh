#!/usr/bin/env bash
# Small-message latency under CPU contention (issue 20 item 2): 2 ranks, 8 B - 8 KiB out-of-place float sum
# allreduce, chorus over shared memory against Open MPI's vader (`mpi_yield_when_idle 1`), with 0, 1 and 2
# background busy loops (a pure CPU loop each) on the machine's cores.  Each round starts the loops, runs
# chorus and vader in a rotating order, and stops the loops; the table gives each library's median over
# the rounds of the slowest rank's mean time per call, every round's figure, and the ratio chorus / vader
# (<= 1: chorus as fast or faster).  Timings are reported, never asserted: not for CI.
#
#   bash bench/wait_vs_vader.sh [BUILD_DIR] [--rounds N] [--out DIR]
#
# BUILD_DIR (default build) holds tools/chorus-run, tools/chorus-bench and bench/peers/mpi_coll_bench (built
# when Open MPI's development files are installed: scripts/setup.sh).  5,000 timed calls per size (1,000
# with 2 loops, where vader can take milliseconds per call), 100 warm-up calls.
set -euo pipefail
build=build
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then build=$1; shift; fi
rounds=3 out=$(mktemp -d "${TMPDIR:-/tmp}/wait_vs_vader.XXXXXX")
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift ;;
    --out) out=$2; shift ;;
    *) echo "wait_vs_vader.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mpib=$build/bench/peers/mpi_coll_bench
for f in "$build/tools/chorus-run" "$build/tools/chorus-bench" "$mpib"; do
  [ -x "$f" ] || { echo "wait_vs_vader.sh: no $f (build the default preset with Open MPI installed)" >&2; exit 2; }
done
command -v mpirun >/dev/null || { echo "wait_vs_vader.sh: no mpirun on PATH" >&2; exit 2; }
mkdir -p "$out"

run() {  # library loops round
  local lib=$1 n=$2 r=$3 iters=5000
  [ "$n" -ge 2 ] && iters=1000
  local json=$out/$lib.bg$n.r$r.jsonl args=(allreduce -b 8 -e 8192 -f 2 -n "$iters" -w 100 -c 1 --json)
  if [ "$lib" = vader ]; then
    timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 --mca mpi_yield_when_idle 1 \
      --mca btl self,vader -np 2 "$mpib" "${args[@]}" "$json" >/dev/null 2>&1 ||
      echo "wait_vs_vader.sh: vader, $n loops, round $r failed" >&2
  else
    timeout 300 "$build/tools/chorus-run" --bind-to none -n 2 --no-prefix --timeout 300 -- "$build/tools/chorus-bench" \
      "${args[@]}" "$json" >/dev/null 2>&1 || echo "wait_vs_vader.sh: chorus, $n loops, round $r failed" >&2
  fi
}

loops=()
stop_loops() {
  local p
  for p in "${loops[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  loops=()
}
trap stop_loops EXIT
libs=(chorus vader)
for r in $(seq 1 "$rounds"); do
  for n in 0 1 2; do
    for _ in $(seq 1 "$n"); do
      (while :; do :; done) &
      loops+=($!)
    done
    sleep 0.5
    first=$(((r + n) % 2))
    run "${libs[$first]}" "$n" "$r"
    run "${libs[$((1 - first))]}" "$n" "$r"
    stop_loops
  done
done

python3 - "$out" "$rounds" <<'PY'
import collections, glob, json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
t = collections.defaultdict(dict)
for f in glob.glob(f"{out}/*.jsonl"):
    lib, bg, rnd = f.split("/")[-1].split(".")[:3]
    for line in open(f):
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if row.get("inplace"):
            continue
        t[(lib, bg, row["bytes"])][rnd] = row["time_us"]
for bg in ("bg0", "bg1", "bg2"):
    sizes = sorted({k[2] for k in t if k[1] == bg})
    if not sizes:
        continue
    print(f"\n{bg[2:]} busy loops: us per call, median over {rounds} rounds [each round]; ratio = chorus / vader")
    worst = None
    for s in sizes:
        c, v = t.get(("chorus", bg, s), {}), t.get(("vader", bg, s), {})
        if not c or not v:
            print(f"{s:>6}  (missing)")
            continue
        mc, mv = statistics.median(c.values()), statistics.median(v.values())
        each = lambda d: " ".join(f"{d[k]:.2f}" for k in sorted(d))
        print(f"{s:>6}  chorus {mc:8.2f} [{each(c)}]  vader {mv:8.2f} [{each(v)}]  {mc / mv:6.2f}x")
        if worst is None or mc / mv > worst[0]:
            worst = (mc / mv, s)
    if worst:
        print(f"worst ratio {worst[0]:.2f} at {worst[1]} B ({'met' if worst[0] <= 1 else 'missed'}: chorus <= vader)")
print(f"\nraw rows: {out}")
PY
