#!/usr/bin/env bash
# The UCX transport between emulated hosts (issue 38): the netns cluster and
# fault tests' cases, short, over CHORUS_TRANSPORT=ucx with UCX_TLS=tcp (so
# every byte between hosts crosses the bridge through UCX's tcp lane).
#
#   netns_ucx_test.sh BUILD_DIR
#
#   collectives  3 hosts x 2 ranks, ucx for every peer (also within a host):
#                chorus_collectives_main's reduced matrix, 0 failures on every
#                rank, and each host's port carried the cross-host traffic;
#   sealed       2 hosts x 1 rank, CHORUS_WIRE_PROTECT=encrypt: a chorus-bench
#                allreduce sweep 1 KiB..4 MiB with 0 wrong elements;
#   kill         3 hosts x 1 rank: SIGKILL a random rank mid-stream (4 trials):
#                every survivor fails naming it within 5 s, exits, leaves nothing;
#   cut          3 hosts x 1 rank: a whole host vanishes (its link to the
#                bridge goes down, then its rank is killed, so no FIN or RST
#                gets out; 2 trials): every survivor fails naming it within
#                3 x CHORUS_HEARTBEAT_MS + 2 s.  UCX itself does not notice
#                (its keepalive completes locally on a socket whose peer
#                vanished); the transport's own heartbeat does
#                (ucx_heartbeat.cpp, docs/ucx.md "Faults").
#
# Needs root, `ip netns`, nsenter, python3 and a build with the ucx transport;
# without root or the tools it FAILS with a message unless CHORUS_SKIP_CLUSTER=1
# (exit 77: ctest skipped).  Creates only namespaces named chorus-<pid>-*, and
# removes everything on exit.
set -euo pipefail

build_dir=${1:?usage: netns_ucx_test.sh BUILD_DIR}
build_dir=$(cd "$build_dir" && pwd)
prog=$build_dir/tests/integration/chorus_collectives_main
fault=$build_dir/tests/integration/chorus_fault_main
bench=$build_dir/tools/chorus-bench
driver=$(cd "$(dirname "${BASH_SOURCE[0]}")/../integration" && pwd)/fault_test.py
job_timeout=${CHORUS_CLUSTER_TIMEOUT:-120}
heartbeat_ms=1000

test_name=netns_ucx_test
# shellcheck source=netns_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns_lib.sh"
cluster_require ip unshare nsenter timeout python3 -- "$prog" "$fault" "$bench"
netns_remove_stale

tag=chorus-$$
hosts=("$tag-h0" "$tag-h1" "$tag-h2")
switch_ns=$tag-sw
subnet=10.233.$((RANDOM % 250 + 1))
work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-ucx.XXXXXX")
keepers=()
ranks=()
created_ns=()

trap netns_cleanup EXIT
trap 'exit 130' INT TERM

netns_make_hosts "$switch_ns" "$subnet" "${hosts[@]}"
netns_start_keepers 256m $((4 * job_timeout + 120)) "${hosts[@]}"

export CHORUS_TRANSPORT=ucx UCX_TLS=tcp
# Not a warning per rank about UCX's memory hooks in every test log.
export UCX_WARN_UNUSED_ENV_VARS=n

# run_job NAME PORT PER_HOST HOSTS PROGRAM ARGS...: PER_HOST ranks on each of the
# first HOSTS hosts; non-zero unless every rank exited 0 within job_timeout.
run_job() {
  local name=$1 port=$2 per=$3 nh=$4
  shift 4
  local secret world=$((per * nh)) r host
  secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
  ranks=()
  for r in $(seq 0 $((world - 1))); do
    host=$((r / per))
    nsenter --target "${keepers[$host]}" --mount --net -- \
      env CHORUS_RANK=$r CHORUS_WORLD_SIZE=$world CHORUS_LOCAL_RANK=$((r % per)) \
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
      echo "$test_name: $name: rank $r (host $((r / per))) exited with status $status" >&2
      sed "s/^/  [rank $r] /" "$work/$name.$r.err" | tail -20 >&2
    fi
  done
  ranks=()
  return $failed
}

status=0

# --- collectives: 3 hosts x 2 ranks, ucx everywhere --------------------------
start=$SECONDS
ok=1
run_job collectives 29600 2 3 "$prog" --counts 0,7 --float-counts 100003 || ok=0
cat "$work"/collectives.*.out >"$work/collectives.jsonl"
python3 - "$work/collectives.jsonl" 6 <<'EOF' || ok=0
import json, sys
path, world = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(path) if l.startswith("{")]
bad = [r for r in rows if r.get("error") or r.get("failures") != 0 or r.get("nranks") != world or r.get("cases", 0) <= 0]
for r in bad:
    print(f"netns_ucx_test: collectives: rank {r.get('rank')}: {r}", file=sys.stderr)
if sorted(r.get("rank") for r in rows) != list(range(world)):
    print(f"netns_ucx_test: collectives: expected a JSON line from ranks 0..{world-1}", file=sys.stderr)
    sys.exit(1)
if not bad:
    print(f"netns_ucx_test: collectives: {world} ranks ran {sum(r['cases'] for r in rows)} cases, 0 failures")
sys.exit(1 if bad else 0)
EOF
for i in 0 1 2; do
  rx=$(ip netns exec "$switch_ns" cat "/sys/class/net/port$i/statistics/rx_bytes")
  echo "$test_name: host $i sent $rx bytes over the bridge"
  if ((rx < 400000)); then
    echo "$test_name: collectives: host $i sent only $rx bytes over the bridge (expected UCX tcp traffic)" >&2
    ok=0
  fi
done
# The traffic is UCX's: with a UCX_TLS that names no transport, the same job
# fails at setup naming the ucx transport.
if run_job notls 29602 1 2 env UCX_TLS=no_such_transport "$prog" --counts 7 --float-counts 7 2>/dev/null; then
  echo "$test_name: collectives: a job with UCX_TLS=no_such_transport ran: CHORUS_TRANSPORT=ucx is not in use" >&2
  ok=0
elif ! cat "$work"/notls.0.* | grep -q "UCX transport"; then
  echo "$test_name: collectives: the UCX_TLS=no_such_transport job failed without naming the UCX transport:" >&2
  tail -3 "$work"/notls.0.* >&2
  ok=0
fi
echo "$test_name: collectives over ucx on 3 hosts x 2 ranks: $([[ $ok == 1 ]] && echo ok || echo FAILED) ($((SECONDS - start)) s)"
[[ $ok == 1 ]] || status=1

# --- sealed: CHORUS_WIRE_PROTECT=encrypt across 2 hosts -----------------------
start=$SECONDS
ok=1
run_job sealed 29601 1 2 env CHORUS_WIRE_PROTECT=encrypt \
  "$bench" allreduce -b 1K -e 4M -f 4 -c 1 -w 1 -n 3 --json "$work/sealed.jsonl" || ok=0
python3 - "$work/sealed.jsonl" <<'EOF' || ok=0
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError as e:
    print(f"netns_ucx_test: sealed: no --json output: {e}", file=sys.stderr)
    sys.exit(1)
bad = [r for r in rows if r.get("wrong") != 0 or r.get("nranks") != 2]
for r in bad:
    print(f"netns_ucx_test: sealed: bad row {r}", file=sys.stderr)
if sorted({r["bytes"] for r in rows}) != [1024 * 4**k for k in range(7)]:
    print("netns_ucx_test: sealed: expected sizes 1K..4M by 4", file=sys.stderr)
    sys.exit(1)
sys.exit(1 if bad else 0)
EOF
echo "$test_name: sealed (encrypt) allreduce over ucx on 2 hosts: $([[ $ok == 1 ]] && echo ok || echo FAILED) ($((SECONDS - start)) s)"
[[ $ok == 1 ]] || status=1

# --- faults: a killed rank, a cut host ---------------------------------------
k3=$(IFS=,; echo "${keepers[*]}")
n3=$(IFS=,; echo "${hosts[*]}")
fault_run() {
  local name=$1 start=$SECONDS rc=0
  shift
  echo "$test_name: $name: $*"
  python3 "$driver" "$fault" --transport ucx --master-addr "$subnet.1" --heartbeat-ms $heartbeat_ms \
    --hosts "$k3" --netns "$n3" --ranks 3 "$@" >"$work/$name.log" 2>&1 || rc=$?
  grep -v '"ok": true' "$work/$name.log" | sed "s/^/  [$name] /"
  echo "$test_name: $name over ucx: $([[ $rc == 0 ]] && echo ok || echo FAILED) ($((SECONDS - start)) s)"
  [[ $rc == 0 ]] || status=1
}
fault_run kill --trials "${CHORUS_FAULT_TRIALS:-4}" --bound-s 5
fault_run cut --trials "${CHORUS_CUT_TRIALS:-2}" --bound-s $((3 * heartbeat_ms / 1000 + 2)) \
  --cut-cmd "ip -n $switch_ns link set port{host} {state}"
exit $status
