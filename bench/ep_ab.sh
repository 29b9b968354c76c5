#!/usr/bin/env bash
# Two builds' MoE dispatch or combine side by side, interleaved, on one
# machine: 8 ranks as 4 emulated hosts x 2 (CHORUS_HOST_ID: shared memory
# inside a host, loopback TCP between hosts), node-limited to 2 hosts, bf16,
# top-8 of 64 experts.  For a code change's effect on the CPU-bound parts
# (packing, the relay, combine's sums); bench/ep_netns.sh is the networked case.
#
#   bench/ep_ab.sh BUILD_A BUILD_B [OP=combine] [TOKENS=2048] [REPEATS=3]
#
# Prints each repeat's rank-0 time (us) of A and B (A first, then B, each
# repeat) and the ratios A/B with their median.  Needs about 8 x 0.4 GB per 1,024 tokens.
set -euo pipefail
a=${1:?usage: bench/ep_ab.sh BUILD_A BUILD_B [OP] [TOKENS] [REPEATS]}
b=${2:?usage: bench/ep_ab.sh BUILD_A BUILD_B [OP] [TOKENS] [REPEATS]}
op=${3:-combine}
tokens=${4:-2048}
repeats=${5:-3}
work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-ep-ab.XXXXXX")
trap 'rm -rf "$work"' EXIT

# one BUILD: prints rank 0's time in us.
one() {
  local bench=$1/tools/chorus-bench port=$((29000 + RANDOM % 900)) secret pids=() r
  secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
  for r in 0 1 2 3 4 5 6 7; do
    env CHORUS_RANK=$r CHORUS_WORLD_SIZE=8 CHORUS_LOCAL_RANK=$((r % 2)) CHORUS_HOST_ID=$((r / 2)) \
      CHORUS_MASTER_ADDR=127.0.0.1 CHORUS_MASTER_PORT=$port CHORUS_SECRET="$secret" CHORUS_TIMEOUT_MS=600000 \
      timeout -k 5 900 "$bench" "$op" --tokens "$tokens" --hidden 7168 --experts 64 --topk 8 --max-hosts 2 \
      -d bf16 --form ep --repeats 1 -n 2 -w 1 >"$work/$r.out" 2>&1 </dev/null &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || { echo "bench/ep_ab.sh: a rank of $1 failed:" >&2; cat "$work"/*.out >&2; exit 1; }; done
  awk '$4 == "ep" { print $6 }' "$work/0.out"
}

ratios=()
for i in $(seq 1 "$repeats"); do
  ta=$(one "$a")
  tb=$(one "$b")
  ratios+=("$(awk -v x="$ta" -v y="$tb" 'BEGIN { printf "%.2f", x / y }')")
  echo "repeat $i: A ${ta} us  B ${tb} us  A/B ${ratios[-1]}  (load $(cut -d' ' -f1 /proc/loadavg))"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END { printf "A/B median %s over %d repeats\n", v[int((NR + 1) / 2)], NR }'
