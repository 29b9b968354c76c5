#!/usr/bin/env bash
# Strangers between hosts: a two-host chorus job (2 network namespaces x 2
# ranks: shm inside a host, TCP between them) while a third namespace on the
# same bridge, with no secret, connects to every listening port the job opens.
#
#   netns_stranger_test.sh BUILD_DIR
#
# Three jobs, each `chorus-bench allreduce` with rank 3 started 2 s after the
# others (so every listener is up and waiting for it when the strangers come):
#   clean    no stranger.
#   hostile  once ranks 0-2 listen, the stranger opens 6 silent, 3 slow (a
#            byte every 0.3 s) and 3 garbage connections to every port the
#            job listens on in both hosts (the rendezvous store and the TCP
#            transport's setup listeners: found with `ss`, as a port scan
#            would), then rank 3 starts.
#   flood    rank 0 limited to 256 descriptors; the stranger keeps 300
#            connections open to the store's port, reopened as they close.
# Each job must succeed with 0 wrong elements; the hostile job's time from
# rank 3's start to the last rank's exit must stay within 1 s of the clean
# job's (before the listeners drove handshakes concurrently, each silent
# socket ahead of an honest one cost 10 s); the listeners must have refused
# the strangers (closed them or told them "busy"), and rank 0's log must hold
# a few summary lines, not one line per stranger.
#
# Needs root, `ip netns`, ss, nsenter and python3; fails without them unless
# CHORUS_SKIP_CLUSTER=1 (exit 77).  Creates only namespaces chorus-<pid>-* and
# removes everything on exit.
set -euo pipefail

build_dir=${1:?usage: netns_stranger_test.sh BUILD_DIR}
build_dir=$(cd "$build_dir" && pwd)
bench=$build_dir/tools/chorus-bench
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
stranger=$here/stranger.py
job_timeout=90

test_name=netns_stranger_test
# shellcheck source=netns_lib.sh
source "$here/netns_lib.sh"
cluster_require ip ss unshare nsenter timeout prlimit python3 -- "$bench"
netns_remove_stale

tag=chorus-$$
hosts=("$tag-h0" "$tag-h1" "$tag-h2")  # h2: the stranger's host
switch_ns=$tag-sw
subnet=10.234.$((RANDOM % 250 + 1))
work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-stranger.XXXXXX")
keepers=()
ranks=()
created_ns=()

trap netns_cleanup EXIT
trap 'exit 130' INT TERM

netns_make_hosts "$switch_ns" "$subnet" "${hosts[@]}"
netns_start_keepers 64m 900 "${hosts[@]}"
secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')

now_ms() { date +%s%3N; }

# listening_ports HOST_INDEX: the TCP ports listening in that host's namespace.
listening_ports() {
  nsenter --target "${keepers[$1]}" --net -- ss -ltnH | awk '{n = split($4, a, ":"); print a[n]}' | sort -un
}

# start_rank NAME RANK PORT [PREFIX...]: rank RANK (host RANK/2) in the background.
start_rank() {
  local name=$1 r=$2 port=$3
  shift 3
  nsenter --target "${keepers[$((r / 2))]}" --mount --net -- \
    env CHORUS_RANK="$r" CHORUS_WORLD_SIZE=4 CHORUS_LOCAL_RANK=$((r % 2)) \
    CHORUS_MASTER_ADDR="$subnet.1" CHORUS_MASTER_PORT="$port" CHORUS_SECRET="$secret" \
    CHORUS_TIMEOUT_MS=60000 \
    timeout -k 5 "$job_timeout" "$@" "$bench" allreduce -b 8 -e 1M -f 32 -c 1 -w 1 -n 2 \
    --json "$work/$name.$r.jsonl" >"$work/$name.$r.out" 2>"$work/$name.$r.err" </dev/null &
  ranks[$r]=$!
}

# hold_dials HOST_INDEX OTHER_INDEX STORE_PORT: the host's new TCP connections to
# the other job host (pure SYNs, but not to the store's port) go to an htb
# class of 8 bit/s, where they wait (this kernel has no drop action), until
# release_dials removes the qdisc and the queued SYNs with it: TCP sends the
# SYN again at its retransmission timeout (1 s, then 3 s after the first).
# So every rank's setup listener is up and waiting for its honest peers when
# the stranger comes.
hold_dials() {
  local ns=${hosts[$1]} other=$subnet.$(($2 + 1)) port=$3
  tc -n "$ns" qdisc add dev eth0 root handle 1: htb default 10
  tc -n "$ns" class add dev eth0 parent 1: classid 1:10 htb rate 10gbit quantum 60000
  tc -n "$ns" class add dev eth0 parent 1: classid 1:20 htb rate 8bit ceil 8bit burst 1 cburst 1 quantum 1514
  tc -n "$ns" filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dport "$port" 0xffff classid 1:10
  # TCP (protocol 6), flags byte at offset 33 (20-byte IP header + 13): SYN set, ACK clear.
  tc -n "$ns" filter add dev eth0 parent 1: protocol ip prio 2 u32 match ip dst "$other/32" \
    match ip protocol 6 0xff match u8 0x02 0x12 at 33 classid 1:20
}
release_dials() {
  local h
  for h in "$@"; do tc -n "${hosts[$h]}" qdisc del dev eth0 root 2>/dev/null || true; done
}

# run_job NAME PORT MODE: ranks 0..3 start; their dials across hosts are held
# until every listener is up; then (MODE hostile) the stranger connects to
# every listening port of both hosts, or (flood) keeps 300 connections on the
# store of a rank 0 limited to 256 descriptors; then the dials are released.
# Writes the milliseconds from the listeners' appearance to the last rank's exit to
# $work/NAME.ms; fails unless every rank exits 0 with 0 wrong elements.
run_job() {
  local name=$1 port=$2 mode=$3 r t0 status failed=0
  ranks=()
  stranger_pid=
  hold_dials 0 1 "$port"
  hold_dials 1 0 "$port"
  if [[ $mode == flood ]]; then
    start_rank "$name" 0 "$port" prlimit --nofile=256:256 --
    for _ in $(seq 100); do listening_ports 0 | grep -qx "$port" && break; sleep 0.05; done
    nsenter --target "${keepers[2]}" --net -- python3 "$stranger" --hold 60 --flood 300 \
      --ready "$work/$name.ready" --stop "$work/$name.stop" "$subnet.1:$port" >"$work/$name.stranger" 2>&1 &
    stranger_pid=$!
    for _ in $(seq 200); do [[ -e $work/$name.ready ]] && break; sleep 0.05; done
    for r in 1 2 3; do start_rank "$name" "$r" "$port"; done
  else
    for r in 0 1 2 3; do start_rank "$name" "$r" "$port"; done
  fi
  # Every rank's setup listener: the store and two in host 0, two in host 1.
  for _ in $(seq 400); do
    (($(listening_ports 0 | wc -l) >= 3 && $(listening_ports 1 | wc -l) >= 2)) && break
    sleep 0.02
  done
  t0=$(now_ms)
  echo "$test_name: $name: listening: host 0 $(listening_ports 0 | tr '\n' ' ')host 1 $(listening_ports 1 | tr '\n' ' ')" >&2
  if [[ $mode == hostile ]]; then
    local targets=() h p
    for h in 0 1; do
      for p in $(listening_ports "$h"); do targets+=("$subnet.$((h + 1)):$p"); done
    done
    nsenter --target "${keepers[2]}" --net -- python3 "$stranger" --hold 60 --silent 6 --slow 3 --garbage 3 \
      --ready "$work/$name.ready" --stop "$work/$name.stop" "${targets[@]}" >"$work/$name.stranger" 2>&1 &
    stranger_pid=$!
    for _ in $(seq 200); do [[ -e $work/$name.ready ]] && break; sleep 0.05; done
    [[ -e $work/$name.ready ]] || { echo "$test_name: $name: the stranger never got going" >&2; return 1; }
  fi
  # The first dials went out (and were held) when the listeners appeared: let
  # their 3 s retransmission through, the same in every job.
  sleep "$(python3 -c "print(max(0.0, 2.5 - ($(now_ms) - $t0) / 1000))")"
  release_dials 0 1
  for r in 0 1 2 3; do
    status=0
    wait "${ranks[$r]}" || status=$?
    if [[ $status -ne 0 ]]; then
      failed=1
      echo "$test_name: $name: rank $r exited with status $status" >&2
      tail -20 "$work/$name.$r.err" | sed "s/^/  [rank $r] /" >&2
    fi
  done
  echo $(($(now_ms) - t0)) >"$work/$name.ms"
  ranks=()
  release_dials 0 1
  if [[ -n $stranger_pid ]]; then
    touch "$work/$name.stop"
    wait "$stranger_pid" || true
    echo "$test_name: $name: stranger: $(tail -1 "$work/$name.stranger")"
  fi
  python3 - "$work" "$name" <<'EOF' || failed=1
import json, sys
work, name = sys.argv[1], sys.argv[2]
rows = []
for r in range(4):
    try:
        rows += [json.loads(l) for l in open(f"{work}/{name}.{r}.jsonl") if l.strip()]
    except OSError:
        pass
bad = [r for r in rows if r.get("wrong") != 0 or r.get("nranks") != 4]
if not rows or bad:
    print(f"netns_stranger_test: {name}: no rows or bad rows: {bad[:3]}", file=sys.stderr)
    sys.exit(1)
EOF
  return $failed
}

ok=1
run_job clean 29600 clean || ok=0
run_job hostile 29601 hostile || ok=0
run_job flood 29602 flood || ok=0
clean_ms=$(cat "$work/clean.ms")
hostile_ms=$(cat "$work/hostile.ms")
flood_ms=$(cat "$work/flood.ms")
echo "$test_name: from the listeners' appearance to the end: clean $clean_ms ms, with strangers on every listener $hostile_ms ms, rank 0 flooded at 256 descriptors $flood_ms ms"

python3 - "$work" "$clean_ms" "$hostile_ms" <<'EOF' || ok=0
import json, sys
work, clean, hostile = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
bad = []
if hostile > clean + 1000:
    bad.append(f"strangers on every listener delayed the job: {hostile} ms against {clean} ms clean (allowed: 1000 ms more)")
for name, want in (("hostile", 12), ("flood", 300)):
    st = json.loads(open(f"{work}/{name}.stranger").read().strip().splitlines()[-1])
    if st["opened"] < want:
        bad.append(f"{name}: the stranger opened only {st['opened']} connections: {st}")
    if st["closed_by_server"] == 0:
        bad.append(f"{name}: no listener ever closed a stranger's connection: {st}")
    err = open(f"{work}/{name}.0.err").read()
    lines = [l for l in err.splitlines() if "refused" in l]
    if len(lines) > 8:
        bad.append(f"{name}: rank 0 logged {len(lines)} refusal lines (not rate-limited)")
    if name == "hostile" and st["targets"] < 3:
        bad.append(f"hostile: the stranger found only {st['targets']} listening ports")
for b in bad:
    print("netns_stranger_test: " + b, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
echo "$test_name: $([[ $ok == 1 ]] && echo ok || echo FAILED)"
[[ $ok == 1 ]]
