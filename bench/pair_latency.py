#!/usr/bin/env python3
"""Small-message latency of two builds, in interleaved pairs.

Runs `chorus-run -n RANKS chorus-bench COLL -b BYTES -e BYTES -n ITERS -w WARMUP` from build A's and
build B's tools folders one after the other (the order alternating pair by pair), BLOCKS blocks of
PAIRS pairs, and prints per block the median time of each (out of place and in place, us) and the
median of the per-pair ratios B / A.  A goal holds when it holds in every block (3 of 3 by default).

  python3 bench/pair_latency.py --a build-without/tools --b build/tools [--blocks 3] [--pairs 30]
"""
import argparse
import statistics
import subprocess
import sys


def run(tools, args):
    cmd = [f"{tools}/chorus-run", "-n", str(args.ranks), f"{tools}/chorus-bench", args.coll, "-b", args.bytes, "-e",
           args.bytes, "-n", str(args.iters), "-w", str(args.warmup)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"pair_latency: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    # nccl-tests rows: [0] size count type redop root time algbw busbw #wrong time algbw busbw #wrong
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) > 11 and f[0] == "[0]" and f[1].isdigit():
            return float(f[6]), float(f[10])
    sys.exit(f"pair_latency: no result row in the output of {' '.join(cmd)}:\n{out.stdout[-2000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="tools folder of build A (the reference)")
    ap.add_argument("--b", required=True, help="tools folder of build B")
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--coll", default="allreduce")
    ap.add_argument("--bytes", default="8")
    ap.add_argument("--iters", type=int, default=50000)
    ap.add_argument("--warmup", type=int, default=2000)
    args = ap.parse_args()
    if args.blocks < 1 or args.pairs < 1:
        sys.exit("pair_latency: --blocks and --pairs must be >= 1")
    print(f"# {args.coll} {args.bytes} B on {args.ranks} ranks, {args.iters} iterations per run; A = {args.a}, B = {args.b}")
    for block in range(1, args.blocks + 1):
        a, b = [], []
        for i in range(args.pairs):
            if i % 2 == 0:
                a.append(run(args.a, args)), b.append(run(args.b, args))
            else:
                b.append(run(args.b, args)), a.append(run(args.a, args))
        med = lambda xs, j: statistics.median(x[j] for x in xs)
        ratio = lambda j: statistics.median(y[j] / x[j] for x, y in zip(a, b))
        print(f"block {block}: out of place A {med(a, 0):.3f} B {med(b, 0):.3f} us, pair-ratio median B/A {ratio(0):.3f}; "
              f"in place A {med(a, 1):.3f} B {med(b, 1):.3f} us, pair-ratio median B/A {ratio(1):.3f}", flush=True)


if __name__ == "__main__":
    main()
