#!/usr/bin/env bash
# before/after predictions for the model presets: one fixed layout each on configs/clusters/h100-rail.json
sim=${1:?chorus-sim}; root=${2:-.}
c=$root/configs/clusters/h100-rail.json
run() { local name=$1; shift; out=$($sim train --cluster $c "$@" --json 2>&1) && python3 -c "import json,sys; j=json.loads(sys.argv[1]); print(f\"$name|{j['iteration_time_s']:.3f}|{j['memory_gib_per_gpu']:.1f}|{j['binding']}\")" "$out" || echo "$name|error: ${out:0:90}"; }
M=$root/configs/models
run "llama3-8b 8 GPUs dp 8 seq 4096" --model $M/llama3-8b.json --gpus 8 --dp 8 --global-batch 64 --seq 4096
run "llama3-70b 64 GPUs tp8 pp4 vpp2 dp2" --model $M/llama3-70b.json --gpus 64 --tp 8 --pp 4 --vpp 2 --dp 2 --global-batch 128 --seq 8192
run "llama3-405b 16384 GPUs tp8 pp16 dp128 (7+7 end layers)" --model $M/llama3-405b.json --gpus 16384 --tp 8 --pp 16 --dp 128 --global-batch 2048 --seq 8192 --first-stage-layers 7 --last-stage-layers 7
run "gpt3-175b 1024 GPUs tp8 pp8 dp16" --model $M/gpt3-175b.json --gpus 1024 --tp 8 --pp 8 --dp 16 --global-batch 1536 --seq 2048
run "megatron-530b 2240 GPUs tp8 pp35 dp8" --model $M/megatron-530b.json --gpus 2240 --tp 8 --pp 35 --dp 8 --global-batch 1120 --seq 2048
run "mixtral-8x7b 64 GPUs tp2 pp4 ep8 dp8" --model $M/mixtral-8x7b.json --gpus 64 --tp 2 --pp 4 --dp 8 --ep 8 --global-batch 256 --seq 4096
run "deepseek-v3 1024 GPUs tp2 pp8 vpp4 ep64 dp64 fp8" --model $M/deepseek-v3.json --gpus 1024 --tp 2 --pp 8 --vpp 4 --dp 64 --ep 64 --global-batch 8192 --seq 4096 --fp8
run "Qwen3-235B-A22B 256 GPUs tp2 pp8 vpp4 dp16 ep32 etp1" --model $M/Qwen3-235B-A22B --gpus 256 --tp 2 --pp 8 --vpp 4 --dp 16 --ep 32 --etp 1 --global-batch 2048 --seq 4096
run "Qwen3-30B-A3B 16 GPUs pp2 vpp24 dp8 ep8 mb2" --model $M/Qwen3-30B-A3B --gpus 16 --pp 2 --vpp 24 --dp 8 --ep 8 --global-batch 512 --micro-batch 2 --seq 4096
run "gpt-oss-120b 64 GPUs pp4 dp16 ep8" --model $M/gpt-oss-120b --gpus 64 --pp 4 --dp 16 --ep 8 --global-batch 512 --seq 4096
