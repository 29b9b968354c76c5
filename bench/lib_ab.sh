#!/usr/bin/env bash
# Paired A/B of two chorus builds (e.g. before and after a refactoring), in the same minutes: the 8-byte
# allreduce latency and the 64 KiB / 1 MiB / 16 MiB allreduce busbw at 2 and 4 ranks, shared memory and TCP
# (issue 18's speed constraint).  Each repeat runs A then B, or B then A (alternating), so that neither
# build always runs first on a noisy machine; the table gives each build's median over the repeats and
# the ratio B / A (latency: < 1 is faster; busbw: > 1 is faster).
#
#   bash bench/lib_ab.sh BUILD_A BUILD_B [--repeats N] [--np 2,4] [--out DIR]
#   bash bench/lib_ab.sh BUILD_A BUILD_B --report DIR [DIR ...]   (pool earlier runs' raw rows, run nothing)
#
# LIB_AB_ITERS sets the timed iterations per size of the busbw runs (default 20).  On a shared 2-core
# machine one run's cells swing by 0.7-1.5x; run A against A (BUILD_A twice) for the noise floor and pool
# several runs with --report before reading a ratio.
#
# BUILD_x is a build directory holding tools/chorus-run and tools/chorus-bench.  Out-of-place calls only.
set -euo pipefail
a=${1:?usage: lib_ab.sh BUILD_A BUILD_B [--repeats N] [--np 2,4] [--out DIR]}
b=${2:?usage: lib_ab.sh BUILD_A BUILD_B [--repeats N] [--np 2,4] [--out DIR]}
shift 2
repeats=5 nps=2,4 out= report=()
while [ $# -gt 0 ]; do
  case "$1" in
    --report) shift; report=("$@"); break ;;
    --repeats) repeats=$2; shift ;;
    --np) nps=$2; shift ;;
    --out) out=$2; shift ;;
    *) echo "lib_ab.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$out" ] || out=$(mktemp -d "${TMPDIR:-/tmp}/lib_ab.XXXXXX")
for d in "$a" "$b"; do
  [ -x "$d/tools/chorus-run" ] && [ -x "$d/tools/chorus-bench" ] || { echo "lib_ab.sh: no tools/chorus-run and tools/chorus-bench in $d" >&2; exit 2; }
done
if [ ${#report[@]} -eq 0 ]; then
mkdir -p "$out"
run() {  # build label np transport repeat
  local dir=$1 label=$2 np=$3 tr=$4 r=$5 env=()
  [ "$tr" = tcp ] && env=(CHORUS_TRANSPORT=tcp)
  env "${env[@]}" "$dir/tools/chorus-run" -n "$np" --no-prefix --timeout 300 -- "$dir/tools/chorus-bench" allreduce \
    -b 8 -e 8 -n 5000 -w 500 --json "$out/$label.np$np.$tr.small.r$r.jsonl" >/dev/null
  env "${env[@]}" "$dir/tools/chorus-run" -n "$np" --no-prefix --timeout 300 -- "$dir/tools/chorus-bench" allreduce \
    -b 64K -e 16M -f 16 -n ${LIB_AB_ITERS:-20} -w 5 --json "$out/$label.np$np.$tr.large.r$r.jsonl" >/dev/null
}
for r in $(seq 1 "$repeats"); do
  for np in ${nps//,/ }; do
    for tr in shm tcp; do
      if [ $((r % 2)) -eq 1 ]; then run "$a" A "$np" "$tr" "$r"; run "$b" B "$np" "$tr" "$r"
      else run "$b" B "$np" "$tr" "$r"; run "$a" A "$np" "$tr" "$r"; fi
    done
  done
done
report=("$out")
fi
python3 - "$a" "$b" "${report[@]}" <<'PY'
import glob, json, statistics, sys
a, b = sys.argv[1:3]
rows = {}
for f in [f for d in sys.argv[3:] for f in glob.glob(f"{d}/*.jsonl")]:
    label, npx, tr = f.split("/")[-1].split(".")[:3]
    for line in open(f):
        j = json.loads(line)
        if j.get("inplace") or j.get("wrong"):
            continue
        rows.setdefault((int(npx[2:]), tr, j["bytes"]), {}).setdefault(label, []).append(j)
print(f"A = {a}\nB = {b}\nmedian over repeats; out-of-place allreduce (float32, sum)")
print(f"{'ranks':>5} {'transport':>9} {'size':>9}  {'figure':>10} {'A':>10} {'B':>10} {'B / A':>7}")
for (np_, tr, size) in sorted(rows):
    d = rows[(np_, tr, size)]
    if "A" not in d or "B" not in d:
        continue
    key, fig = ("time_us", "lat (us)") if size <= 8 else ("busbw_gbps", "busbw GB/s")
    ma = statistics.median(x[key] for x in d["A"]); mb = statistics.median(x[key] for x in d["B"])
    name = f"{size} B" if size < 1024 else f"{size >> 10} KiB" if size < (1 << 20) else f"{size >> 20} MiB"
    print(f"{np_:>5} {tr:>9} {name:>9}  {fig:>10} {ma:>10.3f} {mb:>10.3f} {mb / ma:>7.3f}")
PY
echo "raw rows: ${report[*]}"
