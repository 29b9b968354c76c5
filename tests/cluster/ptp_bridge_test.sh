#!/usr/bin/env bash
# chorus-ptp against linuxptp's ptp4l on a bridged network: three network
# namespaces h0, h1, h2 with a veth each into one Linux bridge (a fourth
# namespace holds the bridge, as netns_lib.sh builds clusters).  Software
# timestamps, 16 syncs/s; every daemon reads the same CLOCK_REALTIME, so the
# true offset is 0 and every reported offset is error.
#
#   ptp_bridge_test.sh BUILD_DIR [--long]
#
# Two phases of CHORUS_PTP_BRIDGE_WARMUP + CHORUS_PTP_SECONDS seconds (default
# 12 + 60; --long: 12 + 120), one after the other:
#
#   host  phase A                                phase B
#   h0    ptp4l master (priority1 127)           chorus-ptp --master
#   h1    ptp4l -s  "base_h1"                    ptp4l -s  "p4l_of_chorus"
#   h2    ptp4l -s  "base_h2"  and beside it
#         chorus-ptp --slave "chorus_of_p4l" (virtual clock started 1 ms off
#         and 50 ppm fast)
#
# Why not all at once: two masters in different domains on h0 with two
# followers on h1 (tried first) biased one pair by up to -15 us (a ptp4l
# slave beside another on one interface; with two ptp4l masters the domains
# differed by ~6 us), so the pairs whose masters differ run apart, each
# follower alone on its host but for chorus_of_p4l, which shares h2 with its
# baseline on purpose: both read the same Syncs with the same receive stamps.
#
# What is compared (|offset| as each follower reports it; ptp4l prints one
# Sync's "master offset" per second with freq_est_interval 0, chorus-ptp
# logs every Sync), over the last CHORUS_PTP_SECONDS of each phase:
#
# - p4l_of_chorus (ptp4l following chorus-ptp, h1, phase B) against base_h1
#   (ptp4l following ptp4l, h1, phase A): median |offset| and RMS.
# - chorus_of_p4l against base_h2, paired: for each Sync base_h2 printed, the
#   offset chorus-ptp computed for the same Sync (the last one it received
#   before ptp4l's line); median |offset| and RMS over those pairs.  (Every
#   Sync of chorus-ptp is printed too, not compared: its RMS counts the rare
#   0.1-1 ms delays of a loaded VM that ptp4l's 1-in-16 sample mostly skips.)
#
# Asserts each <= (1 + margin) x the baseline's: for the paired comparison
# the RMS with margin CHORUS_PTP_BRIDGE_PAIRED_MARGIN (0.2) and the median
# |offset| with CHORUS_PTP_BRIDGE_PAIRED_MEDIAN_MARGIN (0.5: a median of the
# ~60 Syncs ptp4l prints moves more than the RMS between runs -- paired
# ratios 0.69-1.09 in the helper's runs, 1.28 in one CI run whose RMS ratio
# was 1.02; RMS ratios stay within 0.93-1.02); for
# the unpaired one median |offset| and the RMS of the 95 % smallest |offset|
# ("rms95": 3 of 60 left out), margin CHORUS_PTP_BRIDGE_MARGIN (0.5) -- its
# two phases see different load on a shared machine, and one burst of
# 40-60 us samples (seen in one phase of one run) doubles a 60-sample RMS
# whichever master it hits; the full RMS is printed.  docs/ptp.md, "Bridged
# network", has the repeated runs behind the margins.  Also: the chorus slave
# locked all through its window, >= 30 ptp4l lines / 300 chorus Syncs.
# Prints one JSON line with every figure.
#
# Until the master's Syncs were moved half an interval off its Announces, a
# ptp4l follower read a chorus master 15-22 us off for a whole phase in 1 of
# 13 runs here (in 4 of 8 of a faster loop): the one Sync per second sent
# right behind an Announce crossed the bridge ~20 us faster than the others,
# and ptp4l prints one Sync per second (docs/ptp.md, "Bridged network").

# Knobs for experiments (not set in CI): CHORUS_PTP_BRIDGE_SLAVE_ARGS adds
# chorus-ptp slave flags (e.g. "--pi-kp-locked 0 --spike-factor 0
# --delay-filter-length 10", the servo and filter before issue 20);
# CHORUS_PTP_BRIDGE_CONTROL=1 puts a ptp4l master in phase B (the spread of
# two equal phases); CHORUS_PTP_BRIDGE_KEEP=1 keeps the logs of a pass too.
#
# Needs root, iproute2 and linuxptp.  Without them it FAILS, unless
# CHORUS_SKIP_CLUSTER=1, then it exits 77 (skipped).  Creates only the
# namespaces chorus-<pid>-{sw,h0,h1,h2} and the addresses 10.78.0.0/24 inside
# them; removes them and every process it started on exit (trap EXIT).
set -euo pipefail

build_dir=${1:?usage: ptp_bridge_test.sh BUILD_DIR [--long]}
build_dir=$(cd "$build_dir" && pwd)
ptp=$build_dir/tools/chorus-ptp
seconds=${CHORUS_PTP_SECONDS:-60}
[[ ${2:-} == --long ]] && seconds=${CHORUS_PTP_SECONDS:-120}
warmup=${CHORUS_PTP_BRIDGE_WARMUP:-12}
margin=${CHORUS_PTP_BRIDGE_MARGIN:-0.5}
paired_margin=${CHORUS_PTP_BRIDGE_PAIRED_MARGIN:-0.2}
paired_median_margin=${CHORUS_PTP_BRIDGE_PAIRED_MEDIAN_MARGIN:-0.5}
log_sync=-4

test_name=ptp_bridge_test
# shellcheck source=netns_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns_lib.sh"
cluster_require ip ptp4l timeout python3 -- "$ptp"

work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-ptp-bridge.XXXXXX")
keepers=()
ranks=()
created_ns=()
keep_logs=${CHORUS_PTP_BRIDGE_KEEP:-}
cleanup() {
  local rc=$?
  if [[ $rc -ne 0 || -n $keep_logs ]]; then
    local saved
    saved=$(mktemp -d "${TMPDIR:-/tmp}/chorus-ptp-bridge-logs.XXXXXX")
    cp -r "$work"/. "$saved"/ 2>/dev/null || true
    echo "$test_name: logs kept in $saved" >&2
  fi
  (exit $rc)
  netns_cleanup
}
trap cleanup EXIT
netns_remove_stale

tag=chorus-$$
hosts=("$tag-h0" "$tag-h1" "$tag-h2")
netns_make_hosts "$tag-sw" 10.78.0 "${hosts[@]}"

# Daemons sharing an interface share its MAC-derived identity: each gets one of
# its own.  summary_interval -4 prints every estimate (once per second with
# freq_est_interval 0) instead of a summary.
# ptp4l's moving median of 10 path-delay samples on every daemon (the bridge's
# path delay jitters; netns_lib.sh's ptp4l_cfg writes the common lines).
filter_lines=("delay_filter moving_median" "delay_filter_length 10")
slave_lines=("${filter_lines[@]}" "slaveOnly 1" "freq_est_interval 0" "summary_interval $log_sync")
ptp4l_cfg master "${filter_lines[@]}" "priority1 127" "clockIdentity 020000.fffe.0000a0"
ptp4l_cfg base_h1 "${slave_lines[@]}" "clockIdentity 020000.fffe.0000b1"
ptp4l_cfg base_h2 "${slave_lines[@]}" "clockIdentity 020000.fffe.0000b2"
ptp4l_cfg p4l_of_chorus "${slave_lines[@]}" "clockIdentity 020000.fffe.0000c1"

run_s=$((warmup + seconds + 2))
start_ptp4l() {  # name, host index
  ip netns exec "${hosts[$2]}" timeout $((run_s + 5)) ptp4l -i eth0 -S -m -f "$work/$1.cfg" >"$work/$1.log" 2>&1 &
  ranks+=($!)
}
# Each follower's window starts at its phase's start (CLOCK_MONOTONIC, as
# ptp4l's log prefix, and CLOCK_REALTIME, as chorus-ptp's Sync times).
mark_start() {
  python3 -c 'import time; print(time.clock_gettime(time.CLOCK_MONOTONIC), time.time())' >"$work/$1.t0"
}
# Runs the daemons started before it for run_s seconds (a bounded wait; a
# daemon that exits early fails the test), then stops them.
run_phase() {
  local end=$((SECONDS + run_s)) p
  while ((SECONDS < end)); do
    for p in "${ranks[@]}"; do
      kill -0 "$p" 2>/dev/null && continue
      # chorus-ptp's --duration-s may end it a moment before the loop does.
      [[ $p == "${chorus_pid:-}" ]] && ((SECONDS >= end - 2)) && continue
      echo "$test_name: FAILED: $1: a daemon (pid $p) exited early; logs:" >&2
      tail -n 5 "$work"/*.log >&2
      exit 1
    done
    sleep 1
  done
  for p in "${ranks[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${ranks[@]}"; do wait "$p" 2>/dev/null || true; done
  ranks=()
}

# Phase A: ptp4l master on h0, followed by ptp4l on h1 and on h2, and by
# chorus-ptp on h2.
mark_start base_h1
cp "$work/base_h1.t0" "$work/base_h2.t0"
cp "$work/base_h1.t0" "$work/chorus_of_p4l.t0"
start_ptp4l master 0
start_ptp4l base_h1 1
start_ptp4l base_h2 2
ip netns exec "${hosts[2]}" timeout $((run_s + 5)) "$ptp" -i eth0 --slave \
  --log-min-delay-req-interval $log_sync --inject-offset-ns 1000000 --inject-drift-ppb 50000 \
  --json-log "$work/chorus_of_p4l.jsonl" --duration-s "$run_s" ${CHORUS_PTP_BRIDGE_SLAVE_ARGS:-} \
  >"$work/chorus_of_p4l.json" 2>"$work/chorus_of_p4l.log" &
chorus_pid=$!
ranks+=($chorus_pid)
run_phase A

# Phase B: chorus-ptp master on h0, followed by ptp4l on h1 (configured as
# the baseline, but for its identity).
# CHORUS_PTP_BRIDGE_CONTROL=1 runs a ptp4l master here instead: a control
# run that measures how far two phases with equal masters differ (docs/ptp.md).
mark_start p4l_of_chorus
chorus_pid=
if [[ ${CHORUS_PTP_BRIDGE_CONTROL:-0} == 1 ]]; then
  start_ptp4l master 0
else
  ip netns exec "${hosts[0]}" timeout $((run_s + 5)) "$ptp" -i eth0 --master \
    --log-sync-interval $log_sync --log-announce-interval 0 --log-min-delay-req-interval $log_sync \
    --duration-s $((run_s + 1)) >"$work/chorus_master.json" 2>"$work/chorus_master.log" &
  ranks+=($!)
fi
start_ptp4l p4l_of_chorus 1
run_phase B
if [[ ${CHORUS_PTP_BRIDGE_CONTROL:-0} != 1 ]]; then
  grep -q "to MASTER" "$work/chorus_master.log" ||
    { echo "$test_name: FAILED: chorus-ptp never became MASTER" >&2; cat "$work/chorus_master.log" >&2; exit 1; }
fi

python3 - "$work" "$warmup" "$seconds" "$margin" "$paired_margin" "$paired_median_margin" <<'EOF'
import bisect, json, math, re, sys
work, warmup, seconds, margin = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
paired_margin, paired_median_margin = float(sys.argv[5]), float(sys.argv[6])
def t0(name):  # (CLOCK_MONOTONIC, CLOCK_REALTIME) at the start of the follower's phase
    mono, real = open(f"{work}/{name}.t0").read().split()
    return float(mono), float(real)

def stats(xs):
    if not xs:
        return None
    a = sorted(abs(x) for x in xs)
    n = len(a)
    med = a[n // 2] if n % 2 else (a[n // 2 - 1] + a[n // 2]) / 2
    # rms95: the RMS of the 95 % smallest |offset| (3 of 60 left out).
    k = max(1, math.ceil(0.95 * n))
    return {"n": n, "median_abs_ns": round(med, 1), "rms_ns": round(math.sqrt(sum(x * x for x in xs) / n), 1),
            "rms95_ns": round(math.sqrt(sum(x * x for x in a[:k]) / k), 1),
            "mean_ns": round(sum(xs) / n, 1), "max_abs_ns": a[-1]}

def ptp4l(name):
    # "ptp4l[1234.567]: [tag] master offset -123 s0 freq +0 path delay 456"; the
    # bracket is CLOCK_MONOTONIC seconds.  Returns [(mono_s, offset, delay)].
    t0_mono = t0(name)[0]
    lines = []
    for line in open(f"{work}/{name}.log"):
        m = re.search(r"\[(\d+\.\d+)\].*master offset\s+(-?\d+) s\d freq\s+[-+]?\d+ path delay\s+(-?\d+)", line)
        if m and t0_mono + warmup <= float(m.group(1)) < t0_mono + warmup + seconds:
            lines.append((float(m.group(1)), int(m.group(2)), int(m.group(3))))
    return lines

def with_delay(lines):
    s = stats([o for _, o, _ in lines])
    if s:
        s["path_delay_ns"] = round(sum(d for _, _, d in lines) / len(lines), 1)
    return s

out = {"seconds": seconds, "warmup_s": warmup, "margin": margin, "paired_margin": paired_margin,
       "paired_median_margin": paired_median_margin}
lines = {name: ptp4l(name) for name in ("base_h1", "base_h2", "p4l_of_chorus")}
for name, l in lines.items():
    out[name] = with_delay(l)
mono0, real0 = t0("chorus_of_p4l")
rows = [json.loads(l) for l in open(f"{work}/chorus_of_p4l.jsonl")]
win = [r for r in rows if real0 + warmup <= r["time"] < real0 + warmup + seconds]
out["chorus_of_p4l_every_sync"] = stats([r["offset_ns"] for r in win])
if win:
    out["chorus_of_p4l_every_sync"]["unlocked"] = sum(1 for r in win if r["servo"] != "s2")
out["chorus_of_p4l_true_error"] = stats([r["clock_offset_ns"] for r in win if "clock_offset_ns" in r])
# Pairs: ptp4l prints a Sync's offset when its Follow_Up has come, well
# under a Sync interval (62.5 ms) after the Sync; the chorus sample of that
# Sync is the last one received before the line.  The line's CLOCK_MONOTONIC
# time (printed truncated to 1 ms, hence + 1 ms) is moved to CLOCK_REALTIME
# by the phase's (mono, real) reading; chorus's "time" is its Sync receive
# stamp on its clock, microseconds from CLOCK_REALTIME once locked.
times = [r["time"] for r in win]
pairs = []
for mono, off, _ in lines["base_h2"]:
    at = mono + 0.001 - mono0 + real0
    k = bisect.bisect_right(times, at) - 1
    if k >= 0 and at - times[k] < 0.03:
        pairs.append((win[k]["offset_ns"], off))
out["chorus_of_p4l_paired"] = stats([c for c, _ in pairs])
out["base_h2_paired"] = stats([b for _, b in pairs])
print(json.dumps(out))

errors = []
def check(name, base, min_n, margin, keys):
    a, b = out.get(name), out.get(base)
    if a is None or a["n"] < min_n:
        errors.append(f"{name}: too few samples in the window: {a}")
        return
    if b is None or b["n"] < 30:
        errors.append(f"{base}: too few samples in the window: {b}")
        return
    for key in keys:
        limit = (1 + margin) * b[key]
        verdict = "ok" if a[key] <= limit else "FAILED"
        print(f"ptp_bridge_test: {name} {key} {a[key]} vs {base} {b[key]} (limit {limit:.0f}): {verdict}")
        if a[key] > limit:
            errors.append(f"{name} {key} {a[key]} > (1 + {margin}) x {base}'s {b[key]}")
check("p4l_of_chorus", "base_h1", 30, margin, ("median_abs_ns", "rms95_ns"))
check("chorus_of_p4l_paired", "base_h2_paired", 30, paired_median_margin, ("median_abs_ns",))
check("chorus_of_p4l_paired", "base_h2_paired", 30, paired_margin, ("rms_ns",))
every = out.get("chorus_of_p4l_every_sync")
if every is None or every["n"] < 300:
    errors.append(f"chorus-ptp slave has too few Syncs in the window: {every}")
elif every["unlocked"]:
    errors.append(f"chorus-ptp slave left the locked state {every['unlocked']} times in the window")
for e in errors:
    print(f"ptp_bridge_test: FAILED: {e}", file=sys.stderr)
sys.exit(1 if errors else 0)
EOF
echo "$test_name: PASSED"
