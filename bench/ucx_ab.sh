#!/usr/bin/env bash
# A/B of UCX settings for the UCX transport between two network-namespace
# hosts (issue 38; docs/ucx.md, "Issue 38's goals again"): each variant is a
# label and environment assignments for both ranks; a label starting with
# "tcp" runs chorus's TCP transport, any other CHORUS_TRANSPORT=ucx with
# UCX_TLS=tcp.  The variants run interleaved, $CHORUS_BENCH_REPEATS times
# (default 3); each run's CPU seconds (user, system, wall) of both ranks are
# printed, then per size the median busbw of each variant with the range of
# its per-repeat ratio to the first variant.  The ranks run under
# `nice -n $CHORUS_BENCH_NICE` (default -15) to keep other load off them.
#
#   bench/ucx_ab.sh BUILD_DIR "tcp|" "ucx|" "old|UCX_TCP_RX_SEG_SIZE=64K" ...
#
# $CHORUS_BENCH_SWEEP: the chorus-bench arguments (default: allreduce 4-64 MiB,
# float sum, 10 calls per size).  Needs root, ip, nsenter, unshare and
# /usr/bin/time.
set -euo pipefail

build_dir=${1:?usage: bench/ucx_ab.sh BUILD_DIR \"LABEL|ENV=VALUE ...\" ...}
build_dir=$(cd "$build_dir" && pwd)
shift
[[ $# -gt 0 ]] || { echo "bench/ucx_ab.sh: no variants" >&2; exit 2; }
bench=$build_dir/tools/chorus-bench
repeats=${CHORUS_BENCH_REPEATS:-3}
niceness=${CHORUS_BENCH_NICE:--15}
read -r -a sweep <<<"${CHORUS_BENCH_SWEEP:-allreduce -b 4M -e 64M -f 4 -d float -o sum -c 0 -n 10 -w 2}"

test_name=bench/ucx_ab.sh
# shellcheck source=../tests/cluster/netns_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/cluster/netns_lib.sh"
cluster_require ip unshare nsenter timeout python3 /usr/bin/time -- "$bench"
netns_bench_cluster ucxab 10.235 2 3600
export UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n
echo "each rank inside its host's namespaces: nice -n $niceness env VARIANT CHORUS_TRANSPORT={tcp,ucx} chorus-bench ${sweep[*]}" >&2

rows=$work/rows.jsonl
: >"$rows"
for rep in $(seq 1 "$repeats"); do
  for v in "$@"; do
    label=${v%%|*}
    read -r -a envs <<<"${v#*|}"
    transport=ucx
    [[ $label == tcp* ]] && transport=tcp
    secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
    port=$((29700 + RANDOM % 300))
    ranks=()
    for r in 0 1; do
      on_host $r /usr/bin/time -f "%U %S %e" -o "$work/$label.$rep.$r.cpu" nice -n "$niceness" \
        env "${envs[@]}" CHORUS_RANK=$r CHORUS_WORLD_SIZE=2 CHORUS_LOCAL_RANK=0 CHORUS_MASTER_ADDR="$subnet.1" \
        CHORUS_MASTER_PORT="$port" CHORUS_SECRET="$secret" CHORUS_TRANSPORT="$transport" \
        timeout -k 5 300 "$bench" "${sweep[@]}" --json "$work/$label.$rep.$r.jsonl" \
        >"$work/$label.$rep.$r.out" 2>&1 </dev/null &
      ranks+=($!)
    done
    for r in 0 1; do wait "${ranks[$r]}" || echo "$test_name: $label rank $r failed" >&2; done
    ranks=()
    echo "$label repeat $rep: CPU user sys wall: rank 0 $(tail -1 "$work/$label.$rep.0.cpu"), rank 1 $(tail -1 "$work/$label.$rep.1.cpu")"
    python3 - "$work/$label.$rep.0.jsonl" "$label" "$rep" >>"$rows" <<'PY'
import json, sys
path, label, rep = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    for line in open(path):
        if line.startswith("{"):
            r = json.loads(line)
            if not r.get("inplace"):
                print(json.dumps({"label": label, "repeat": rep, "bytes": r["bytes"], "busbw": r["busbw_gbps"]}))
except OSError:
    pass
PY
  done
done

python3 - "$rows" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
labels = list(dict.fromkeys(r["label"] for r in rows))
d = {}
for r in rows:
    d.setdefault((r["label"], r["bytes"]), {})[r["repeat"]] = r["busbw"]
print(f"\nmedian busbw GB/s (range of each repeat's ratio to {labels[0]})")
print(f"{'bytes':>10}" + "".join(f"{l[:20]:>22}" for l in labels))
for size in sorted({r["bytes"] for r in rows}):
    line = f"{size:>10}"
    base = d.get((labels[0], size), {})
    for l in labels:
        v = d.get((l, size), {})
        ratios = [v[k] / base[k] for k in v if base.get(k)]
        med = statistics.median(v.values()) if v else float("nan")
        rng = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
        line += f"{med:>10.3f} ({rng:>9})"
    print(line)
PY
