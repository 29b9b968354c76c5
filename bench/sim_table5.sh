#!/usr/bin/env bash
# Korthikanti et al. 2022, Table 5: predicted vs measured iteration time
# (A100 80GB, 8 per node, seq 2048, vocab 51200, DP = 1).  Full recomputation
# rows run without sequence parallelism, the selective rows with it; Megatron
# of 2022 materialised attention scores (no FlashAttention).
set -euo pipefail
SIM=${SIM:-build/tools/chorus-sim}
C=${CLUSTER:-configs/clusters/a100-superpod.json}
row() {  # model gpus tp pp vpp batch measured_full measured_sel
  local f s
  f=$($SIM train --model configs/models/$1.json --cluster $C --gpus $2 --tp $3 --pp $4 --vpp $5 --dp 1 \
      --global-batch $6 --micro-batch $([ "$1" = megatron-22b ] && echo 4 || echo 1) --seq 2048 --recompute full \
      --no-sequence-parallel --no-flash-attention --zero 0 --json | python3 -c 'import json,sys;print(json.load(sys.stdin)["iteration_time_s"])')
  s=$($SIM train --model configs/models/$1.json --cluster $C --gpus $2 --tp $3 --pp $4 --vpp $5 --dp 1 \
      --global-batch $6 --micro-batch $([ "$1" = megatron-22b ] && echo 4 || echo 1) --seq 2048 --recompute selective \
      --no-flash-attention --zero 0 --json | python3 -c 'import json,sys;print(json.load(sys.stdin)["iteration_time_s"])')
  python3 -c "f,s,mf,ms=$f,$s,$7,$8;print(f'| $1 | {mf} | {f:.2f} | {100*(f-mf)/mf:+.1f}% | {ms} | {s:.2f} | {100*(s-ms)/ms:+.1f}% |')"
}
echo "| model | full: measured | predicted | error | sp+selective: measured | predicted | error |"
echo "|---|---|---|---|---|---|---|"
row megatron-22b 8 8 1 1 4 1.42 1.10
row gpt3-175b 64 8 8 3 64 18.13 13.75
row megatron-530b 280 8 35 3 280 49.05 37.83
row megatron-1t 512 8 64 1 512 94.42 71.49
