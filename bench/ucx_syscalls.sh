#!/usr/bin/env bash
#   bench/ucx_syscalls.sh BUILD_DIR   (N=50000 calls)
# Syscalls per 8 B allreduce between two netns hosts (rank 0, perf stat counting raw_syscalls:sys_enter),
# chorus-ucx, chorus-tcp, and ucx_perftest tag_lat (client) for comparison.
set -uo pipefail
build_dir=$(cd "$1" && pwd)
bench=$build_dir/tools/chorus-bench
n=${N:-50000}
test_name=ucx_sys
source "$(dirname "${BASH_SOURCE[0]}")/../tests/cluster/netns_lib.sh"
netns_bench_cluster ucxs 10.237 2 600
export UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n
run() {
  local transport=$1 port=$((29700 + RANDOM % 300)) secret
  secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
  for r in 0 1; do
    local pre=()
    [[ $r == 0 ]] && pre=(perf stat -x, -e raw_syscalls:sys_enter,context-switches -o "$work/stat.$transport")
    on_host $r "${pre[@]}" env CHORUS_RANK=$r CHORUS_WORLD_SIZE=2 CHORUS_LOCAL_RANK=0 CHORUS_MASTER_ADDR="$subnet.1" \
      CHORUS_MASTER_PORT="$port" CHORUS_SECRET="$secret" CHORUS_TRANSPORT="$transport" \
      timeout -k 5 120 "$bench" allreduce -b 8 -e 8 -d float -o sum -c 0 -n "$n" -w 500 >"$work/$transport.$r.out" 2>&1 </dev/null &
    ranks+=($!)
  done
  wait "${ranks[@]}"
  ranks=()
  echo "$transport: $(grep -E '^ +8 ' "$work/$transport.0.out" | awk '{print $6 " us"}') ; per call: $(awk -F, -v n=$n '/sys_enter/{printf "%.1f syscalls", $1/n} /context-switches/{printf ", %.2f context switches", $1/n}' "$work/stat.$transport")"
}
run ucx
run tcp
run ucx
run tcp
port=$((13300 + RANDOM % 300))
on_host 1 timeout -k 5 60 ucx_perftest -p "$port" >/dev/null 2>&1 </dev/null &
s=$!; ranks=("$s"); sleep 1
on_host 0 perf stat -x, -e raw_syscalls:sys_enter,context-switches -o "$work/stat.pt" timeout -k 5 60 ucx_perftest "$subnet.2" -p "$port" -t tag_lat -s 8 -n "$n" -w 1000 > "$work/pt.out" 2>&1
wait "$s"; ranks=()
echo "ucx_perftest: $(grep Final "$work/pt.out" | awk '{print $3 " us typical, " $4 " us avg"}'); per iteration (a round trip): $(awk -F, -v n=$n '/sys_enter/{printf "%.1f syscalls", $1/n} /context-switches/{printf ", %.2f context switches", $1/n}' "$work/stat.pt")"
