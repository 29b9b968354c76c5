#!/usr/bin/env bash
# chorus-ptp against linuxptp's ptp4l, in two network namespaces joined by a
# veth pair (software timestamps; both ends read the same CLOCK_REALTIME, so
# the true offset is 0 and every reported offset is error).
#
#   ptp_interop_test.sh BUILD_DIR [--long]
#
# Phase A: ptp4l master (free_running 1) in the "master" namespace; in the
#   "slave" namespace, side by side on the same interface, chorus-ptp --slave
#   steering its virtual clock (started 1 ms off and 50 ppm fast, so the servo
#   must find both) and ptp4l -s (free_running 1: reports only) as the
#   baseline measured in the same run.
# Phase B: chorus-ptp --master in the master namespace and ptp4l -s
#   (free_running 1) alone in the slave namespace.  (A chorus-ptp slave beside
#   it skews ptp4l's reading by ~-0.9 us in this setup -- see docs/ptp.md --
#   so phase B runs the pair the issue asks for and nothing else.)
#
# Phases C and D: the same pairs over Layer 2 (ptp4l -2, chorus-ptp --l2),
#   CHORUS_PTP_L2_SECONDS (default 12) each.
#
# Asserts (short CI run, CHORUS_PTP_SECONDS=15 per phase by default): chorus
# locks and |mean offset| < 10 us and |mean true clock offset| < 10 us after
# convergence; each ptp4l slave reports >= 3 offsets with |mean| < 10 us;
# linuxptp's pmc (Management GET over UDP) sees chorus-ptp's port as MASTER.  Prints one JSON line per phase with the figures
# (mean/RMS of every follower) -- docs/ptp.md quotes the --long run
# (60 s per phase at 16 syncs/s).
#
# Needs root, iproute2 and linuxptp (scripts/setup.sh installs it).  Without
# them it FAILS, unless CHORUS_SKIP_CLUSTER=1, then it exits 77 (skipped).
# Creates only namespaces chorus-ptp-<pid>-{m,s} and removes them, and every
# process it started, on exit (trap EXIT).
set -euo pipefail

build_dir=${1:?usage: ptp_interop_test.sh BUILD_DIR [--long]}
build_dir=$(cd "$build_dir" && pwd)
ptp=$build_dir/tools/chorus-ptp
seconds=${CHORUS_PTP_SECONDS:-15}
log_sync=${CHORUS_PTP_LOG_SYNC:--4}
[[ ${2:-} == --long ]] && seconds=${CHORUS_PTP_SECONDS:-60}
limit_ns=${CHORUS_PTP_LIMIT_NS:-10000}

test_name=ptp_interop_test
# shellcheck source=netns_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns_lib.sh"
cluster_require ip ptp4l timeout python3 -- "$ptp"

tag=chorus-ptp-$$
ns_m=$tag-m
ns_s=$tag-s
work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-ptp.XXXXXX")
pids=()
created_ns=()

cleanup() {
  local rc=$?
  set +e
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for ns in "${created_ns[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  if [[ $rc -ne 0 ]]; then
    echo "ptp_interop_test: logs kept in $work" >&2
  else
    rm -rf "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT

ip netns add "$ns_m" && created_ns+=("$ns_m")
ip netns add "$ns_s" && created_ns+=("$ns_s")
# The veth is created inside the master namespace, so no name ever exists in
# the caller's namespace.
ip -n "$ns_m" link add pm type veth peer name ps netns "$ns_s"
ip -n "$ns_m" addr add 10.77.0.1/24 dev pm
ip -n "$ns_s" addr add 10.77.0.2/24 dev ps
for ns in "$ns_m" "$ns_s"; do ip -n "$ns" link set lo up; done
ip -n "$ns_m" link set pm up
ip -n "$ns_s" link set ps up

# The ptp4l slave shares the interface (and so the MAC-derived identity) with
# chorus-ptp: give it an identity of its own.  summary_interval -4 makes it
# print each once-per-second estimate instead of a 16-sample summary.
ptp4l_cfg master "priority1 127"
ptp4l_cfg slave "slaveOnly 1" "freq_est_interval 0" "summary_interval $log_sync" "clockIdentity 020000.fffe.00c0de"

run_phase() {  # phase-name, master-kind (ptp4l|chorus), chorus-slave flags...
  # With l2=1 in the environment every daemon uses Layer 2 (ptp4l -2, chorus-ptp --l2).
  local phase=$1 master=$2
  shift 2
  local run_s=$((${phase_seconds:-$seconds} + 2))
  local p4net=() chnet=()
  if [[ ${l2:-0} == 1 ]]; then p4net=(-2); chnet=(--l2); fi
  pids=()
  if [[ $master == ptp4l ]]; then
    ip netns exec "$ns_m" timeout $((run_s + 4)) ptp4l "${p4net[@]}" -i pm -S -m -f "$work/master.cfg" \
      >"$work/$phase-master.log" 2>&1 &
  else
    ip netns exec "$ns_m" timeout $((run_s + 4)) "$ptp" "${chnet[@]}" -i pm --master --log-sync-interval "$log_sync" \
      --log-announce-interval 0 --log-min-delay-req-interval "$log_sync" --duration-s $((run_s + 2)) \
      >"$work/$phase-master.json" 2>"$work/$phase-master.log" &
  fi
  pids+=($!)
  if [[ ${1:-} == none ]]; then
    # ptp4l alone: it runs for the phase, then timeout ends it (rc 124).
    ip netns exec "$ns_s" timeout "$run_s" ptp4l "${p4net[@]}" -i ps -S -s -m -f "$work/slave.cfg" \
      >"$work/$phase-ptp4l-slave.log" 2>&1 || true
    # The master outlives ptp4l by 2 s: ask it for its port data set with
    # linuxptp's management client, over the network.
    if command -v pmc >/dev/null && [[ ${l2:-0} != 1 ]]; then
      ip netns exec "$ns_s" timeout 3 pmc -4 -i ps -b 1 'GET PORT_DATA_SET' 'GET DEFAULT_DATA_SET' \
        >"$work/$phase-pmc.log" 2>&1 || true
    fi
  else
    ip netns exec "$ns_s" timeout $((run_s + 4)) ptp4l "${p4net[@]}" -i ps -S -s -m -f "$work/slave.cfg" \
      >"$work/$phase-ptp4l-slave.log" 2>&1 &
    pids+=($!)
    ip netns exec "$ns_s" timeout $((run_s + 4)) "$ptp" "${chnet[@]}" -i ps --slave --json-log "$work/$phase-chorus-slave.jsonl" \
      --duration-s "$run_s" "$@" >"$work/$phase-chorus-slave.json" 2>"$work/$phase-chorus-slave.log" &
    local chorus_pid=$!
    pids+=($chorus_pid)
    wait "$chorus_pid" || { echo "ptp_interop_test: $phase: chorus-ptp slave failed:" >&2; cat "$work/$phase-chorus-slave.log" >&2; return 1; }
  fi
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}

# Statistics and assertions in one place: mean/RMS of each follower's
# offsets after convergence (chorus: 3 s after its servo locked; ptp4l: its
# lines after the first two).
analyse() {  # phase, expect-chorus-lock-from-injection (0|1)
  python3 - "$work" "$1" "$limit_ns" "$seconds" "$log_sync" <<'EOF'
import json, math, re, sys
work, phase, limit, seconds, log_sync = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
def stats(xs):
    if not xs: return None
    m = sum(xs) / len(xs)
    return {"n": len(xs), "mean_ns": round(m, 1), "rms_ns": round(math.sqrt(sum(x * x for x in xs) / len(xs)), 1),
            "sd_ns": round(math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs)), 1), "max_abs_ns": max(abs(x) for x in xs)}
import os
path = f"{work}/{phase}-chorus-slave.jsonl"
has_chorus = os.path.exists(path)
rows = [json.loads(l) for l in open(path)] if has_chorus else []
lock = next((r["time"] for r in rows if r["servo"] == "s2"), None)
settled = [r for r in rows if lock is not None and r["time"] >= lock + 3]
chorus = stats([r["offset_ns"] for r in settled])
truth = stats([r["clock_offset_ns"] for r in settled if "clock_offset_ns" in r])
first = rows[0]["time"] if rows else None
offs = []
for line in open(f"{work}/{phase}-ptp4l-slave.log"):
    m = re.search(r"master offset\s+(-?\d+) s\d freq\s+([-+]?\d+) path delay\s+(-?\d+)", line)
    if m: offs.append(int(m.group(1)))
ptp4l = stats(offs[2:])
out = {"phase": phase, "seconds": seconds, "log_sync_interval": log_sync,
       "chorus_slave_offset": chorus, "chorus_slave_true_clock_offset": truth,
       "chorus_lock_s": None if lock is None or first is None else round(lock - first, 3),
       "ptp4l_slave_offset": ptp4l}
print(json.dumps(out))
errors = []
if not has_chorus: pass
elif chorus is None or chorus["n"] < 16: errors.append(f"chorus-ptp slave has too few settled samples: {chorus}")
elif abs(chorus["mean_ns"]) >= limit: errors.append(f"chorus-ptp |mean offset| {chorus['mean_ns']} ns >= {limit}")
if truth is not None and abs(truth["mean_ns"]) >= limit: errors.append(f"chorus-ptp true clock offset mean {truth['mean_ns']} ns >= {limit}")
reference = []  # the ptp4l slave's own checks
if ptp4l is None or ptp4l["n"] < 3: reference.append(f"ptp4l slave reported too few offsets: {ptp4l}")
elif abs(ptp4l["mean_ns"]) >= limit: reference.append(f"ptp4l |mean offset| {ptp4l['mean_ns']} ns >= {limit}")
for e in errors + reference: print(f"ptp_interop_test: {phase}: FAILED: {e}", file=sys.stderr)
# Exit 2: only the ptp4l slave of a ptp4l-master phase failed.  There ptp4l
# follows ptp4l beside chorus-ptp, a reference of the machine's quiet, not a
# measure of chorus (in the chorus-master phases its offsets are that measure,
# and fail with 1).
sys.exit(1 if errors or (reference and not has_chorus) else 2 if reference else 0)
EOF
}

# A ptp4l-master phase whose reference (ptp4l following ptp4l) failed while
# chorus-ptp passed saw the machine disturbed (both followers see the same
# spike: a descheduled master, a delayed timestamp): it runs once more, and
# its second result counts.  Nothing else is retried.
run_ptp4l_master_phase() {  # phase-name, chorus-slave flags...
  local phase=$1 rc=0
  shift
  run_phase "$phase" ptp4l "$@"
  analyse "$phase" || rc=$?
  if [[ $rc -eq 2 ]]; then
    echo "ptp_interop_test: $phase: the reference ptp4l slave failed and chorus-ptp passed: the machine was disturbed; running the phase once more" >&2
    rc=0
    run_phase "$phase" ptp4l "$@"
    analyse "$phase" || rc=$?
  fi
  return "$rc"
}

status=0
run_ptp4l_master_phase A-ptp4l-master --inject-offset-ns 1000000 --inject-drift-ppb 50000 || status=1
run_phase B-chorus-master chorus none
analyse B-chorus-master || status=1
# The master role of chorus-ptp must have been taken (not left LISTENING).
grep -q "to MASTER" "$work/B-chorus-master-master.log" || { echo "ptp_interop_test: chorus-ptp never became MASTER" >&2; status=1; }
# ...and says so when linuxptp's pmc asks (Management GET, decoded by pmc).
if [[ -f $work/B-chorus-master-pmc.log ]]; then
  grep -q "portState *MASTER" "$work/B-chorus-master-pmc.log" ||
    { echo "ptp_interop_test: pmc GET PORT_DATA_SET did not show chorus-ptp as MASTER:" >&2; cat "$work/B-chorus-master-pmc.log" >&2; status=1; }
fi
# Hardware timestamping needs a PTP hardware clock, which veth has not: asking
# for it must fail at once, saying why (not run with software stamps).
hw_rc=0
ip netns exec "$ns_m" timeout 10 "$ptp" -i pm --timestamping hardware --duration-s 1 >"$work/hw.out" 2>"$work/hw.err" ||
  hw_rc=$?
if [[ $hw_rc -eq 0 || $hw_rc -eq 124 ]] || ! grep -q "no PTP hardware clock" "$work/hw.err"; then
  echo "ptp_interop_test: --timestamping hardware on veth: expected a prompt 'no PTP hardware clock' error, got rc $hw_rc:" >&2
  cat "$work/hw.err" >&2
  status=1
else
  echo "ptp_interop_test: --timestamping hardware on veth refused: $(head -1 "$work/hw.err")"
fi

# Layer 2 (IEEE 1588 annex F, EtherType 0x88F7), both directions, shorter.
l2=1 phase_seconds=${CHORUS_PTP_L2_SECONDS:-12}
seconds=$phase_seconds run_ptp4l_master_phase C-l2-ptp4l-master || status=1
run_phase D-l2-chorus-master chorus none
seconds=$phase_seconds analyse D-l2-chorus-master || status=1
grep -q "to MASTER" "$work/D-l2-chorus-master-master.log" || { echo "ptp_interop_test: chorus-ptp (L2) never became MASTER" >&2; status=1; }
unset l2 phase_seconds
[[ $status -eq 0 ]] && echo "ptp_interop_test: PASSED"
exit $status
