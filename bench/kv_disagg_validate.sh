#!/usr/bin/env bash
# chorus-sim's prediction of the prefill/decode demo (issue 37 item 3,
# docs/kv.md "Predicting the demo", docs/validation.md "KV: the
# prefill/decode demo"):
#
#   bench/kv_disagg_validate.sh BUILD_DIR [RUNS]        (default 3 runs)
#
# Each run, one after the other:
#   1. calibrates (never from a run of the demo): `python -m chorus.kv_disagg
#      kernels --corun` (the model's own prefill and decode-token kernels,
#      timed back to back for 2 s each: the sustained means; and each beside
#      the other kernel running in a process of its own, in paired windows)
#      and `calibrate` (an agent's progress call, building a
#      descriptor list, a decode step's bookkeeping, the idle poll's sleep);
#   2. runs the demo between two netns hosts: bench/kv_netns.sh BUILD serve,
#      one repeat (tokens and logits checked against the one-process run);
#   3. times the kernels again (CHORUS_KV_BRACKET=0: not), and writes the
#      host emulation: the kernels' means over both calibrations (the ratio
#      after / before is printed: the machine's drift across the run), the
#      fixed costs, the engine's progress mode ($CHORUS_KV_PROGRESS: thread,
#      the default, or caller; the demo runs with the same), and the link as
#      bench/kv_netns.sh configures it ($CHORUS_KV_RATE, tbf burst 128 KiB,
#      MTU 1500);
#   4. runs `chorus-sim infer --disaggregated` on that emulation with the
#      demo's request stream (its seeded arrival times: an input, not an
#      outcome) and prints measured against predicted TTFT and ITL (median
#      and p90) with the error of each.
# The rows go to $CHORUS_BENCH_OUT (default ./kv_disagg_validate.jsonl).
# Needs root (network namespaces), tc, python3 with torch.
set -euo pipefail

build_dir=${1:?usage: bench/kv_disagg_validate.sh BUILD_DIR [RUNS]}
runs=${2:-3}
build_dir=$(cd "$build_dir" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rate=${CHORUS_KV_RATE:-200mbit}
progress=${CHORUS_KV_PROGRESS:-thread}
case $progress in thread | caller) ;; *) echo "kv_disagg_validate.sh: CHORUS_KV_PROGRESS=$progress (thread or caller)" >&2; exit 2 ;; esac
export CHORUS_KV_PROGRESS=$progress
# The kernels are timed again after the demo, and the emulation uses the mean
# of both calibrations (CHORUS_KV_BRACKET=0: before it only).
bracket=${CHORUS_KV_BRACKET:-1}
# The workers share this host's 2 cores: calibrate each kernel beside the
# other's too (kv_disagg kernels --corun), which the model uses where a
# prefill and decode steps overlap; CHORUS_KV_CORUN=0 leaves that out.
corun_flag=--corun
[[ ${CHORUS_KV_CORUN:-1} == 0 ]] && corun_flag=
# The workload, given to the demo and to chorus-sim alike (flags both take: --requests --rate --input --output).
serve_args=${CHORUS_KV_SERVE_ARGS:---requests 24 --rate 1 --input 128 --output 32}
out=${CHORUS_BENCH_OUT:-$PWD/kv_disagg_validate.jsonl}
sim=$build_dir/tools/chorus-sim
[[ -x $sim ]] || { echo "kv_disagg_validate.sh: $sim not built (ninja -C $build_dir chorus-sim)" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-kvval.XXXXXX")
trap 'rm -rf "$work"' EXIT
export PYTHONPATH="$build_dir/python" OMP_NUM_THREADS=1
: >"$out"

for run in $(seq 1 "$runs"); do
  echo "# run $run: calibrating at $(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg), engine progress: $progress"
  # shellcheck disable=SC2086
  /usr/bin/python3 -m chorus.kv_disagg kernels $serve_args $corun_flag --out "$work/kernels.before.json"
  # shellcheck disable=SC2086
  /usr/bin/python3 -m chorus.kv_disagg calibrate $serve_args --out "$work/calibrate.json"
  echo "# run $run: the demo at $(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  CHORUS_BENCH_REPEATS=1 CHORUS_BENCH_OUT="$work/serve.jsonl" "$here/kv_netns.sh" "$build_dir" serve
  rm -f "$work/kernels.after.json" "$work/drift.json"
  if [[ $bracket == 1 ]]; then
    echo "# run $run: calibrating again at $(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)"
    # shellcheck disable=SC2086
    /usr/bin/python3 -m chorus.kv_disagg kernels $serve_args $corun_flag --out "$work/kernels.after.json"
  fi
  # shellcheck disable=SC2086
  /usr/bin/python3 - "$rate" "$work" "$progress" $serve_args <<'EOF'
import json, re, sys
from chorus import kv_disagg as kd
rate, work, progress, argv = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
a = kd._args(["single"] + argv)
c = kd.Config(a)
# The kernels timed before the demo and, bracketing it, after (CHORUS_KV_BRACKET=1, the default): each
# time the mean of the two, as a calibration taken on both sides of a measurement is interpolated to it.
# This VM's speed drifts by phases; the two calibrations' ratio is printed and kept with the row.
before = json.load(open(f"{work}/kernels.before.json"))
try:
    after = json.load(open(f"{work}/kernels.after.json"))
except OSError:
    after = None
def avg(a, b):
    if b is None:
        return a
    if isinstance(a, dict):
        return {key: avg(a[key], b[key]) for key in a if key in b}
    return (a + b) / 2 if isinstance(a, (int, float)) else a
k = avg(before, after)
if after is not None:
    drift = {"prefill": after["prefill_mean_s"] / before["prefill_mean_s"]}
    drift.update({f"decode@{p}": after["decode_mean_s"][p] / s for p, s in before["decode_mean_s"].items()})
    json.dump(drift, open(f"{work}/drift.json", "w"))
    print("# calibration after / before the demo: " + ", ".join(f"{name} x{x:.3f}" for name, x in drift.items()))
cal = json.load(open(f"{work}/calibrate.json"))
if "progress_s" not in cal:
    sys.exit(f"calibrate: no agent progress cost: {cal.get('progress_error')}")
m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate)
bps = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
emu = {
    "name": f"kv_disagg netns, {rate} tbf",
    "calibration": "python -m chorus.kv_disagg kernels / calibrate (bench/kv_disagg_validate.sh); link as "
                   "bench/kv_netns.sh sets it (tbf rate, burst 128kb, veth MTU 1500)",
    "host": {
        # The sustained means: the demo's workers compute without pause on a shared CPU (docs/validation.md).
        "prefill_s": [[c.input, k["prefill_mean_s"]]],
        "decode_token_s": [[int(p), s] for p, s in sorted(k["decode_mean_s"].items(), key=lambda x: int(x[0]))],
        "progress_s": cal["progress_s"], "post_s": cal["post_s"], "decode_request_s": cal["decode_request_s"],
        "poll_s": cal["poll_s"], "block_tokens": c.block_tokens, "kv_elem_bytes": 4, "progress": progress,
    },
    "link": {"rate_bit_s": bps, "burst_bytes": 128 * 1024, "mtu": 1500, "latency_s": 5e-5},
}
if "prefill_corun_mean_s" in k:  # each kernel beside the other's (kernels --corun)
    emu["host"]["prefill_corun_s"] = [[c.input, k["prefill_corun_mean_s"]]]
    emu["host"]["decode_token_corun_s"] = [[int(p), s] for p, s in
                                           sorted(k["decode_corun_mean_s"].items(), key=lambda x: int(x[0]))]
    print(f"# co-run (each kernel beside the other's): prefill x{k['prefill_corun_mean_s'] / k['prefill_mean_s']:.3f}, "
          "decode token " + ", ".join(f"x{s / k['decode_mean_s'][p]:.3f} at {p}" for p, s in k["decode_corun_mean_s"].items()))
json.dump(emu, open(f"{work}/cluster.json", "w"), indent=2)
json.dump(kd.workload(c)[0], open(f"{work}/arrivals.json", "w"))
print(f"# calibrated (sustained means; medians in brackets): prefill {1e3 * k['prefill_mean_s']:.2f} "
      f"[{1e3 * k['prefill_s']:.2f}] ms, decode token "
      + ", ".join(f"{1e3 * s:.3f} [{1e3 * k['decode_s'][p]:.3f}] ms at {p}" for p, s in k["decode_mean_s"].items())
      + f"; progress {1e6 * cal['progress_s']:.2f} us, poll {1e3 * cal['poll_s']:.3f} ms")
EOF
  cp "$work/cluster.json" "$work/cluster.$run.json"
  # shellcheck disable=SC2086
  "$sim" infer --disaggregated --model "$here/kv_disagg_model.json" --cluster "$work/cluster.json" --gpus 2 \
    $serve_args --arrivals "$work/arrivals.json" --json >"$work/sim.json"
  /usr/bin/python3 - "$run" "$out" "$work" "$rate" <<'EOF'
import json, sys
run, out, work, rate = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
meas = [json.loads(l) for l in open(f"{work}/serve.jsonl") if json.loads(l).get("op") == "kv_disagg"][-1]
sim = json.load(open(f"{work}/sim.json"))
load = open("/proc/loadavg").read().split()[:3]
row = {"run": run, "link": rate, "progress": json.load(open(f"{work}/cluster.{run}.json"))["host"].get("progress", "thread"), "load": load, "mismatched": meas["mismatched"], "errors": {}}
print(f"# run {run}: measured vs predicted (load average {' '.join(load)})")
for key, skey in (("ttft_ms", "ttft_s"), ("itl_ms", "itl_s")):
    for q in ("median", "p90"):
        m, p = meas["metrics"][key][q], 1e3 * sim[skey][q]
        err = (p - m) / m
        row["errors"][f"{key}.{q}"] = err
        row[f"{key}.{q}"] = {"measured": m, "predicted": p}
        print(f"  {key:7} {q:6} measured {m:9.2f} ms  predicted {p:9.2f} ms  error {100 * err:+6.1f} %")
# The TTFT's parts (bench/kv_netns.sh serve's timeline, medians over the requests) beside the model's
# terms for an unloaded request: the prefill, and prefill end -> first token = post + the KV's wire time
# past the burst + 3 latencies + half the decode worker's idle poll.
import statistics
host = json.load(open(f"{work}/cluster.{run}.json"))["host"]
link = json.load(open(f"{work}/cluster.{run}.json"))["link"]
tl = meas.get("timeline", [])
if tl:
    parts = {"prefill": (statistics.median(1e3 * (t["prefill_done"] - t["start"]) for t in tl), 1e3 * sim["prefill_s"]),
             "prefill->first token": (statistics.median(1e3 * (t["first_token"] - t["prefill_done"]) for t in tl),
                                      1e3 * (host["post_s"] + sim["kv_wire_s"] + 3 * link["latency_s"] + host["poll_s"] / 2))}
    row["ttft_parts_ms"] = {k: {"measured": m, "model": p} for k, (m, p) in parts.items()}
    for k, (m, p) in parts.items():
        print(f"  ttft part {k:21} measured {m:8.2f} ms  model {p:8.2f} ms")
row["sim"] = sim
try:
    row["calibration_drift"] = json.load(open(f"{work}/drift.json"))
except OSError:
    pass
row["cluster"] = json.load(open(f"{work}/cluster.{run}.json"))
with open(out, "a") as o:
    o.write(json.dumps(row) + "\n")
EOF
done
