"""chorus-bench kv (src/toolkit/bench_kv.hpp): two agents of the KV engine move
batches of paged KV blocks, layer- and block-major, write and read, over
shared memory and over TCP, with -c 1 checking every byte of the destination
pool (moved blocks equal to their sources, every other byte still zero).
Checks the table (one row per size x layout x op, the descriptor counts of
each layout, no wrong byte), the JSON rows, and that bad options are refused.

    bench_kv_test.py TOOLS_DIR"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

tools = sys.argv[1]
bench = os.path.join(tools, "chorus-bench")
LAYERS, BLOCKS = 4, 8


def run(args, env=None, expect=0):
    p = subprocess.run([bench, "kv"] + args, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, **(env or {})))
    if p.returncode != expect:
        raise AssertionError(f"chorus-bench kv {' '.join(args)} ({env}): exit {p.returncode}, expected {expect}\n"
                             f"{p.stdout}\n{p.stderr}")
    return p


with tempfile.TemporaryDirectory() as d:
    for transport in ("shm", "tcp"):
        js = os.path.join(d, f"{transport}.jsonl")
        p = run(["-b", "4K", "-e", "16K", "-f", "4", "--blocks", str(BLOCKS), "--layers", str(LAYERS), "-n", "2",
                 "-w", "1", "-c", "1", "--json", js], env={"CHORUS_TRANSPORT": transport})
        rows = [l.split() for l in p.stdout.splitlines() if l.strip() and not l.startswith("#")]
        assert len(rows) == 2 * 2 * 2, p.stdout
        for size, blocks, block, descs, layout, op, t, p50, bw, wrong in rows:
            assert int(blocks) == BLOCKS and int(size) == BLOCKS * int(block), rows
            # Scattered destination blocks: nothing merges.
            assert int(descs) == BLOCKS * (2 * LAYERS if layout == "layer" else 1), rows
            assert op in ("write", "read") and wrong == "0" and float(t) > 0 and float(bw) > 0, rows
        assert "Out of bounds values : 0 OK" in p.stdout, p.stdout
        got = [json.loads(l) for l in open(js)]
        assert len(got) == 8 and all(r["op"] == "kv" and r["wrong"] == 0 for r in got), got
        assert {(r["layout"], r["kv_op"]) for r in got} == {(l, o) for l in ("layer", "block")
                                                             for o in ("write", "read")}, got

    # Different TP degrees on the two sides (kv_layout's conversion, timed):
    # rank 0's pool holds --tp-prefill ranks' regions, rank 1's --tp-decode;
    # a batch is every (source rank, destination rank) pair's pieces of the
    # heads they share, one per (block, layer, plane); -c 1 checks every
    # destination byte element by element from the layout's offsets.
    for tp_p, tp_d in ((2, 1), (1, 4), (2, 3)):
        js = os.path.join(d, f"tp{tp_p}{tp_d}.jsonl")
        p = run(["-b", "12K", "-e", "12K", "--blocks", str(BLOCKS), "--layers", str(LAYERS), "-n", "2", "-w", "1",
                 "-c", "1", "--tp-prefill", str(tp_p), "--tp-decode", str(tp_d), "--json", js])
        heads = tp_p * tp_d // __import__("math").gcd(tp_p, tp_d)
        sharing = sum(1 for a in range(tp_p) for b in range(tp_d)
                      if max(a * heads // tp_p, b * heads // tp_d) < min((a + 1) * heads // tp_p, (b + 1) * heads // tp_d))
        got = [json.loads(l) for l in open(js)]
        assert len(got) == 4 and all(r["wrong"] == 0 and r["tp_prefill"] == tp_p and r["tp_decode"] == tp_d
                                     for r in got), got
        for r in got:
            assert r["descs"] == sharing * BLOCKS * 2 * LAYERS, (tp_p, tp_d, sharing, r)
        assert "Out of bounds values : 0 OK" in p.stdout and f"TP {tp_p} (kv0) -> {tp_d} (kv1)" in p.stdout, p.stdout

    # Refused: a bad layout or op (usage, exit 2), 3 ranks (the ranks fail),
    # a block smaller than a byte per (layer, plane).
    run(["--layout", "diagonal"], expect=2)
    run(["--kv-op", "copy"], expect=2)
    run(["-b", "4", "-e", "4", "--layers", "4"], expect=2)
    run(["-b", "4K", "-e", "4K", "--tp-prefill", "0"], expect=2)
    run(["-b", "16", "-e", "16", "--layers", "2", "--tp-decode", "8"], expect=2)  # 16 B < 2 x 2 layers x 8 heads
    p = run(["-b", "4K", "-e", "4K", "--np", "3"], expect=1)
    assert "runs on 2 ranks" in p.stderr, p.stderr
print("bench_kv_test: OK")
