#!/usr/bin/env bash
# The staging term of the simulator (src/sim/device_staging.hpp; issue 41, item 5) against measured collectives
# on OpenCL buffers.  Three steps, the calibration never sees a collective:
#   1. calibrate: bench/micro/device_staging_calib calibrate --procs NP (the per-call chain of a staged call with
#      no collective, in NP processes at once; the copy rate) -> DIR/calib.json;
#   2. measure: chorus-bench allreduce on host buffers and on OpenCL buffers under each staging mode, paired and
#      interleaved (the order rotates every repeat), float32 sum, every row checked;
#   3. predict: each device row = priceStaged(mode, bytes, calibration, host time), the host time being the
#      simulator's own prediction for the host call (chorus-bench's `predict` column: Communicator::predict),
#      at the call's size and, for pipelined chunks, at the chunk's; printed next to the measured median, with
#      the error, and the staging term alone (predicted) next to the measured device - host difference.
#
#   bash bench/device_staging.sh [--build DIR] [--np 2] [--modes map,whole,pipeline] [--repeats 3]
#                                [--sizes 8,1M,4M,16M] [--iters 200] [--out DIR]
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$here/build np=2 modes=map,whole,pipeline repeats=3 sizes=8,1M,4M,16M iters=200 out=
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift ;;
    --np) np=$2; shift ;;
    --modes) modes=$2; shift ;;
    --repeats) repeats=$2; shift ;;
    --sizes) sizes=$2; shift ;;
    --iters) iters=$2; shift ;;
    --out) out=$2; shift ;;
    *) echo "device_staging.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
bench=$build/tools/chorus-bench calib=$build/bench/micro/device_staging_calib
for x in "$bench" "$calib"; do
  [ -x "$x" ] || { echo "device_staging.sh: no $x (ninja -C $build chorus-bench device_staging_calib)" >&2; exit 2; }
done
[ -n "$out" ] || out=$(mktemp -d "${TMPDIR:-/tmp}/device_staging.XXXXXX")
mkdir -p "$out"
echo "calibrate, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/load.txt"
"$calib" calibrate --procs "$np" --reps 2000 >"$out/calib.json" || { echo "calibration failed" >&2; exit 1; }
cat "$out/calib.json"
labels=(host ${modes//,/ })
n=${#labels[@]}
for r in $(seq 1 "$repeats"); do
  echo "repeat $r load before: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/load.txt"
  for i in $(seq 0 $((n - 1))); do
    label=${labels[$(((i + r - 1) % n))]}
    mem=opencl env=(CHORUS_DEVICE_STAGING=$label)
    [ "$label" = host ] && mem=host env=()
    for size in ${sizes//,/ }; do
      env "${env[@]}" timeout 300 "$bench" allreduce --np "$np" -b "$size" -e "$size" -n "$iters" -w 20 -c 1 \
        --memory "$mem" --json "$out/$label.r$r.s$size.jsonl" >>"$out/$label.r$r.txt" 2>&1 ||
        echo "$label r$r $size failed" | tee -a "$out/errors.txt"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/load.txt"
python3 - "$out" "$repeats" "$calib" "${modes}" <<'PY'
import json, pathlib, statistics, subprocess, sys
out, repeats, calib, modes = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4].split(",")
rows = {}  # (label, repeat, bytes, inplace) -> row
for f in out.glob("*.r*.s*.jsonl"):
    label, r = f.name.split(".r")[0], int(f.name.split(".r")[1].split(".")[0])
    for line in f.read_text().splitlines():
        x = json.loads(line)
        rows[label, r, x["bytes"], x["inplace"]] = x
sizes = sorted({k[2] for k in rows})
chunk = 1 << 20
def med(label, b, ip, key="time_us"):
    v = [rows[label, r, b, ip][key] for r in range(1, repeats + 1) if (label, r, b, ip) in rows]
    return statistics.median(v) if v else None
def predict(mode, b, host_us, host_chunk_us):
    res = subprocess.run([calib, "predict", "--calib", str(out / "calib.json"), "--mode", mode, "--in", str(b),
                          "--out", str(b), "--chunk", str(chunk), "--host-us", str(host_us),
                          "--host-chunk-us", str(host_chunk_us)], capture_output=True, text=True, check=True)
    return json.loads(res.stdout)
print("allreduce float32 sum; times in us per call (medians of %d repeats)" % repeats)
print("  dev pred (sim): the staging term on the simulator's host prediction; dev pred (meas): on the measured host")
print("  median (the staging term alone under test); stage: device - host")
print(f"{'mode':9s} {'bytes':>9s} {'place':>5s} {'host pred':>9s} {'host meas':>9s} {'dev pred(sim)':>13s} "
      f"{'err':>5s} {'dev pred(meas)':>14s} {'dev meas':>9s} {'err':>5s} {'stage pred':>10s} {'stage meas':>10s}")
errs, errs_m = [], []
for mode in modes:
    for b in sizes:
        for ip in (False, True):
            hp = med("host", b, ip, "predicted_us")
            hm, dm = med("host", b, ip), med(mode, b, ip)
            hc = med("host", chunk, ip, "predicted_us") or (hp * chunk / b if hp else 0)
            if hp is None or dm is None or hm is None:
                continue
            hcm = med("host", chunk, ip) or (hm * chunk / b)
            p = predict(mode, b, hp, hc)
            pm = predict(mode, b, hm, hcm)
            err = (p["total_us"] - dm) / dm
            err_m = (pm["total_us"] - dm) / dm
            errs.append(err)
            errs_m.append(err_m)
            print(f"{mode:9s} {b:9d} {'in' if ip else 'out':>5s} {hp:9.1f} {hm:9.1f} {p['total_us']:13.1f} "
                  f"{100 * err:4.0f}% {pm['total_us']:14.1f} {dm:9.1f} {100 * err_m:4.0f}% {pm['staging_us']:10.1f} "
                  f"{dm - hm:10.1f}")
ok = sum(1 for e in errs if abs(e) <= 0.15)
ok_m = sum(1 for e in errs_m if abs(e) <= 0.15)
print(f"# within 15 %: {ok} of {len(errs)} on the simulator's host prediction, {ok_m} of {len(errs_m)} on the "
      f"measured host; raw rows and calib.json in {out}")
PY
