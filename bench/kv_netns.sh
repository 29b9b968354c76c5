#!/usr/bin/env bash
# KV-cache transfers (issue 37) between two network-namespace hosts whose
# link is shaped with tc tbf:
#
#   bench/kv_netns.sh BUILD_DIR [bench|serve|all]      (default all)
#
# Both hosts are namespaces on one bridge (tests/cluster/netns_lib.sh), each
# with its own /dev/shm, so the KV engine's pair transport is TCP; each
# host's link is shaped to $CHORUS_KV_RATE (default 200mbit) both ways (tbf on
# the host's eth0 and on its switch port, as bench/ep_netns.sh).
#
# bench: chorus-bench kv, rank 0 (the prefill agent) on host 0 and rank 1 (the
#   decode agent) on host 1: blocks of $CHORUS_KV_SIZES (-b 64K -e 1M -f 4) in
#   batches of $CHORUS_KV_BLOCKS (16), $CHORUS_KV_LAYERS (32) layers, layer- and block-major,
#   $CHORUS_KV_BENCH_ARGS appended (e.g. --tp-prefill 2 --tp-decode 1),
#   write and read, -c 1 (every byte checked).  $CHORUS_BENCH_REPEATS (3) runs
#   one after the other, each running every row in turn (so the repeats of a
#   row are interleaved with the other rows); prints per row the median over
#   the repeats of the mean time per batch, the bandwidth, and the link's
#   bound (bytes / rate).
# serve: python -m chorus.kv_disagg, the prefill process on host 0 and the
#   decode process on host 1, $CHORUS_BENCH_REPEATS times, every run's tokens
#   and logits compared with a one-process run (`single`) made first; prints
#   each run's TTFT and ITL (median, p90) and their medians over the runs.
#   The workload: $CHORUS_KV_SERVE_ARGS (default: 24 requests at 1/s, 128
#   prompt + 32 output tokens).
#
# Rows go to $CHORUS_BENCH_OUT (default bench_kv_netns.jsonl).  Needs root, ip,
# tc, nsenter, unshare.  The load average is printed first: the figures are
# only as quiet as the machine.
set -euo pipefail

build_dir=${1:?usage: bench/kv_netns.sh BUILD_DIR [bench|serve|all]}
what=${2:-all}
build_dir=$(cd "$build_dir" && pwd)
bench=$build_dir/tools/chorus-bench
rate=${CHORUS_KV_RATE:-200mbit}
sizes=${CHORUS_KV_SIZES:--b 64K -e 1M -f 4}
blocks=${CHORUS_KV_BLOCKS:-16}
extra=${CHORUS_KV_BENCH_ARGS:-}  # more chorus-bench kv flags, e.g. --tp-prefill 2 --tp-decode 1
repeats=${CHORUS_BENCH_REPEATS:-3}
serve_args=${CHORUS_KV_SERVE_ARGS:---requests 24 --rate 1 --input 128 --output 32}
out=${CHORUS_BENCH_OUT:-$PWD/bench_kv_netns.jsonl}
job_timeout=${CHORUS_KV_TIMEOUT:-600}

test_name=bench/kv_netns.sh
# shellcheck source=../tests/cluster/netns_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/cluster/netns_lib.sh"
if [[ $what == serve ]]; then
  cluster_require ip tc unshare nsenter timeout python3 --
else
  cluster_require ip tc unshare nsenter timeout python3 -- "$bench"
fi
netns_bench_cluster kv 10.235 2 $((job_timeout * 8))
netns_shape_links "$rate" both
echo "# $test_name: link $rate (tbf both ways), load average $(cut -d' ' -f1-3 /proc/loadavg), $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) cores, KV engine progress ${CHORUS_KV_PROGRESS:-thread}"

# wait_ranks NAME: waits for $ranks; prints the failures' stderr.
wait_ranks() {
  local r failed=0
  for r in "${!ranks[@]}"; do
    if ! wait "${ranks[$r]}"; then
      failed=1
      echo "$test_name: $1: process $r failed" >&2
      tail -5 "$work/$1.$r.err" >&2
    fi
  done
  ranks=()
  return $failed
}

run_bench() {  # run_bench REPEAT
  local rep=$1 r secret port=$((29700 + RANDOM % 100))
  secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
  for r in 0 1; do
    # shellcheck disable=SC2086 # $sizes is a list of flags
    on_host "$r" \
      env CHORUS_RANK=$r CHORUS_WORLD_SIZE=2 CHORUS_LOCAL_RANK=0 CHORUS_MASTER_ADDR="$subnet.1" \
      CHORUS_MASTER_PORT="$port" CHORUS_SECRET="$secret" CHORUS_TIMEOUT_MS=$((job_timeout * 1000)) \
      timeout -k 5 "$job_timeout" "$bench" kv $sizes --blocks "$blocks" --layers "${CHORUS_KV_LAYERS:-32}" -n 5 -w 1 -c 1 $extra \
      --json "$work/bench.$rep.jsonl" >"$work/bench$rep.$r.out" 2>"$work/bench$rep.$r.err" </dev/null &
    ranks+=($!)
  done
  wait_ranks "bench$rep"
  cat "$work/bench$rep.0.out"
}

run_serve() {  # run_serve REPEAT
  local rep=$1 r role
  rm -f "$work/uid"
  for r in 0 1; do
    role=$([[ $r == 0 ]] && echo prefill || echo decode)
    # shellcheck disable=SC2086 # $serve_args is a list of flags
    on_host "$r" \
      env PYTHONPATH="$build_dir/python" OMP_NUM_THREADS=1 CHORUS_TIMEOUT_MS=$((job_timeout * 1000)) \
      timeout -k 5 "$job_timeout" /usr/bin/python3 -m chorus.kv_disagg "$role" $serve_args --uid-file "$work/uid" \
      --timeout "$job_timeout" --out "$work/serve.$rep.$role.json" \
      $([[ $r == 1 ]] && echo --ref "$work/ref.json") >"$work/serve$rep.$r.out" 2>"$work/serve$rep.$r.err" </dev/null &
    ranks+=($!)
  done
  wait_ranks "serve$rep"
  tail -1 "$work/serve$rep.1.err"
}

: >"$out"
if [[ $what == bench || $what == all ]]; then
  for rep in $(seq 1 "$repeats"); do run_bench "$rep"; done
  python3 - "$rate" "$out" "$work"/bench.*.jsonl <<'EOF'
import json, re, statistics, sys
rate, out, files = sys.argv[1], sys.argv[2], sys.argv[3:]
m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate)
bps = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8
rows = {}
with open(out, "a") as o:
    for rep, f in enumerate(files):
        for line in open(f):
            r = json.loads(line)
            r.update(repeat=rep + 1, link=rate, where="netns")
            o.write(json.dumps(r) + "\n")
            rows.setdefault((r["bytes"], r["layout"], r["kv_op"]), []).append(r)
print(f"# chorus-bench kv, medians of {len(files)} repeats; bound = bytes / {rate}")
print(f"# {'size(B)':>10} {'layout':>6} {'op':>5} {'time(us)':>10} {'GB/s':>8} {'bound(us)':>10} {'of bound':>8} {'wrong':>5}")
for (size, layout, op), rs in sorted(rows.items()):
    t = statistics.median(r["time_us"] for r in rs)
    bound = size / bps * 1e6
    print(f"  {size:>10} {layout:>6} {op:>5} {t:>10.0f} {size / t / 1e3:>8.4f} {bound:>10.0f} {bound / t:>8.2f} "
          f"{sum(r['wrong'] for r in rs):>5}")
EOF
fi
if [[ $what == serve || $what == all ]]; then
  # shellcheck disable=SC2086
  PYTHONPATH="$build_dir/python" OMP_NUM_THREADS=1 /usr/bin/python3 -m chorus.kv_disagg single $serve_args \
    --out "$work/ref.json"
  for rep in $(seq 1 "$repeats"); do run_serve "$rep"; done
  python3 - "$rate" "$out" "$repeats" "$work" <<'EOF'
import json, statistics, sys
rate, out, repeats, work = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
runs = [json.load(open(f"{work}/serve.{i}.decode.json")) for i in range(1, repeats + 1)]
pre = [json.load(open(f"{work}/serve.{i}.prefill.json")) for i in range(1, repeats + 1)]


def timeline(dec, pre):
    """Each request's path (s after the run's start): arrival, prefill start and end (the prefill worker's
    clock), first token seen by decode; the two processes read the same CLOCK_MONOTONIC."""
    p = {q["rid"]: q for q in pre["requests"]}
    return [{"rid": q["rid"], "arrival": q["arrival"], "start": p[q["rid"]]["start"],
             "prefill_done": p[q["rid"]]["prefill_done"], "acked": p[q["rid"]]["acked"],
             "first_token": q["times"][0]} for q in dec["requests"]]


with open(out, "a") as o:
    for i, r in enumerate(runs):
        o.write(json.dumps({"op": "kv_disagg", "repeat": i + 1, "link": rate, "metrics": r["metrics"],
                            "mismatched": r["mismatched"], "timeline": timeline(r, pre[i])}) + "\n")
print(f"# kv_disagg over {rate}: medians of {repeats} runs (each run's median / p90)")
for k in ("ttft_ms", "itl_ms"):
    for q in ("median", "p90"):
        xs = [r["metrics"][k][q] for r in runs]
        print(f"  {k:8} {q:6} {statistics.median(xs):8.2f} ms   runs: " + " ".join(f"{x:.2f}" for x in xs))
# Where a request's TTFT goes: waiting for the prefill worker, the prefill, the pages' transfer until the
# prefill worker sees every page acknowledged, then until decode emits the first token (the notification
# goes out after the acknowledgements).  "acked" is when the prefill *worker* saw it (its next test()):
# with the engine's progress thread (CHORUS_KV_PROGRESS=thread) the notification may leave, and the first
# token come, before that, so "prefill->first token" (transfer, notification and admission) is the part
# to set against the model's post + wire + latencies.
for name, a, b in (("wait", "arrival", "start"), ("prefill", "start", "prefill_done"),
                   ("transfer+ack", "prefill_done", "acked"), ("ack->first token", "acked", "first_token"),
                   ("prefill->first token", "prefill_done", "first_token")):
    xs = [1e3 * (t[b] - t[a]) for i, r in enumerate(runs) for t in timeline(r, pre[i])]
    print(f"  ttft part {name:16} median {statistics.median(xs):8.2f} ms")
bad = [r["mismatched"] for r in runs if r["mismatched"]]
print("  tokens and logits equal the one-process run in every run" if not bad else f"  MISMATCH: {bad}")
sys.exit(1 if bad else 0)
EOF
fi
