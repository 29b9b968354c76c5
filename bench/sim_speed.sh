#!/usr/bin/env bash
# Simulator speed figures (DESIGN: measured and reported, never asserted).
set -euo pipefail
SIM=${SIM:-build/tools/chorus-sim}
t() { local s e; s=$(date +%s.%N); "$@" > /dev/null; e=$(date +%s.%N); python3 -c "print(f'{$e-$s:.3f} s')"; }
echo "analytical allreduce 1 GiB, 131072 GPUs (auto):  $(t $SIM collective --cluster configs/clusters/h100-rail.json --gpus 131072 --bytes 1G)"
echo "analytical allreduce 1 GiB, 131072 GPUs (ring):  $(t $SIM collective --cluster configs/clusters/h100-rail.json --gpus 131072 --bytes 1G --algo ring)"
echo "Llama-3 405B step, 16384 GPUs (analytical):      $(t $SIM train --model configs/models/llama3-405b.json \
  --cluster configs/clusters/h100-rail.json --gpus 16384 --tp 8 --pp 16 --dp 128 --global-batch 2048 --micro-batch 1 \
  --seq 8192 --recompute full --zero 1)"
