#!/usr/bin/env bash
# A three-host chorus job on one machine: each "host" is a network namespace
# (its own interfaces, routes and netns inode, so chorus's host identity differs)
# with its own /dev/shm, joined by a bridge that lives in a fourth namespace.
# Two ranks per host: they talk shared memory to each other and TCP to the
# other hosts, as on a real cluster.
#
#   netns_cluster_test.sh BUILD_DIR
#
# Runs (1) chorus_collectives_main on 6 ranks with a reduced case list and checks
# every rank exits 0 and reports 0 failures in its JSON line, then (2) a
# chorus-bench allreduce sweep across the hosts, checking exit 0 and 0 wrong
# elements in its --json rows and that the tuner picks the hierarchical
# allreduce, then (3) chorus-bench --algo all (every allreduce algorithm).
#
# Needs root and `ip netns` (iproute2).  Without them it FAILS with a message,
# unless CHORUS_SKIP_CLUSTER=1 is set, in which case it exits 77 (ctest: skipped).
# Creates only namespaces named chorus-<pid>-*, addresses only inside them,
# and removes everything on exit (trap EXIT), whatever happened.
set -euo pipefail

build_dir=${1:?usage: netns_cluster_test.sh BUILD_DIR}
build_dir=$(cd "$build_dir" && pwd)
prog=$build_dir/tests/integration/chorus_collectives_main
bench=$build_dir/tools/chorus-bench
# Seconds per job before its ranks are killed; two jobs plus setup stay well
# inside ctest's 600 s, so the EXIT trap (not ctest's SIGKILL) ends the test.
job_timeout=${CHORUS_CLUSTER_TIMEOUT:-200}

test_name=netns_cluster_test
# shellcheck source=netns_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns_lib.sh"
cluster_require ip unshare nsenter timeout python3 -- "$prog" "$bench"
netns_remove_stale

tag=chorus-$$
hosts=("$tag-h0" "$tag-h1" "$tag-h2")
switch_ns=$tag-sw
subnet=10.231.$((RANDOM % 250 + 1))
work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-cluster.XXXXXX")
keepers=()  # one process per host holding its private /dev/shm mount
ranks=()    # pids of running ranks
created_ns=()

trap netns_cleanup EXIT
trap 'exit 130' INT TERM

# --- the network: hosts 10.231.X.1-3 on one bridge -------------------------
netns_make_hosts "$switch_ns" "$subnet" "${hosts[@]}"

# --- one private /dev/shm per host ------------------------------------------
netns_start_keepers 256m $((2 * job_timeout + 120)) "${hosts[@]}"

# run_job NAME PORT PROGRAM ARGS...: 3 hosts x 2 ranks; returns non-zero unless
# every rank exited 0 within job_timeout.  Rank r's output goes to $work/NAME.r.{out,err}.
run_job() {
  local name=$1 port=$2
  shift 2
  local secret world=6 r host
  secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
  ranks=()
  for r in $(seq 0 $((world - 1))); do
    host=$((r / 2))
    nsenter --target "${keepers[$host]}" --mount --net -- \
      env CHORUS_RANK=$r CHORUS_WORLD_SIZE=$world CHORUS_LOCAL_RANK=$((r % 2)) \
      CHORUS_MASTER_ADDR="$subnet.1" CHORUS_MASTER_PORT="$port" CHORUS_SECRET="$secret" \
      CHORUS_TIMEOUT_MS=$((job_timeout * 1000)) \
      timeout -k 5 "$job_timeout" "$@" >"$work/$name.$r.out" 2>"$work/$name.$r.err" </dev/null &
    ranks+=($!)
  done
  local failed=0 status
  for r in $(seq 0 $((world - 1))); do
    status=0
    wait "${ranks[$r]}" || status=$?
    if [[ $status -ne 0 ]]; then
      failed=1
      echo "netns_cluster_test: $name: rank $r (host $((r / 2))) exited with status $status$([[ $status -eq 124 ]] && echo " (timed out after ${job_timeout}s)")" >&2
      sed "s/^/  [rank $r] /" "$work/$name.$r.err" | tail -20 >&2
    fi
  done
  ranks=()
  return $failed
}

# --- 1: the collectives matrix, reduced --------------------------------------
start=$SECONDS
collectives_ok=1
# allreduce, allgather and alltoall run the hierarchical (two-level) plans, and the
# program fails unless the tuner really runs them on this layout.
run_job collectives 29500 env CHORUS_ALGO=allreduce:hierarchical,allgather:hierarchical,alltoall:hierarchical \
  "$prog" --counts "${CHORUS_CLUSTER_COUNTS:-0,7}" \
  --float-counts "${CHORUS_CLUSTER_FLOAT_COUNTS:-100003,1000003}" \
  --expect-algo allreduce:hierarchical --expect-algo allgather:hierarchical \
  --expect-algo alltoall:hierarchical || collectives_ok=0
cat "$work"/collectives.*.out > "$work/collectives.jsonl"
python3 - "$work/collectives.jsonl" 6 <<'EOF' || collectives_ok=0
import json, sys
path, world = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(path) if l.startswith("{")]
seen = sorted(r.get("rank") for r in rows)
bad = [r for r in rows if r.get("error") or r.get("failures") != 0 or r.get("nranks") != world or r.get("cases", 0) <= 0]
for r in bad:
    print(f"netns_cluster_test: collectives: rank {r.get('rank')}: {r}", file=sys.stderr)
if seen != list(range(world)):
    print(f"netns_cluster_test: collectives: expected a JSON line from ranks 0..{world-1}, got {seen}", file=sys.stderr)
    sys.exit(1)
if not bad:
    print(f"netns_cluster_test: collectives: {world} ranks ran {sum(r['cases'] for r in rows)} cases, 0 failures")
sys.exit(1 if bad else 0)
EOF
# The cross-host half of the job must really have crossed the bridge: each
# host's port carried at least one 100003-float allreduce's share (~400 KB).
for i in 0 1 2; do
  rx=$(ip netns exec "$switch_ns" cat "/sys/class/net/port$i/statistics/rx_bytes")
  echo "netns_cluster_test: host $i sent $rx bytes over the bridge"
  if ((rx < 400000)); then
    echo "netns_cluster_test: collectives: host $i sent only $rx bytes over the bridge (expected TCP traffic between hosts)" >&2
    collectives_ok=0
  fi
done
echo "netns_cluster_test: collectives on 3 hosts x 2 ranks: $([[ $collectives_ok == 1 ]] && echo ok || echo FAILED) ($((SECONDS - start)) s)"

# --- 2: chorus-bench allreduce across the hosts ------------------------------
start=$SECONDS
bench_ok=1
# The built-in cost model (no profile file): the tuner must pick the
# hierarchical allreduce on its own for a job spanning hosts.
run_job bench 29501 env CHORUS_TUNE_FILE="$work/no-profile.json" \
  "$bench" allreduce -b 1K -e 4M -f 4 -c 1 -w 1 -n 3 --json "$work/bench.jsonl" || bench_ok=0
python3 - "$work/bench.jsonl" <<'EOF' || bench_ok=0
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError as e:
    print(f"netns_cluster_test: bench: no --json output: {e}", file=sys.stderr)
    sys.exit(1)
sizes = sorted({r["bytes"] for r in rows})
bad = [r for r in rows if r.get("wrong") != 0 or r.get("nranks") != 6]
for r in bad:
    print(f"netns_cluster_test: bench: bad row {r}", file=sys.stderr)
# 1K, 4K, 16K, 64K, 256K, 1M, 4M
if sizes != [1024 * 4**k for k in range(7)]:
    print(f"netns_cluster_test: bench: expected sizes 1K..4M by 4, got {sizes}", file=sys.stderr)
    sys.exit(1)
if not any(r.get("algo") == "hierarchical" for r in rows):
    print(f"netns_cluster_test: bench: the tuner never chose the hierarchical allreduce: {[r.get('algo') for r in rows]}",
          file=sys.stderr)
    sys.exit(1)
sys.exit(1 if bad else 0)
EOF
# --algo all: one sweep per allreduce algorithm, each row checked and priced.
run_job bench_all 29502 "$bench" allreduce --algo all -b 64K -e 1M -f 16 -c 1 -w 0 -n 2 \
  --json "$work/bench_all.jsonl" || bench_ok=0
python3 - "$work/bench_all.jsonl" <<'EOF' || bench_ok=0
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
algos = {r["algo"] for r in rows}
bad = [r for r in rows if r.get("wrong") != 0 or r.get("predicted_us") is None]
for r in bad:
    print(f"netns_cluster_test: bench --algo all: bad row {r}", file=sys.stderr)
want = {"ring", "recursive_doubling", "rabenseifner", "double_tree", "hierarchical"}
if not want <= algos or "direct" in algos:
    print(f"netns_cluster_test: bench --algo all: algorithms {sorted(algos)}, expected {sorted(want)} and not direct",
          file=sys.stderr)
    sys.exit(1)
sys.exit(1 if bad else 0)
EOF
if [[ $bench_ok == 1 ]]; then sed 's/^/  /' "$work/bench_all.0.out"; fi
if [[ $bench_ok == 1 ]]; then sed 's/^/  /' "$work/bench.0.out"; fi
echo "netns_cluster_test: chorus-bench allreduce on 3 hosts x 2 ranks: $([[ $bench_ok == 1 ]] && echo ok || echo FAILED) ($((SECONDS - start)) s)"

[[ $collectives_ok == 1 && $bench_ok == 1 ]]
