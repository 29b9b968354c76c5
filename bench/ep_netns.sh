#!/usr/bin/env bash
# MoE dispatch + combine (issue 36) against the same exchange written as
# all-to-all-v, on network-namespace hosts with 1 Gbit/s links:
#
#   bench/ep_netns.sh BUILD_DIR [LAYOUT...]      LAYOUT: HOSTSxRANKS, default 2x2 4x2
#
# Every host is a namespace on one bridge (tests/cluster/netns_lib.sh) with its
# own /dev/shm (shared memory between its ranks, TCP between hosts); its link
# is shaped to 1 Gbit/s both ways (tc tbf on the host's eth0 and on its
# switch port).  chorus-bench dispatch and chorus-bench combine run with
# --form both: the chorusEp* calls and the all-to-all-v formulation in turn
# (paired, the order alternating) at each of $CHORUS_BENCH_REPEATS (3)
# repeats, -c 1 checking both at the first repeat.  The case is issue 36's:
# $CHORUS_EP_TOKENS (4096) tokens x $CHORUS_EP_HIDDEN (7168) bf16 per rank,
# top-8 of 64 experts, node-limited to $CHORUS_EP_MAX_HOSTS (2) hosts.
#
# Then bench/ep_torch_a2a.py, the same exchange with torch.distributed's
# all_to_all_single (gloo), as its own job on the same hosts (CHORUS_EP_TORCH=0
# skips it; CHORUS_EP_CHORUS=0 runs it alone).  Prints per layout and op the median time of each form, each repeat's ratio
# (alltoallv / ep) and the ratio of the sums dispatch + combine; rows go to
# $CHORUS_BENCH_OUT (default bench_ep_netns.jsonl).
#
# Paired A/B of two builds on the same hosts (a code change's effect on the
# networked case): CHORUS_EP_AB=OTHER_BUILD_DIR runs, per layout and op,
# $CHORUS_BENCH_REPEATS rounds of BUILD_DIR's and OTHER's chorus-bench with
# --form ep --repeats 1 (the order alternating: A B, B A, ...) and prints
# each round's times and the ratio A/B with its median; nothing else runs.
# CHORUS_EP_PERF=FILE records a system-wide `perf record -a -g` profile
# (FILE, then FILE.txt: `perf report --sort comm,dso,sym`) around the first
# ep job (CHORUS_EP_FORM=ep|alltoallv|both picks the forms; default both).
# Needs root, ip, tc,
# nsenter, unshare, and memory: at 4096 x 7168 bf16 each rank holds about
# 1.5 GB while the all-to-all-v form runs.
set -euo pipefail

build_dir=${1:?usage: bench/ep_netns.sh BUILD_DIR [HOSTSxRANKS...]}
shift
layouts=("$@")
[[ ${#layouts[@]} -gt 0 ]] || layouts=(2x2 4x2)
build_dir=$(cd "$build_dir" && pwd)
bench=$build_dir/tools/chorus-bench
tokens=${CHORUS_EP_TOKENS:-4096}
hidden=${CHORUS_EP_HIDDEN:-7168}
experts=${CHORUS_EP_EXPERTS:-64}
topk=${CHORUS_EP_TOPK:-8}
max_hosts=${CHORUS_EP_MAX_HOSTS:-2}
dtype=${CHORUS_EP_DTYPE:-bf16}
iters=${CHORUS_BENCH_ITERS:-2}
repeats=${CHORUS_BENCH_REPEATS:-3}
rate=${CHORUS_EP_RATE:-1gbit}
out=${CHORUS_BENCH_OUT:-$PWD/bench_ep_netns.jsonl}
job_timeout=${CHORUS_EP_TIMEOUT:-1800}

test_name=bench/ep_netns.sh
# shellcheck source=../tests/cluster/netns_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/cluster/netns_lib.sh"
cluster_require ip tc unshare nsenter timeout python3 -- "$bench"
# The most hosts any layout needs, made once; a layout uses the first H.
max_h=0
for l in "${layouts[@]}"; do
  h=${l%x*}
  ((h > max_h)) && max_h=$h
done
netns_bench_cluster ep 10.234 "$max_h" $((job_timeout * 8)) 4g
# $rate each way: the host's egress and its switch port's egress.
netns_shape_links "$rate" both

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
add_rows() {
  python3 -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line); r["layout"] = sys.argv[2]; print(json.dumps(r))' "$1" "$2" >>"$out"
}

# run_job OP H K [BENCH [REPEATS [FORM]]]: chorus-bench OP on H hosts x K ranks; rank 0's rows to
# $work/OP.HxK.jsonl.
run_job() {
  local op=$1 h=$2 k=$3 secret r port=$((29800 + RANDOM % 100)) failed=0 world=$(($2 * $3))
  local bench=${4:-$bench} reps=${5:-$repeats} form=${6:-${CHORUS_EP_FORM:-both}}
  secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
  ranks=()
  for r in $(seq 0 $((world - 1))); do
    on_host $((r / k)) \
      env CHORUS_RANK=$r CHORUS_WORLD_SIZE=$world CHORUS_LOCAL_RANK=$((r % k)) CHORUS_MASTER_ADDR="$subnet.1" \
      CHORUS_MASTER_PORT="$port" CHORUS_SECRET="$secret" CHORUS_TIMEOUT_MS=$((job_timeout * 1000)) \
      timeout -k 5 "$job_timeout" "$bench" "$op" --tokens "$tokens" --hidden "$hidden" --experts "$experts" \
      --topk "$topk" --max-hosts "$max_hosts" -d "$dtype" --form "$form" --repeats "$reps" -n "$iters" -w 1 \
      -c 1 --json "$work/$op.${h}x$k.jsonl" >"$work/$op.${h}x$k.$r.out" 2>"$work/$op.${h}x$k.$r.err" </dev/null &
    ranks+=($!)
  done
  for r in "${!ranks[@]}"; do
    if ! wait "${ranks[$r]}"; then
      failed=1
      echo "$test_name: $op ${h}x$k: rank $r failed" >&2
      tail -5 "$work/$op.${h}x$k.$r.err" >&2
    fi
  done
  ranks=()
  cat "$work/$op.${h}x$k.0.out"
  return $failed
}

# run_torch H K: bench/ep_torch_a2a.py (torch's all_to_all_single, gloo) on the same hosts.
run_torch() {
  local h=$1 k=$2 r port=$((29900 + RANDOM % 90)) failed=0 world=$(($1 * $2))
  ranks=()
  for r in $(seq 0 $((world - 1))); do
    on_host $((r / k)) \
      env RANK=$r WORLD_SIZE=$world LOCAL_RANK=$((r % k)) MASTER_ADDR="$subnet.1" MASTER_PORT="$port" \
      GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 \
      timeout -k 5 "$job_timeout" /usr/bin/python3 "$here/ep_torch_a2a.py" --tokens "$tokens" --hidden "$hidden" \
      --experts "$experts" --topk "$topk" --hosts "$h" --max-hosts "$max_hosts" --repeats "$repeats" -n "$iters" \
      -w 1 --json "$work/torch.${h}x$k.jsonl" >"$work/torch.${h}x$k.$r.out" 2>"$work/torch.${h}x$k.$r.err" </dev/null &
    ranks+=($!)
  done
  for r in "${!ranks[@]}"; do
    if ! wait "${ranks[$r]}"; then
      failed=1
      echo "$test_name: torch ${h}x$k: rank $r failed" >&2
      tail -5 "$work/torch.${h}x$k.$r.err" >&2
    fi
  done
  ranks=()
  return $failed
}

: >"$out"
perf_pid=
perf_start() {
  [[ -n ${CHORUS_EP_PERF:-} && ! -e $CHORUS_EP_PERF ]] || return 0
  perf record -a -g -F 499 -o "$CHORUS_EP_PERF" >"$work/perf.log" 2>&1 &
  perf_pid=$!
  sleep 1
}
perf_stop() {
  [[ -n $perf_pid ]] || return 0
  kill -INT "$perf_pid" && wait "$perf_pid" || true
  perf_pid=
  perf report -i "$CHORUS_EP_PERF" --no-children --sort comm,dso,sym --percent-limit 0.5 --stdio \
    >"$CHORUS_EP_PERF.txt" 2>/dev/null || true
}

if [[ -n ${CHORUS_EP_AB:-} ]]; then
  bench_b=$(cd "$CHORUS_EP_AB" && pwd)/tools/chorus-bench
  for l in "${layouts[@]}"; do
    h=${l%x*}
    k=${l#*x}
    for op in ${CHORUS_EP_OPS:-dispatch combine}; do
      ratios=()
      for i in $(seq 1 "$repeats"); do
        order=(A B)
        ((i % 2 == 0)) && order=(B A)
        declare -A t=()
        for which in "${order[@]}"; do
          b=$bench
          [[ $which == B ]] && b=$bench_b
          rm -f "$work/$op.${h}x$k.jsonl"
          run_job "$op" "$h" "$k" "$b" 1 ep >/dev/null
          t[$which]=$(python3 -c 'import json,sys
rows = [json.loads(l) for l in open(sys.argv[1])]
bad = sum(r["wrong"] or 0 for r in rows)
if bad: print(f"bench/ep_netns.sh: {sys.argv[2]}: {bad} wrong elements", file=sys.stderr)
print(rows[-1]["time_us"])' "$work/$op.${h}x$k.jsonl" "$which")
        done
        ratios+=("$(awk -v x="${t[A]}" -v y="${t[B]}" 'BEGIN { printf "%.3f", x / y }')")
        echo "$l $op round $i (${order[*]}): A ${t[A]} us  B ${t[B]} us  A/B ${ratios[-1]}  (load $(cut -d' ' -f1-3 /proc/loadavg))"
        unset t
      done
      printf '%s\n' "${ratios[@]}" | sort -n | awk -v l="$l" -v op="$op" '{ v[NR] = $1 } END {
        printf "%s %s A/B median %s over %d rounds\n", l, op, v[int((NR + 1) / 2)], NR }'
    done
  done
  exit 0
fi

for l in "${layouts[@]}"; do
  h=${l%x*}
  k=${l#*x}
  for op in dispatch combine; do
    [[ ${CHORUS_EP_CHORUS:-1} == 1 ]] || continue
    echo "== $op on $h hosts x $k ranks, $rate links"
    perf_start
    run_job "$op" "$h" "$k"
    perf_stop
    add_rows "$work/$op.${h}x$k.jsonl" "$l"
  done
  if [[ ${CHORUS_EP_TORCH:-1} == 1 && $dtype == bf16 ]]; then
    echo "== torch all_to_all_single on $h hosts x $k ranks"
    run_torch "$h" "$k" && add_rows "$work/torch.${h}x$k.jsonl" "$l"
  fi
done

python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for layout in dict.fromkeys(r["layout"] for r in rows):
    mine = [r for r in rows if r["layout"] == layout]
    t = {}
    for r in mine:
        t.setdefault((r["op"], r["form"]), {})[r["repeat"]] = r["time_us"]
    reps = sorted({r["repeat"] for r in mine})
    r0 = mine[0]
    print(f"\n{layout} (hosts x ranks), {r0['tokens']} tokens x {r0['hidden']} {r0['type']}, top-{r0['topk']} of "
          f"{r0['experts']}, max {r0['max_hosts']} hosts; {len(reps)} paired repeats")
    for op in ("dispatch", "combine"):
        ep, a2a = t.get((op, "ep"), {}), t.get((op, "alltoallv"), {})
        if not ep or not a2a:
            continue
        ratios = [a2a[i] / ep[i] for i in reps if i in ep and i in a2a]
        print(f"  {op:8} ep {statistics.median(ep.values())/1e3:9.1f} ms  alltoallv "
              f"{statistics.median(a2a.values())/1e3:9.1f} ms  alltoallv/ep: median {statistics.median(ratios):.2f} "
              f"(" + " ".join(f"{x:.2f}" for x in ratios) + ")")
    both = []
    for i in reps:
        try:
            both.append((t[("dispatch", "alltoallv")][i] + t[("combine", "alltoallv")][i]) /
                        (t[("dispatch", "ep")][i] + t[("combine", "ep")][i]))
        except KeyError:
            pass
    if both:
        print(f"  dispatch+combine alltoallv/ep: median {statistics.median(both):.2f} (" +
              " ".join(f"{x:.2f}" for x in both) + f"); >= 1.5x in {sum(x >= 1.5 for x in both)} of {len(both)}")
    tt = {op: t.get((op, "torch"), {}) for op in ("dispatch", "combine")}
    if tt["dispatch"] and tt["combine"]:
        tsum = [tt["dispatch"][i] + tt["combine"][i] for i in tt["dispatch"] if i in tt["combine"]]
        line = (f"  torch all_to_all_single (own job, after): dispatch {statistics.median(tt['dispatch'].values())/1e3:.1f} "
                f"ms, combine {statistics.median(tt['combine'].values())/1e3:.1f} ms")
        if ("dispatch", "ep") in t and ("combine", "ep") in t:
            esum = [t[("dispatch", "ep")][i] + t[("combine", "ep")][i] for i in t[("dispatch", "ep")]
                    if i in t[("combine", "ep")]]
            line += f"; dispatch+combine torch / ep (medians): {statistics.median(tsum) / statistics.median(esum):.2f}"
        print(line)
    wrong = [r["wrong"] for r in mine if r["wrong"] is not None]
    print(f"  checked rows: {len(wrong)}, wrong elements: {sum(wrong)}")
PY
