#!/usr/bin/env python3
"""Traces end to end: a 4-rank job under CHORUS_TRACE where one rank arrives
late at every allreduce and one rank's trace clock is shifted by a large
injected offset (CHORUS_CLOCK_OFFSET_NS).  Checks, from `chorus-trace report
--json` and `chorus-trace merge`:

- the report names the delayed rank as the straggler (run twice with different
  ranks, once with the shifted clock on the straggler itself, where a missing
  alignment would make it look early instead of late);
- every rank's clock estimate is within its own error bound of the truth (all
  ranks share one kernel clock, so the truth is minus the injected offset);
- the merged Chrome trace is valid JSON with one process per rank, every
  allreduce on every rank, and all events on one timeline (a span far below the
  injected offset);
- a directory without traces and a corrupt trace file are refused with an error.

Usage: trace_test.py CHORUS_RUN CHORUS_TRACE_TOOL TRACE_JOB_MAIN
"""
import json, os, subprocess, sys, tempfile

RUN, TOOL, JOB = sys.argv[1:4]
NRANKS, ITERS = 4, 24
OFFSET_NS = 100_000_000_000  # 100 s: far beyond any real skew of this test
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run_job(tdir, delay_rank, offset_rank, offset_ns):
    env = dict(os.environ, CHORUS_TRACE=tdir, CHORUS_TIMEOUT_MS="60000")
    cmd = [RUN, "-n", str(NRANKS), JOB, "--iters", str(ITERS), "--bytes", "262144", "--delay-rank", str(delay_rank),
           "--delay-us", "4000", "--clock-offset-rank", str(offset_rank), "--clock-offset-ns", str(offset_ns)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"job (delay rank {delay_rank}, clock offset on rank {offset_rank}) exits 0: {p.stderr[-500:]}")


def report(tdir):
    p = subprocess.run([TOOL, "report", tdir, "--json"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"chorus-trace report exits 0: {p.stderr[-300:]}")
    return json.loads(p.stdout) if p.returncode == 0 else {}


for delay_rank, offset_rank, offset in [(2, 1, OFFSET_NS), (1, 1, -OFFSET_NS)]:
    with tempfile.TemporaryDirectory() as tdir:
        run_job(tdir, delay_rank, offset_rank, offset)
        files = sorted(f for f in os.listdir(tdir) if f.endswith(".trace"))
        check(len(files) == NRANKS, f"one trace file per rank: {files}")
        r = report(tdir)
        if not r:
            continue
        check(r.get("straggler") == delay_rank, f"straggler is rank {delay_rank}: got {r.get('straggler')}")
        check(r.get("straggler_late_us", 0) > 1000, f"straggler is late by > 1 ms: {r.get('straggler_late_us')}")
        ar = [c for c in r["collectives"] if c["collective"] == "allreduce" and c["bytes"] == 262144]
        check(len(ar) == 1 and ar[0]["calls"] == ITERS, f"{ITERS} allreduce calls of 256 KiB in the report: {ar}")
        check(len(ar) == 1 and ar[0]["last_rank"] == delay_rank, "the allreduce row names the late rank")
        check(len(ar) == 1 and ar[0]["predicted_us"] > 0, "the allreduce row carries the tuner's prediction")
        clocks = {c["rank"]: c for c in r["clocks"]}
        check(sorted(clocks) == list(range(NRANKS)), f"every rank has a clock estimate: {sorted(clocks)}")
        for rank, c in clocks.items():
            truth = -offset if rank == offset_rank else 0
            err = c["offset_ns"] - truth
            print(f"     rank {rank}: clock offset error {err} ns, bound {c['bound_ns']} ns")
            # The true offset lies within half the shortest round trip of the
            # estimate (the server's stamp is between t1 and t4); 1 us for rounding.
            check(abs(err) <= c["bound_ns"] + 1000, f"rank {rank}: offset error {err} ns within its bound")

        out = os.path.join(tdir, "trace.json")
        p = subprocess.run([TOOL, "merge", tdir, "-o", out], capture_output=True, text=True, timeout=60)
        check(p.returncode == 0, f"chorus-trace merge exits 0: {p.stderr[-300:]}")
        with open(out) as f:
            tr = json.load(f)
        ev = tr["traceEvents"]
        names = [e for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"]
        check(len(names) == NRANKS, f"one process per rank in the merged trace: {len(names)}")
        for rank in range(NRANKS):
            ops = [e for e in ev if e.get("ph") == "X" and e.get("pid") == rank and e.get("cat") == "op"
                   and e["name"].startswith("allreduce")]
            check(len(ops) == ITERS, f"rank {rank}: {ITERS} allreduce events (got {len(ops)})")
        ts = [e["ts"] for e in ev if "ts" in e]
        span_s = (max(ts) - min(ts)) / 1e6
        check(span_s < 30, f"all events on one timeline: span {span_s:.3f} s (the injected offset is 100 s)")
        flows = [e for e in ev if e.get("ph") in ("s", "f")]
        check(len(flows) > 0 and len(flows) % 2 == 0, f"send->receive flow arrows: {len(flows)}")

with tempfile.TemporaryDirectory() as empty:
    p = subprocess.run([TOOL, "report", empty], capture_output=True, text=True, timeout=60)
    check(p.returncode != 0 and "no *.trace files" in p.stderr, f"an empty directory is refused: {p.stderr.strip()}")
    with open(os.path.join(empty, "bad.trace"), "wb") as f:
        f.write(b"CHTRACE1" + b"\xff" * 64)
    p = subprocess.run([TOOL, "merge", empty], capture_output=True, text=True, timeout=60)
    check(p.returncode != 0 and "bad.trace" in p.stderr, f"a corrupt trace is refused, naming it: {p.stderr.strip()}")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
