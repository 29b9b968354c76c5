#!/usr/bin/env bash
# The simulator against chorus's own measured collectives (docs/simulator.md,
# "Real runs"): 4 network-namespace "hosts" x 2 ranks joined by a bridge whose
# every veth direction is limited to 1 Gbit/s with `tc tbf`; chorus-bench runs
# a ring allreduce there, and `chorus-sim collective --algo ring` prices it on
# a cluster file describing that emulation (4 nodes x 2 "GPUs", the 1 Gbit/s
# links, and this machine's shared-memory and reduction costs from the
# tuner's profile, chorus-tune's ~/.cache/chorus/profile.json or
# CHORUS_TUNE_FILE, else the tuner's built-in defaults).  Passes when every
# size >= 1 MiB is predicted within CHORUS_SIM_REALRUN_TOLERANCE % (10 by
# default: the issue's goal, for the documented run).  CHORUS_SIM_ALGO,
# CHORUS_SIM_COLL and CHORUS_SIM_PER_HOST pick another plan, collective or
# ranks per host, CHORUS_SIM_ITERS the timed calls per size (5) (the
# investigations in docs/simulator.md).  ctest runs it with a
# sanity bound instead (tests/cluster/sim/CMakeLists.txt): the measured side is
# a timing on a shared machine, and timings are reported, not asserted, in CI.
#
#   sim_realrun_test.sh BUILD_DIR
#
# Needs root, `ip netns` and `tc` (iproute2).  Without them it FAILS with a
# message, unless CHORUS_SKIP_CLUSTER=1 is set (exit 77: ctest skipped).
# Namespaces are named chorus-sim-<pid>-*, removed on exit (trap EXIT).
set -euo pipefail

build_dir=${1:?usage: sim_realrun_test.sh BUILD_DIR}
build_dir=$(cd "$build_dir" && pwd)
bench=$build_dir/tools/chorus-bench
sim=$build_dir/tools/chorus-sim
job_timeout=${CHORUS_CLUSTER_TIMEOUT:-240}
rate_mbit=${CHORUS_SIM_LINK_MBIT:-1000}
algo=${CHORUS_SIM_ALGO:-ring}  # the plan both the library and the simulator use
coll=${CHORUS_SIM_COLL:-allreduce}  # any collective chorus-bench and chorus-sim both know
network=${CHORUS_SIM_NETWORK:-flow}  # analytical or flow (flow runs the expanded programs at this size)
tolerance=${CHORUS_SIM_REALRUN_TOLERANCE:-10}
iters=${CHORUS_SIM_ITERS:-5}  # timed calls per size (back to back, after 2 untimed)
hosts_n=4
per_host=${CHORUS_SIM_PER_HOST:-2}
world=$((hosts_n * per_host))

test_name=sim_realrun_test
# shellcheck source=netns_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns_lib.sh"
cluster_require ip tc unshare nsenter timeout python3 -- "$bench" "$sim"

tag=chorus-sim-$$
switch_ns=$tag-sw
subnet=10.232.$((RANDOM % 250 + 1))
work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-simrun.XXXXXX")
keepers=()
ranks=()
created_ns=()
trap netns_cleanup EXIT
trap 'exit 130' INT TERM

# --- hosts on one bridge; every direction of every link shaped --------------
# tbf's burst must hold a whole GSO super-packet (64 KiB on veth) or it drops
# it; 256 KiB does, and at 1 Gbit/s drains in 2 ms.
shape() {  # NS DEV
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "${rate_mbit}mbit" burst ${CHORUS_SIM_BURST:-256kb} latency 100ms
}
hosts=()
for i in $(seq 0 $((hosts_n - 1))); do hosts+=("$tag-h$i"); done
netns_make_hosts "$switch_ns" "$subnet" "${hosts[@]}"
for i in $(seq 0 $((hosts_n - 1))); do
  shape "$tag-h$i" eth0 || skip_or_fail "tc tbf does not work here"
  shape "$switch_ns" "port$i"
done
netns_start_keepers 512m $((job_timeout + 120)) "${hosts[@]}"

# --- the measurement: $coll with plan $algo, 1 MiB .. 16 MiB ----------------
secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
for r in $(seq 0 $((world - 1))); do
  host=$((r / per_host))
  nsenter --target "${keepers[$host]}" --mount --net -- \
    env CHORUS_RANK=$r CHORUS_WORLD_SIZE=$world CHORUS_LOCAL_RANK=$((r % per_host)) \
    CHORUS_MASTER_ADDR="$subnet.1" CHORUS_MASTER_PORT=29600 CHORUS_SECRET="$secret" \
    CHORUS_TIMEOUT_MS=$((job_timeout * 1000)) CHORUS_ALGO="$coll:$algo" \
    timeout -k 5 "$job_timeout" "$bench" "$coll" -b 1M -e 16M -f 4 -c 1 -w 2 -n "$iters" --json "$work/bench.jsonl" \
    >"$work/bench.$r.out" 2>"$work/bench.$r.err" </dev/null &
  ranks+=($!)
done
failed=0
for r in $(seq 0 $((world - 1))); do
  wait "${ranks[$r]}" || { failed=1; echo "sim_realrun_test: rank $r failed:" >&2; tail -5 "$work/bench.$r.err" >&2; }
done
ranks=()
[[ $failed == 0 ]] || exit 1

# --- the prediction ------------------------------------------------------------
python3 - "$work/cluster.json" "$rate_mbit" "$hosts_n" "$per_host" <<'PY'
import json, os, sys
path, mbit, hosts, per = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
# The tuner's profile (src/tune/cost_model.hpp), else its built-in defaults.
prof = {"shm": {"alpha_us": 1.0, "bandwidth_gbps": 6.0}, "tcp": {"alpha_us": 15.0}, "reduce_gbps": {"float32": 4.0}}
f = os.environ.get("CHORUS_TUNE_FILE") or os.path.expanduser("~/.cache/chorus/profile.json")
if os.path.exists(f):
    prof.update(json.load(open(f)))
reduce_gbps = prof.get("reduce_gbps", {}).get("float32", 4.0)
cluster = {
    "name": f"netns emulation: {hosts} hosts x {per} ranks, {mbit:.0f} Mbit/s veth+tbf",
    "nodes": hosts,
    # The sim charges a reduction 3 x bytes / (HBM x 0.8): pick the "HBM" that
    # gives the measured reduction rate (bytes reduced per second).
    "gpu": {"name": "cpu", "peak_tflops": 0.1, "hbm_gib": 8, "hbm_gbyte_s": 3 * reduce_gbps / 0.8},
    "node": {"gpus": per, "nvlink_gbyte_s": prof["shm"]["bandwidth_gbps"], "nvlink_latency_us": prof["shm"]["alpha_us"],
             "nvlink_efficiency": 1.0},
    # tbf meters whole frames: a full TCP segment is 1514 B on the wire (14 B Ethernet + 20 B IP + 32 B TCP
    # with timestamps + 1448 B payload), so payload moves at 1448/1514 = 0.956 of the shaped rate.
    "network": {"topology": "fat-tree", "nics_per_node": 1, "nic_gbit_s": mbit / 1000, "latency_us": prof["tcp"]["alpha_us"],
                "oversubscription": 1, "efficiency": 1448 / 1514, "leaf_nodes": hosts,
                # The TCP transport's clear-to-send threshold (src/transport/tcp, 256 KiB by default).
                "rendezvous_bytes": int(os.environ.get("CHORUS_TCP_RENDEZVOUS_BYTES", 262144))},
}
json.dump(cluster, open(path, "w"), indent=2)
PY
ok=1
echo "| bytes | measured (us) | predicted (us) | error |"
echo "|---|---|---|---|"
while read -r bytes measured; do
  predicted=$("$sim" collective --cluster "$work/cluster.json" --gpus $world --collective "$coll" --bytes "$bytes" \
    --algo "$algo" --library chorus --network "$network" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["time_us"])')
  line=$(python3 -c "m,p=$measured,$predicted; e=100*(p-m)/m; print(f'| $bytes | {m:.0f} | {p:.0f} | {e:+.1f}% |'); exit(0 if abs(e) <= $tolerance else 1)") || ok=0
  echo "$line"
done < <(python3 - "$work/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows:
    if not r.get("inplace") and r["bytes"] >= 1 << 20:
        print(r["bytes"], r["time_us"])
PY
)
echo "sim_realrun_test: $([[ $ok == 1 ]] && echo "ok: every size >= 1 MiB within $tolerance %" || echo "FAILED: a size >= 1 MiB is off by more than $tolerance %")"
[[ $ok == 1 ]]
