#!/usr/bin/env bash
# Allreduce on OpenCL buffers against host buffers, paired and interleaved (issue 41's speed check): each repeat
# runs the host sweep and one sweep per staging mode (CHORUS_DEVICE_STAGING), in an order that rotates every
# repeat, so no mode always runs first on a noisy machine; the table gives each mode's median busbw (or 8 B time)
# over the repeats and the median of the paired ratios mode / host of the same repeat.
#
#   bash bench/device_ab.sh [--build DIR] [--modes map,pipeline,whole,cuda] [--np 2,4] [--repeats 3] [--out DIR]
#                           [--sizes 1M,64M,4] [--iters 10]
#   bash bench/device_ab.sh --report DIR          (the table of an earlier run's rows, run nothing)
#
# A mode is an OpenCL staging mode, or `cuda`: the same sweep on CUDA device memory (chorus-bench --memory cuda;
# CHORUS_CUDA_DRIVER picks the driver).
# Float32 sum, out of place (the in-place column of chorus-bench is in the raw rows), every row checked (-c 1).
# The load average before and after each repeat goes into DIR/load.txt: quote it next to the figures.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$here/build modes=map,pipeline,whole nps=2,4 repeats=3 out= sizes=1M,64M,4 iters=10 report=
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift ;;
    --modes) modes=$2; shift ;;
    --np) nps=$2; shift ;;
    --repeats) repeats=$2; shift ;;
    --out) out=$2; shift ;;
    --sizes) sizes=$2; shift ;;
    --iters) iters=$2; shift ;;
    --report) report=$2; shift ;;
    *) echo "device_ab.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$report" ]; then
  [ -n "$out" ] || out=$(mktemp -d "${TMPDIR:-/tmp}/device_ab.XXXXXX")
  mkdir -p "$out"
  IFS=, read -r lo hi factor <<<"$sizes"
  bench=$build/tools/chorus-bench
  [ -x "$bench" ] || { echo "device_ab.sh: no $bench (ninja -C $build chorus-bench chorus-run)" >&2; exit 2; }
  one() {  # label np repeat
    local label=$1 np=$2 r=$3 mem=opencl env=()
    case $label in
      host|cuda) mem=$label ;;  # cuda: device pointers on a CUDA stream (whole-buffer staging)
      *) env=(CHORUS_DEVICE_STAGING=$label) ;;
    esac
    env "${env[@]}" timeout 300 "$bench" allreduce --np "$np" -b "$lo" -e "$hi" -f "$factor" -n "$iters" -w 3 -c 1 \
      --memory "$mem" --json "$out/$label.np$np.large.r$r.jsonl" >"$out/$label.np$np.large.r$r.txt" 2>&1 ||
      echo "$label np$np r$r large failed" >>"$out/errors.txt"
    env "${env[@]}" timeout 120 "$bench" allreduce --np "$np" -b 8 -e 8 -n 1000 -w 100 -c 1 --memory "$mem" \
      --json "$out/$label.np$np.small.r$r.jsonl" >"$out/$label.np$np.small.r$r.txt" 2>&1 ||
      echo "$label np$np r$r 8B failed" >>"$out/errors.txt"
  }
  labels=(host ${modes//,/ })
  for r in $(seq 1 "$repeats"); do
    echo "repeat $r before: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/load.txt"
    for np in ${nps//,/ }; do
      n=${#labels[@]}
      for i in $(seq 0 $((n - 1))); do one "${labels[$(((i + r - 1) % n))]}" "$np" "$r"; done
    done
    echo "repeat $r after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/load.txt"
  done
  report=$out
fi
python3 - "$report" <<'EOF'
import json, pathlib, re, statistics, sys
out = pathlib.Path(sys.argv[1])
runs = {}  # (label, np, kind, repeat) -> {bytes: row}
for f in out.glob("*.jsonl"):
    m = re.match(r"(\w+)\.np(\d+)\.(large|small)\.r(\d+)\.jsonl", f.name)
    if not m:
        continue
    rows = {}
    for line in f.read_text().splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if "bytes" in j and not j.get("inplace"):
            rows[j["bytes"]] = j
    runs[(m[1], int(m[2]), m[3], int(m[4]))] = rows
labels = sorted({k[0] for k in runs} - {"host"})
print("| ranks | size | host | " + " | ".join(f"{l} (ratio {l}/host)" for l in labels) + " |")
print("|---:|---:|---:|" + "---:|" * len(labels))
for np in sorted({k[1] for k in runs}):
    for kind in ("small", "large"):
        sizes = sorted({b for k, rows in runs.items() if k[1] == np and k[2] == kind for b in rows})
        for size in sizes:
            key = "time_us" if kind == "small" else "busbw_gbps"
            def vals(label):
                return {k[3]: rows[size][key] for k, rows in runs.items()
                        if k[0] == label and k[1] == np and k[2] == kind and size in rows}
            host = vals("host")
            if not host:
                continue
            cells = []
            for l in labels:
                v = vals(l)
                ratios = [v[r] / host[r] for r in v if r in host and host[r] > 0]
                cells.append(f"{statistics.median(v.values()):.3g} (x{statistics.median(ratios):.2f}, n={len(ratios)})"
                             if ratios else "-")
            unit = "us" if kind == "small" else "GB/s"
            label = f"{size} B" if size < 1024 else f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
            print(f"| {np} | {label} ({unit}) | {statistics.median(host.values()):.3g} | " + " | ".join(cells) + " |")
load = out / "load.txt"
if load.exists():
    print("\nload average (1, 5, 15 min):")
    print(load.read_text().rstrip())
errors = out / "errors.txt"
if errors.exists():
    print("\nerrors:\n" + errors.read_text().rstrip())
EOF
