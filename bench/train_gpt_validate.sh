#!/usr/bin/env bash
# chorus-sim train against the real CPU training job (issue 35 item 3; docs/validation.md, "CPU training runs").
#
#   bash bench/train_gpt_validate.sh [BUILD_DIR] [OUT_DIR]
#   PREDICT_ONLY=1 bash bench/train_gpt_validate.sh BUILD_DIR OUT_DIR   # chorus-sim again on OUT_DIR's runs and
#                                                                       # calibration (after a model change)
#   python3 bench/train_gpt_summary.py OUT_DIR...                       # repeats side by side
#   python3 bench/train_gpt_repredict.py SIM                            # chorus-sim again on the committed
#                                                                       # 2026-12-07b rows (their cluster files)
#
# 1. `chorus-sim calibrate` measures this machine (kernels at the job's shapes, chorus-bench over shm): the
#    cluster file.  2. The job prints its own model file.  3. Each layout below (fixed before any run) trains
#    STEPS steps under chorus-run and reports the median step time after the warm-up; chorus-sim train predicts
#    the same layout from the two files.  4. A table: measured, predicted, error, and whether the simulator
#    ranks the layouts as measured.  Every layout processes the same global batch (GLOBAL sequences), so the
#    ranking compares the same work.  The load average is printed before and after: the machine's 2 cores are
#    shared, and every rank uses one torch thread (the calibration too).
set -euo pipefail

build=${1:-build}
out=${2:-$(mktemp -d /tmp/train_gpt_validate.XXXXXX)}
mkdir -p "$out"
sim=$build/tools/chorus-sim
run=$build/tools/chorus-run
py=/usr/bin/python3
export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH}
export OMP_NUM_THREADS=1

LAYERS=${LAYERS:-4} HIDDEN=${HIDDEN:-128} HEADS=${HEADS:-8} VOCAB=${VOCAB:-1024} SEQ=${SEQ:-64}
MB=${MB:-2} GLOBAL=${GLOBAL:-16} STEPS=${STEPS:-4} WARMUP=${WARMUP:-1}
job=(--layers "$LAYERS" --hidden "$HIDDEN" --heads "$HEADS" --vocab "$VOCAB" --seq "$SEQ" --micro-batch "$MB")
# The job as chorus-sim's flags say it: chorus's collectives, plain tp (allreduces, no sequence parallelism, no
# asynchronous tp backward), the s x s scores materialised, no recomputation, the dp allreduce after the backward,
# SGD; the model file says fp32, the cluster file the host's cores and the framework's host time per layer.
# The layouts, tp:pp:dp, chosen before the runs (docs/validation.md lists them).
layouts=(${LAYOUTS:-2:1:1 1:2:1 1:1:2 4:1:1 2:2:1 2:1:2 1:2:2 1:4:1 2:2:2 1:2:4})

predict_only=${PREDICT_ONLY:-0}
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$predict_only" = 0 ]; then
  "$sim" calibrate --out "$out/cluster.json" "${job[@]:2}" --tp 1,2,4 --ranks-per-host 8 --threads 1 |
    tee "$out/calibrate.log"
fi
"$py" -m chorus.examples.train_gpt --print-model-json "${job[@]}" >"$out/model.json"

: >"$out/rows.jsonl"
for l in "${layouts[@]}"; do
  IFS=: read -r tp pp dp <<<"$l"
  n=$((tp * pp * dp))
  m=$((GLOBAL / MB / dp))
  if [ "$predict_only" = 0 ]; then
    "$run" -n "$n" --timeout 900 --no-prefix -- "$py" -m chorus.examples.train_gpt --tp "$tp" --pp "$pp" --dp "$dp" \
      "${job[@]}" --micro-batches "$m" --steps "$STEPS" --warmup "$WARMUP" >"$out/run_$tp.$pp.$dp.log" 2>&1 ||
      { echo "layout tp$tp pp$pp dp$dp failed: $out/run_$tp.$pp.$dp.log" >&2; exit 1; }
  fi
  "$sim" train --model "$out/model.json" --cluster "$out/cluster.json" --gpus "$n" --tp "$tp" --pp "$pp" --dp "$dp" \
    --global-batch "$GLOBAL" --micro-batch "$MB" --seq "$SEQ" --zero 0 --optimizer sgd --library chorus --no-sequence-parallel \
    --no-flash-attention --recompute none --no-async-tp --no-overlap-dp --json >"$out/sim_$tp.$pp.$dp.json"
  "$py" - "$out" "$tp" "$pp" "$dp" <<'EOF' >>"$out/rows.jsonl"
import json, sys
out, tp, pp, dp = sys.argv[1], *sys.argv[2:]
tag = "{}.{}.{}".format(tp, pp, dp)
line = [l for l in open("{}/run_{}.log".format(out, tag)) if l.startswith("TRAIN_GPT ")][-1]
meas = json.loads(line.split(" ", 1)[1])
pred = json.load(open("{}/sim_{}.json".format(out, tag)))
print(json.dumps({"layout": "tp{} pp{} dp{}".format(tp, pp, dp), "ranks": meas["world"],
                  "measured_s": meas["step_s"], "compute_s": meas["compute_s"], "comm_s": meas["comm_s"],
                  "predicted_s": pred["iteration_time_s"]}))
EOF
  tail -n 1 "$out/rows.jsonl"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

"$py" - "$out/rows.jsonl" <<'EOF'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| layout | ranks | measured step (s) | compute / comm (s) | chorus-sim (s) | error |")
print("|---|---:|---:|---:|---:|---:|")
errs = []
for r in rows:
    e = r["predicted_s"] / r["measured_s"] - 1
    errs.append(abs(e))
    print("| {} | {} | {:.3f} | {:.3f} / {:.3f} | {:.3f} | {:+.1f} % |".format(
        r["layout"], r["ranks"], r["measured_s"], r["compute_s"], r["comm_s"], r["predicted_s"], 100 * e))
within = sum(e <= 0.10 for e in errs)
print("\nwithin 10 %: {} of {}; mean |error| {:.1f} %, worst {:.1f} %".format(
    within, len(rows), 100 * sum(errs) / len(errs), 100 * max(errs)))
meas = [r["layout"] for r in sorted(rows, key=lambda r: r["measured_s"])]
pred = [r["layout"] for r in sorted(rows, key=lambda r: r["predicted_s"])]
print("measured ranking:  " + ", ".join(meas))
print("simulated ranking: " + ", ".join(pred))
print("rankings equal: {}".format(meas == pred))
EOF
echo "files: $out"
