#!/usr/bin/env bash
# 8 B allreduce latency on OpenCL buffers against host buffers (issue 41's "8 B within 2x of the host path"),
# paired and interleaved: each repeat runs the host sweep, the OpenCL sweep with the call returning before the
# queue (CHORUS_DEVICE_ASYNC=1, the default) and with the blocking call (CHORUS_DEVICE_ASYNC=0), in an order
# that rotates every repeat.  chorus-bench's time per call is a window of -n calls ended by
# chorusStreamSynchronize (clFinish on an OpenCL stream), so an asynchronous call is timed as issue rate plus
# the drain, as a training loop would see it.  Prints each variant's median time (out of place, in place) and
# the median of the paired ratios variant / host, with the load average.
#
#   bash bench/device_latency.sh [--build DIR] [--np 2] [--repeats 3] [--iters 2000] [--staging map]
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$here/build np=2 repeats=3 iters=2000 staging=map
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift ;;
    --np) np=$2; shift ;;
    --repeats) repeats=$2; shift ;;
    --iters) iters=$2; shift ;;
    --staging) staging=$2; shift ;;
    *) echo "device_latency.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
bench=$build/tools/chorus-bench
[ -x "$bench" ] || { echo "device_latency.sh: no $bench (ninja -C $build chorus-bench)" >&2; exit 2; }
out=$(mktemp -d "${TMPDIR:-/tmp}/device_latency.XXXXXX")
labels=(host async sync)
for r in $(seq 1 "$repeats"); do
  echo "repeat $r load before: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/load.txt"
  for i in 0 1 2; do
    label=${labels[$(((i + r - 1) % 3))]}
    case $label in
      host) env=() mem=host ;;
      async) env=(CHORUS_DEVICE_ASYNC=1 CHORUS_DEVICE_STAGING=$staging) mem=opencl ;;
      sync) env=(CHORUS_DEVICE_ASYNC=0 CHORUS_DEVICE_STAGING=$staging) mem=opencl ;;
    esac
    env "${env[@]}" timeout 180 "$bench" allreduce --np "$np" -b 8 -e 8 -n "$iters" -w 200 -c 1 --memory "$mem" \
      --json "$out/$label.r$r.jsonl" >"$out/$label.r$r.txt" 2>&1 || echo "$label r$r failed" | tee -a "$out/errors.txt"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/load.txt"
python3 - "$out" "$repeats" <<'PY'
import json, pathlib, statistics, sys
out, repeats = pathlib.Path(sys.argv[1]), int(sys.argv[2])
t = {}  # (label, repeat, inplace) -> time_us
for label in ("host", "async", "sync"):
    for r in range(1, repeats + 1):
        f = out / f"{label}.r{r}.jsonl"
        for line in (f.read_text().splitlines() if f.exists() else []):
            row = json.loads(line)
            if row.get("bytes") == 8:
                t[label, r, row["inplace"]] = row["time_us"]
for inplace in (False, True):
    print(f"== 8 B allreduce, {'in place' if inplace else 'out of place'} (us per call)")
    for label in ("host", "async", "sync"):
        vals = [t[label, r, inplace] for r in range(1, repeats + 1) if (label, r, inplace) in t]
        ratios = [t[label, r, inplace] / t["host", r, inplace] for r in range(1, repeats + 1)
                  if (label, r, inplace) in t and ("host", r, inplace) in t]
        if not vals:
            print(f"  {label:6s} no rows")
            continue
        line = f"  {label:6s} median {statistics.median(vals):9.2f}   per repeat {' '.join(f'{v:.2f}' for v in vals)}"
        if label != "host" and ratios:
            line += f"   / host: median {statistics.median(ratios):.1f}x ({' '.join(f'{x:.1f}' for x in ratios)})"
        print(line)
print(f"# raw rows: {out}")
PY
