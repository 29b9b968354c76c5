#!/usr/bin/env bash
# The UCX transport between two network-namespace hosts (issue 38's speed
# goals), paired and interleaved:
#   - allreduce busbw, chorus-ucx (CHORUS_TRANSPORT=ucx, UCX_TLS=tcp) against
#     chorus-tcp (chorus's own TCP transport), 1 rank per host, 1..64 MiB;
#   - 8-byte latency: chorus-ucx's (and chorus-tcp's) 8 B allreduce time
#     against `ucx_perftest -t tag_lat -s 8` (UCX_TLS=tcp) on the same pair of
#     hosts: the floor UCX itself sets.
#
#   bench/ucx_netns.sh BUILD_DIR
#
# $CHORUS_BENCH_REPEATS (default 3) repeats; in each, the three runs (tcp,
# ucx, perftest) in an order rotated per repeat.  Prints the median busbw per
# size and transport with each repeat's ucx/tcp ratio, whether ucx >= 0.9x
# tcp held at every size in each repeat, and the latencies with each repeat's
# chorus-ucx / ucx_perftest ratio and whether it stayed <= 1.2 (against
# ucx_perftest's typical latency, its median; its mean is printed too, since
# chorus-bench reports a mean), and the CPU seconds (user + system, both ranks)
# each transport's sweep took (with /usr/bin/time: on two cores the sweep is
# CPU-bound, so the CPU per byte bounds the busbw ratio).  Rows go to
# $CHORUS_BENCH_OUT (default bench_ucx_netns.jsonl).  The hosts' links are
# not shaped (veth: the two ranks' CPUs are the bound).  Needs root, ip,
# nsenter, unshare and ucx_perftest (ucx-utils).
set -euo pipefail

build_dir=${1:?usage: bench/ucx_netns.sh BUILD_DIR}
build_dir=$(cd "$build_dir" && pwd)
bench=$build_dir/tools/chorus-bench
repeats=${CHORUS_BENCH_REPEATS:-3}
iters=${CHORUS_BENCH_ITERS:-10}
lat_iters=${CHORUS_BENCH_LAT_ITERS:-5000}
out=${CHORUS_BENCH_OUT:-$PWD/bench_ucx_netns.jsonl}
job_timeout=300

test_name=bench/ucx_netns.sh
# shellcheck source=../tests/cluster/netns_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/cluster/netns_lib.sh"
cluster_require ip unshare nsenter timeout python3 ucx_perftest -- "$bench"
netns_bench_cluster ucxb 10.234 2 $((job_timeout * 12))
export UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n

# run_chorus TRANSPORT NAME REPEAT ARGS...: one rank per host; rank 0's rows
# to $work/NAME.TRANSPORT.REPEAT.jsonl.
run_chorus() {
  local transport=$1 name=$2 rep=$3 secret r port=$((29700 + RANDOM % 300)) failed=0
  shift 3
  secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
  ranks=()
  for r in 0 1; do
    local timed=()
    [[ -x /usr/bin/time ]] && timed=(/usr/bin/time -f "%U %S" -o "$work/$name.$transport.$rep.$r.cpu")
    on_host $r "${timed[@]}" env CHORUS_RANK=$r CHORUS_WORLD_SIZE=2 CHORUS_LOCAL_RANK=0 CHORUS_MASTER_ADDR="$subnet.1" \
      CHORUS_MASTER_PORT="$port" CHORUS_SECRET="$secret" CHORUS_TRANSPORT="$transport" \
      timeout -k 5 "$job_timeout" "$bench" "$@" --json "$work/$name.$transport.$rep.$r.jsonl" \
      >"$work/$name.$transport.$rep.$r.out" 2>"$work/$name.$transport.$rep.$r.err" </dev/null &
    ranks+=($!)
  done
  for r in 0 1; do
    if ! wait "${ranks[$r]}"; then
      failed=1
      echo "$test_name: $name $transport: rank $r failed" >&2
      tail -5 "$work/$name.$transport.$rep.$r.err" >&2
    fi
  done
  ranks=()
  return $failed
}

# run_perftest REPEAT: ucx_perftest's server on host 1, its client on host 0;
# prints the client's output to $work/perftest.REPEAT.out.
run_perftest() {
  local rep=$1 port=$((13300 + RANDOM % 300)) server
  on_host 1 timeout -k 5 120 ucx_perftest -p "$port" >"$work/perftest.$rep.server" 2>&1 </dev/null &
  server=$!
  ranks=("$server")
  sleep 1
  on_host 0 timeout -k 5 120 ucx_perftest "$subnet.2" -p "$port" -t tag_lat -s 8 -n 20000 -w 1000 \
    >"$work/perftest.$rep.out" 2>&1 </dev/null || { echo "$test_name: ucx_perftest failed" >&2; cat "$work/perftest.$rep.out" >&2; }
  wait "$server" || true
  ranks=()
}

sweep=(allreduce -b 1M -e 64M -f 2 -d float -o sum -c 1 -n "$iters" -w 2)
lat=(allreduce -b 8 -e 8 -d float -o sum -c 0 -n "$lat_iters" -w 200)
echo "commands (each rank inside its host's namespaces, CHORUS_RANK/WORLD_SIZE/MASTER_*/SECRET set, UCX_TLS=tcp):" >&2
echo "  CHORUS_TRANSPORT={tcp,ucx} chorus-bench ${sweep[*]}" >&2
echo "  CHORUS_TRANSPORT={tcp,ucx} chorus-bench ${lat[*]}" >&2
echo "  host 1: ucx_perftest -p PORT; host 0: ucx_perftest HOST1 -p PORT -t tag_lat -s 8 -n 20000 -w 1000" >&2

: >"$out"
order=(tcp ucx perftest)
for rep in $(seq 1 "$repeats"); do
  for k in 0 1 2; do
    what=${order[$(((rep - 1 + k) % 3))]}
    if [[ $what == perftest ]]; then
      run_perftest "$rep"
      python3 - "$work/perftest.$rep.out" "$rep" >>"$out" <<'PY'
import json, re, sys
path, rep = sys.argv[1], int(sys.argv[2])
# The final line of ucx_perftest's table: "Final: n  lat_typical lat_avg lat_overall ..." (usec).
for line in open(path):
    m = re.match(r"\s*Final:\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", line)
    if m:
        print(json.dumps({"kind": "perftest", "repeat": rep, "iters": int(m.group(1)),
                          "typical_us": float(m.group(2)), "avg_us": float(m.group(3)),
                          "overall_us": float(m.group(4))}))
PY
      continue
    fi
    run_chorus "$what" sweep "$rep" "${sweep[@]}" || true
    run_chorus "$what" lat "$rep" "${lat[@]}" || true
    python3 - "$work" "$what" "$rep" >>"$out" <<'PY'
import json, sys
work, transport, rep = sys.argv[1], sys.argv[2], int(sys.argv[3])
cpu = 0.0
try:
    for r in (0, 1):
        u, s = open(f"{work}/sweep.{transport}.{rep}.{r}.cpu").read().split()[-2:]
        cpu += float(u) + float(s)
    print(json.dumps({"kind": "cpu", "transport": transport, "repeat": rep, "sweep_cpu_s": cpu}))
except (OSError, ValueError):
    pass
for name in ("sweep", "lat"):
    try:
        lines = open(f"{work}/{name}.{transport}.{rep}.0.jsonl").read().splitlines()
    except OSError:
        continue
    for line in lines:
        if line.startswith("{"):
            row = json.loads(line)
            if not row.get("inplace"):
                row.update(kind=name, transport=transport, repeat=rep)
                print(json.dumps(row))
PY
  done
done

python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
reps = sorted({r["repeat"] for r in rows})
bw = {}
for r in rows:
    if r["kind"] == "sweep":
        bw.setdefault((r["transport"], r["bytes"]), {})[r["repeat"]] = r["busbw_gbps"]
print(f"\nallreduce, 2 netns hosts x 1 rank (UCX_TLS=tcp), {len(reps)} interleaved repeats: "
      "median busbw GB/s (ucx/tcp: median; each repeat's)")
print(f"{'bytes':>10} {'tcp':>8} {'ucx':>8}   ratio")
held = {r: True for r in reps}
for size in sorted({b for (_, b) in bw}):
    t, u = bw.get(("tcp", size), {}), bw.get(("ucx", size), {})
    ratios = {r: u[r] / t[r] for r in reps if r in u and t.get(r)}
    for r in reps:
        if ratios.get(r, 0) < 0.9:
            held[r] = False
    med = lambda d: statistics.median(d.values()) if d else float("nan")
    print(f"{size:>10} {med(t):8.3f} {med(u):8.3f}   {med(ratios):.2f} ("
          + " ".join(f"{ratios[r]:.2f}" for r in sorted(ratios)) + ")")
print(f"ucx >= 0.9x tcp at every size: held in {sum(held.values())} of {len(reps)} repeats")
lat = {}
for r in rows:
    if r["kind"] == "lat":
        lat.setdefault(r["transport"], {})[r["repeat"]] = r["time_us"]
perf = {r["repeat"]: r["typical_us"] for r in rows if r["kind"] == "perftest"}
perf_avg = {r["repeat"]: r["avg_us"] for r in rows if r["kind"] == "perftest"}
print("\n8 B: chorus allreduce time (us; the slower rank's mean) and ucx_perftest tag_lat typical one-way latency (us)")
for r in reps:
    u, t, p = lat.get("ucx", {}).get(r), lat.get("tcp", {}).get(r), perf.get(r)
    ratio = f"{u / p:.2f}" if u and p else "-"
    pa = perf_avg.get(r)
    ratio_avg = f"{u / pa:.2f}" if u and pa else "-"
    f = lambda x: f"{x:.2f}" if x else "-"
    print(f"  repeat {r}: chorus-ucx {f(u)}, chorus-tcp {f(t)}, ucx_perftest {f(p)} (mean {f(pa)}): chorus-ucx / perftest "
          f"{ratio} (/ its mean {ratio_avg})")
ok = sum(1 for r in reps if lat.get("ucx", {}).get(r) and perf.get(r) and lat["ucx"][r] <= 1.2 * perf[r])
print(f"chorus-ucx 8 B within 1.2x of ucx_perftest: held in {ok} of {len(reps)} repeats")
cpu = {}
for r in rows:
    if r["kind"] == "cpu":
        cpu.setdefault(r["transport"], {})[r["repeat"]] = r["sweep_cpu_s"]
if cpu:
    print("\nCPU seconds (user + system, both ranks) of each sweep:")
    for r in reps:
        u, t = cpu.get("ucx", {}).get(r), cpu.get("tcp", {}).get(r)
        ratio = f"{t / u:.2f}" if u and t else "-"
        print(f"  repeat {r}: chorus-tcp {t:.2f}, chorus-ucx {u:.2f}: tcp / ucx {ratio}" if u and t else
              f"  repeat {r}: chorus-tcp {t}, chorus-ucx {u}: tcp / ucx {ratio}")
PY
