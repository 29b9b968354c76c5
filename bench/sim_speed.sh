#!/usr/bin/env bash
# Simulator speed figures (DESIGN: measured and reported, never asserted).
# Each figure is wall time and CPU time of one single-threaded chorus-sim run.
set -euo pipefail
SIM=${SIM:-build/tools/chorus-sim}
H100=configs/clusters/h100-rail.json
L405=configs/models/llama3-405b.json
t() {
  local s e u
  s=$(date +%s.%N)
  u=$( { /usr/bin/time -f '%U %S' "$@" > /dev/null; } 2>&1 | tail -1)
  e=$(date +%s.%N)
  python3 -c "u,s2='$u'.split(); print(f'{$e-$s:.3f} s wall, {float(u)+float(s2):.2f} s cpu')"
}
STEP="train --model $L405 --cluster $H100 --gpus 16384 --tp 8 --pp 16 --dp 128 --global-batch 2048 --micro-batch 1 --seq 8192 --recompute full --zero 1"
echo "analytical allreduce 1 GiB, 131072 GPUs (auto):  $(t $SIM collective --library chorus --cluster $H100 --gpus 131072 --bytes 1G)"
echo "analytical allreduce 1 GiB, 131072 GPUs (ring):  $(t $SIM collective --library chorus --cluster $H100 --gpus 131072 --bytes 1G --algo ring)"
echo "flow-level allreduce 1 GiB, 16384 GPUs (ring):   $(t $SIM collective --library chorus --cluster $H100 --gpus 16384 --bytes 1G --algo ring --network flow)"
echo "Llama-3 405B step, 16384 GPUs (analytical):      $(t $SIM $STEP)"
echo "Llama-3 405B step, 16384 GPUs (flow-level):      $(t $SIM $STEP --network flow)"
echo "layout search, Llama-3 405B, 16384 GPUs:         $(t $SIM search --model $L405 --cluster $H100 --gpus 16384 --global-batch 2048 --seq 8192 --no-progress)"
