#!/usr/bin/env bash
# The first thing to try: installs the dependencies, builds the tools and runs
# a 4-rank allreduce sweep from 8 B to 64 MB on this machine (shared memory),
# printing chorus-bench's nccl-tests-style table (every element checked),
# then a data-center prediction from chorus-sim: a Llama-3-405B-like training
# step on 16,384 H100-like GPUs (the best layout found by the search, its
# simulated time and closed-form estimate, MFU, breakdown, bottleneck and the
# binding resource).
#
#   bash scripts/run-main.sh
#
# Build directory: $CHORUS_BUILD_DIR (default build/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build_dir=${CHORUS_BUILD_DIR:-build}

bash scripts/setup.sh
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build_dir" -j "${CHORUS_JOBS:-2}" --target chorus-run chorus-bench chorus-sim

"$build_dir/tools/chorus-run" -n 4 --no-prefix --timeout 600 -- \
  "$build_dir/tools/chorus-bench" allreduce -b 8 -e 64M -f 4 -w 5 -n 20

echo
echo "== chorus-sim: Llama-3 405B (configs/models/llama3-405b.json) on 16,384 H100-like GPUs (configs/clusters/h100-rail.json)"
echo "   global batch 2048 x 8192 tokens; layout search over tp, pp, dp, cp, vpp, micro-batch, ZeRO, recomputation"
sim="$build_dir/tools/chorus-sim"
model=configs/models/llama3-405b.json
cluster=configs/clusters/h100-rail.json
search_json=$("$sim" search --model "$model" --cluster "$cluster" --gpus 16384 --global-batch 2048 --seq 8192 --top 5 \
  --json --no-progress)
out=$(python3 - "$search_json" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
print(f"   {j['candidates']} layouts, {j['feasible']} fit in 80 GiB, the best {j['resimulated']} by the closed-form "
      f"estimate simulated as schedules, searched in {j['search_seconds']:.1f} s; fastest:")
for i, t in enumerate(j["top"], 1):
    l = t["layout"]
    print(f"   {i}. tp {l['tp']} pp {l['pp']} dp {l['dp']} cp {l['cp']} vpp {l['vpp']} micro-batch {l['micro_batch']} "
          f"zero {l['zero']} recompute {l['recompute']}: {t['iteration_time_s']:.2f} s (estimate {t['estimate_s']:.2f} s), "
          f"MFU {100 * t['mfu']:.1f}%, binding {t['binding']}")
l = j["top"][0]["layout"]
print(" ".join(f"--{k} {l[k]}" for k in ("tp", "pp", "dp", "cp", "vpp", "zero", "recompute")) + f" --micro-batch {l['micro_batch']}")
PY
)
echo "${out%$'\n'*}"
best=${out##*$'\n'}
echo
echo "== the best layout, one step ($best):"
# shellcheck disable=SC2086
"$sim" train --model "$model" --cluster "$cluster" --gpus 16384 --global-batch 2048 --seq 8192 $best
