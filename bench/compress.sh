#!/usr/bin/env bash
# Compressed allreduce on a rate-limited emulated cluster (issue 19): effective
# allreduce bandwidth (chorus-bench's algbw) uncompressed, bf16 and fp8 side by
# side, with every host's link shaped to 1 Gbit/s (tc tbf on its egress).
#
#   bench/compress.sh BUILD_DIR [LAYOUT...]     LAYOUT: HOSTSxRANKS (default: 4x1 2x2)
#
# Each host is a network namespace with its own /dev/shm (tests/cluster/
# netns_lib.sh), joined by a bridge; ranks of one host use shared memory.  The
# compression is the communicator default (CHORUS_COMPRESS=off|bf16|fp8), so
# chorus-bench runs its plain float32 allreduces compressed; -c 0 because the
# compressed results are within the error bound, not exact (compress_test
# checks them).  Prints one table per layout and writes the rows to
# $CHORUS_BENCH_OUT (default: bench_compress.jsonl in the current directory).
# The tuner is told the link rate the way an operator would after chorus-tune
# on such a cluster: a profile whose only figure is the TCP bandwidth, the
# shaped 1 Gbit/s (0.125 GB/s; the other figures stay built-in).  With the
# built-in 1.5 GB/s it would price the links twelve times too fast and, on
# 2 x 2, take the direct fp8 plan, which sends twice the bytes through each
# host's link (2.1x instead of 4.3x there).
# Needs root, ip, tc, nsenter, unshare.  Sizes: $CHORUS_BENCH_SIZES (chorus-bench
# -b/-e, default 4M:64M), iterations $CHORUS_BENCH_ITERS (default 5).
set -euo pipefail

build_dir=${1:?usage: bench/compress.sh BUILD_DIR [HOSTSxRANKS...]}
build_dir=$(cd "$build_dir" && pwd)
shift
layouts=("$@")
[[ ${#layouts[@]} -gt 0 ]] || layouts=(4x1 2x2)
bench=$build_dir/tools/chorus-bench
sizes=${CHORUS_BENCH_SIZES:-4M:64M}
iters=${CHORUS_BENCH_ITERS:-5}
out=${CHORUS_BENCH_OUT:-$PWD/bench_compress.jsonl}
job_timeout=300

test_name=bench/compress.sh
# shellcheck source=../tests/cluster/netns_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/cluster/netns_lib.sh"
cluster_require ip tc unshare nsenter timeout python3 -- "$bench"
netns_remove_stale

tag=chorus-$$
switch_ns=$tag-sw
subnet=10.232.$((RANDOM % 250 + 1))
work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-compress.XXXXXX")
keepers=()
ranks=()
profile=$work/profile.json
echo '{"tcp": {"bandwidth_gbps": 0.125}}' >"$profile"
created_ns=()
trap netns_cleanup EXIT
trap 'exit 130' INT TERM

max_hosts=0
for l in "${layouts[@]}"; do max_hosts=$((${l%x*} > max_hosts ? ${l%x*} : max_hosts)); done
hosts=()
for i in $(seq 0 $((max_hosts - 1))); do hosts+=("$tag-h$i"); done
netns_make_hosts "$switch_ns" "$subnet" "${hosts[@]}"
# 1 Gbit/s out of every host (a token bucket: 1 Mbit/s of burst, 50 ms of queue).
for ns in "${hosts[@]}"; do
  ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate 1gbit burst 128kb latency 50ms
done
netns_start_keepers 1g $((job_timeout * 8)) "${hosts[@]}"

# run_bench LAYOUT MODE: chorus-bench allreduce on HOSTS x PER ranks with
# CHORUS_COMPRESS=MODE; rank 0's --json rows go to $work/LAYOUT.MODE.jsonl.
run_bench() {
  local layout=$1 mode=$2 nhosts=${1%x*} per=${1#*x}
  local world=$((nhosts * per)) secret r host port=$((29600 + RANDOM % 300))
  secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
  ranks=()
  for r in $(seq 0 $((world - 1))); do
    host=$((r / per))
    nsenter --target "${keepers[$host]}" --mount --net -- \
      env CHORUS_RANK=$r CHORUS_WORLD_SIZE=$world CHORUS_LOCAL_RANK=$((r % per)) \
      CHORUS_MASTER_ADDR="$subnet.1" CHORUS_MASTER_PORT="$port" CHORUS_SECRET="$secret" \
      CHORUS_COMPRESS="$mode" CHORUS_TUNE_FILE="$profile" \
      timeout -k 5 "$job_timeout" "$bench" allreduce -b "${sizes%:*}" -e "${sizes#*:}" -f 2 \
      -n "$iters" -w 2 -c 0 --json "$work/$layout.$mode.$r.jsonl" \
      >"$work/$layout.$mode.$r.out" 2>"$work/$layout.$mode.$r.err" </dev/null &
    ranks+=($!)
  done
  local failed=0
  for r in $(seq 0 $((world - 1))); do
    if ! wait "${ranks[$r]}"; then
      failed=1
      echo "$test_name: $layout $mode: rank $r failed" >&2
      tail -5 "$work/$layout.$mode.$r.err" >&2
    fi
  done
  ranks=()
  return $failed
}

: >"$out"
for layout in "${layouts[@]}"; do
  for mode in off bf16 fp8; do
    run_bench "$layout" "$mode"
    python3 - "$work/$layout.$mode.0.jsonl" "$layout" "$mode" >>"$out" <<'EOF'
import json, sys
path, layout, mode = sys.argv[1:4]
for line in open(path):
    if line.startswith("{"):
        row = json.loads(line)
        row.update(layout=layout, compress=mode)
        print(json.dumps(row))
EOF
  done
done

python3 - "$out" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def key(r):
    return r["bytes"]
rows = [r for r in rows if not r.get("inplace")]  # out of place (in place moves the same bytes)
for layout in dict.fromkeys(r["layout"] for r in rows):
    print(f"\nallreduce, {layout} (hosts x ranks), 1 Gbit/s per host: algbw GB/s (speed-up over uncompressed)")
    print(f"{'bytes':>12} {'off':>8} {'bf16':>14} {'fp8':>14}")
    by = {(r["compress"], key(r)): r for r in rows if r["layout"] == layout}
    for size in sorted({key(r) for r in rows if r["layout"] == layout}):
        base = by.get(("off", size), {}).get("algbw_gbps")
        cells = []
        for mode in ("bf16", "fp8"):
            bw = by.get((mode, size), {}).get("algbw_gbps")
            cells.append(f"{bw:8.3f} ({bw / base:.2f}x)" if bw and base else f"{'-':>14}")
        print(f"{size:>12} {base if base else 0:8.3f} {cells[0]:>14} {cells[1]:>14}")
EOF
