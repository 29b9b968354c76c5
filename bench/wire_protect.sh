#!/usr/bin/env bash
# CHORUS_WIRE_PROTECT's cost (issue 43): allreduce busbw with the TCP
# transport's bytes as they are (off), sealed with a MAC (mac) and encrypted
# (encrypt), side by side, interleaved, on
#   - two network-namespace hosts, one rank each, every host's egress shaped
#     to 1 Gbit/s (tc tbf), and
#   - loopback, 2 ranks forced onto TCP (CHORUS_TRANSPORT=tcp),
#
#   bench/wire_protect.sh BUILD_DIR
#
# $CHORUS_BENCH_SETUPS (default "netns loopback") picks the setups;
# $CHORUS_BENCH_ITERS (default 20) timed calls per size;
# $CHORUS_BENCH_REPEATS (default 3) repeats, the modes in a rotating order per
# repeat; prints median busbw per size and mode, each repeat's ratio to off,
# and whether encrypt >= 0.9x off held at every size >= 1 MiB in each repeat.
# Rows go to $CHORUS_BENCH_OUT (default bench_wire_protect.jsonl).  Needs root,
# ip, tc, nsenter, unshare (the netns part; loopback runs without).
set -euo pipefail

build_dir=${1:?usage: bench/wire_protect.sh BUILD_DIR}
build_dir=$(cd "$build_dir" && pwd)
bench=$build_dir/tools/chorus-bench
run=$build_dir/tools/chorus-run
sizes=${CHORUS_BENCH_SIZES:-1M:16M}
iters=${CHORUS_BENCH_ITERS:-20}
repeats=${CHORUS_BENCH_REPEATS:-3}
setups=${CHORUS_BENCH_SETUPS:-netns loopback}
out=${CHORUS_BENCH_OUT:-$PWD/bench_wire_protect.jsonl}
job_timeout=300

test_name=bench/wire_protect.sh
# shellcheck source=../tests/cluster/netns_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/cluster/netns_lib.sh"
cluster_require ip tc unshare nsenter timeout python3 -- "$bench"
netns_bench_cluster wire 10.233 2 $((job_timeout * 8))
netns_shape_links 1gbit

bench_args=(allreduce -b "${sizes%:*}" -e "${sizes#*:}" -f 2 -n "$iters" -w 2 --warmup-ms 500)

# run_netns MODE REPEAT: one rank per host; rank 0's rows to $work/netns.MODE.REPEAT.jsonl.
run_netns() {
  local mode=$1 rep=$2 secret r port=$((29700 + RANDOM % 300)) failed=0
  secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
  ranks=()
  for r in 0 1; do
    on_host "$r" \
      env CHORUS_RANK=$r CHORUS_WORLD_SIZE=2 CHORUS_LOCAL_RANK=0 CHORUS_MASTER_ADDR="$subnet.1" \
      CHORUS_MASTER_PORT="$port" CHORUS_SECRET="$secret" CHORUS_WIRE_PROTECT="$mode" \
      timeout -k 5 "$job_timeout" "$bench" "${bench_args[@]}" --json "$work/netns.$mode.$rep.$r.jsonl" \
      >"$work/netns.$mode.$rep.$r.out" 2>"$work/netns.$mode.$rep.$r.err" </dev/null &
    ranks+=($!)
  done
  for r in 0 1; do
    if ! wait "${ranks[$r]}"; then
      failed=1
      echo "$test_name: netns $mode: rank $r failed" >&2
      tail -5 "$work/netns.$mode.$rep.$r.err" >&2
    fi
  done
  ranks=()
  return $failed
}

run_loopback() {
  local mode=$1 rep=$2
  CHORUS_TRANSPORT=tcp CHORUS_WIRE_PROTECT="$mode" timeout -k 5 "$job_timeout" "$run" -n 2 -- \
    "$bench" "${bench_args[@]}" --json "$work/loopback.$mode.$rep.jsonl" >"$work/loopback.$mode.$rep.out" 2>&1
}

: >"$out"
modes=(off mac encrypt)
for setup in $setups; do
  for rep in $(seq 1 "$repeats"); do
    for k in 0 1 2; do
      mode=${modes[$(((rep - 1 + k) % 3))]}
      if [[ $setup == netns ]]; then
        run_netns "$mode" "$rep"
        rows=$work/netns.$mode.$rep.0.jsonl
      else
        run_loopback "$mode" "$rep"
        rows=$(ls "$work"/loopback."$mode"."$rep".jsonl* | head -1)
      fi
      python3 - "$rows" "$setup" "$mode" "$rep" >>"$out" <<'PY'
import json, sys
path, setup, mode, rep = sys.argv[1:5]
for line in open(path):
    if line.startswith("{"):
        row = json.loads(line)
        if row.get("rank", 0) == 0:
            row.update(setup=setup, protect=mode, repeat=int(rep))
            print(json.dumps(row))
PY
    done
  done
done

python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = [r for r in rows if not r.get("inplace")]
for setup in ("netns", "loopback"):
    mine = [r for r in rows if r["setup"] == setup]
    if not mine:
        continue
    reps = sorted({r["repeat"] for r in mine})
    bw = {}
    for r in mine:
        bw.setdefault((r["protect"], r["bytes"]), {})[r["repeat"]] = r["busbw_gbps"]
    what = "2 netns hosts x 1 rank, 1 Gbit/s per host" if setup == "netns" else "loopback, 2 ranks over TCP"
    print(f"\nallreduce, {what}, {len(reps)} interleaved repeats: median busbw GB/s (median ratio to off; each repeat's)")
    print(f"{'bytes':>10} {'off':>8} {'mac':>30} {'encrypt':>30}")
    held = [True] * len(reps)
    for size in sorted({r["bytes"] for r in mine}):
        base = bw.get(("off", size), {})
        cells = []
        for mode in ("mac", "encrypt"):
            got = bw.get((mode, size), {})
            ups = [got[r] / base[r] if r in got and base.get(r) else None for r in reps]
            if mode == "encrypt" and size >= 1 << 20:
                for i, u in enumerate(ups):
                    if u is None or u < 0.9:
                        held[i] = False
            known = [u for u in ups if u is not None]
            cells.append(f"{statistics.median(got.values()):8.3f} ({statistics.median(known):.2f}x; "
                         + " ".join(f"{u:.2f}" for u in known) + ")" if known else "-")
        print(f"{size:>10} {statistics.median(base.values()) if base else 0:8.3f} {cells[0]:>30} {cells[1]:>30}")
    print(f"{setup}: encrypt >= 0.9x off at every size >= 1 MiB: held in {sum(held)} of {len(reps)} repeats")
PY
