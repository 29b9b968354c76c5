#!/usr/bin/env bash
# The trace report on an emulated cluster: 3 hosts (network namespaces on one
# bridge, private /dev/shm each) x 2 ranks, where
#   - host 1's link is rate-limited (tc tbf on its eth0: what it sends), and
#   - rank 5 (on host 2) arrives late at every allreduce (it "computes" longer),
#   - host 2's ranks run with a trace clock shifted by +250 ms
#     (CHORUS_CLOCK_OFFSET_NS), as if that host's clock were off.
# Each iteration is an allreduce and an alltoall (so every host sends to every
# other host, and a slow sender can be told from a slow receiver).
# The job runs under CHORUS_TRACE; `chorus-trace report --json` must name
# rank 5 as the straggler and host 1 (ranks 2,3), outbound, as the slow link,
# and every rank's clock estimate must be within its error bound of the truth.
#
#   trace_cluster_test.sh BUILD_DIR
#
# Needs root, `ip netns` and `tc`; FAILS without them unless
# CHORUS_SKIP_CLUSTER=1 (then exits 77: skipped).  Cleans up on exit.
set -euo pipefail

build_dir=${1:?usage: trace_cluster_test.sh BUILD_DIR}
build_dir=$(cd "$build_dir" && pwd)
job=$build_dir/tests/integration/trace_job_main
tool=$build_dir/tools/chorus-trace
job_timeout=${CHORUS_CLUSTER_TIMEOUT:-120}
rate=${CHORUS_TRACE_TEST_RATE:-200mbit}
clock_offset_ns=250000000

test_name=trace_cluster_test
# shellcheck source=netns_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns_lib.sh"
cluster_require ip tc unshare nsenter timeout python3 -- "$job" "$tool"

tag=chorus-$$
hosts=("$tag-h0" "$tag-h1" "$tag-h2")
switch_ns=$tag-sw
subnet=10.232.$((RANDOM % 250 + 1))
work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-trace-cluster.XXXXXX")
keepers=()
ranks=()
created_ns=()
trap netns_cleanup EXIT
trap 'exit 130' INT TERM

netns_make_hosts "$switch_ns" "$subnet" "${hosts[@]}"
netns_start_keepers 256m $((job_timeout + 60)) "${hosts[@]}"
# Host 1's link: what it sends leaves through a token bucket.
ip netns exec "${hosts[1]}" tc qdisc add dev eth0 root tbf rate "$rate" burst 64kb latency 400ms ||
  skip_or_fail "tc tbf does not work here"

trace_dir=$work/trace
secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
port=$((29600 + RANDOM % 300))
world=6
for r in $(seq 0 $((world - 1))); do
  host=$((r / 2))
  offset=0
  [[ $host == 2 ]] && offset=$clock_offset_ns
  nsenter --target "${keepers[$host]}" --mount --net -- \
    env CHORUS_RANK=$r CHORUS_WORLD_SIZE=$world CHORUS_LOCAL_RANK=$((r % 2)) \
    CHORUS_MASTER_ADDR="$subnet.1" CHORUS_MASTER_PORT="$port" CHORUS_SECRET="$secret" \
    CHORUS_TIMEOUT_MS=$((job_timeout * 1000)) CHORUS_TRACE="$trace_dir" CHORUS_CLOCK_OFFSET_NS=$offset \
    timeout -k 5 "$job_timeout" "$job" --iters 10 --bytes 2097152 --alltoall-bytes 1572864 --delay-rank 5 --delay-us 40000 \
    >"$work/job.$r.out" 2>"$work/job.$r.err" </dev/null &
  ranks+=($!)
done
failed=0
for r in $(seq 0 $((world - 1))); do
  status=0
  wait "${ranks[$r]}" || status=$?
  if [[ $status -ne 0 ]]; then
    failed=1
    echo "trace_cluster_test: rank $r exited with status $status" >&2
    tail -20 "$work/job.$r.err" | sed "s/^/  [rank $r] /" >&2
  fi
done
ranks=()
[[ $failed == 0 ]] || exit 1

"$tool" report "$trace_dir" | sed 's/^/  /'
"$tool" report "$trace_dir" --json >"$work/report.json"
"$tool" merge "$trace_dir" -o "$work/trace.json"
python3 - "$work/report.json" "$work/trace.json" "$clock_offset_ns" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
offset = int(sys.argv[3])
fails = []
def check(c, what):
    print(("trace_cluster_test: ok   " if c else "trace_cluster_test: FAIL ") + what)
    if not c: fails.append(what)
check(rep["hosts"] == 3, f"3 hosts seen: {rep['hosts']}")
check(rep["straggler"] == 5, f"the straggler is rank 5: {rep['straggler']}")
sh = rep["slow_host"]
check(sh is not None and sh["ranks"] == [2, 3] and sh["direction"] == "out" and sh["ambiguous_with"] is None,
      f"the slow link is host 1's (ranks 2,3), outbound, unambiguously: {sh}")
sl = rep["slow_link"]
check(sl is not None and sl["src"] in (2, 3), f"the slowest single link starts on host 1: {sl}")
for c in rep["clocks"]:
    truth = -offset if c["rank"] in (4, 5) else 0
    err = c["offset_ns"] - truth
    print(f"trace_cluster_test:      rank {c['rank']}: clock offset error {err} ns (bound {c['bound_ns']} ns)")
    check(abs(err) <= c["bound_ns"] + 1000, f"rank {c['rank']}: clock offset within its bound")
check(len(rep["clocks"]) == 6, "a clock estimate for every rank")
tr = json.load(open(sys.argv[2]))
ts = [e["ts"] for e in tr["traceEvents"] if "ts" in e]
check(max(ts) - min(ts) < 60e6, f"merged trace on one timeline: span {(max(ts) - min(ts)) / 1e6:.2f} s")
sys.exit(1 if fails else 0)
PY
