#!/usr/bin/python3
"""chorus vs gloo through torch.distributed, 2 ranks on this host, in one run.

Measures all_reduce (float32, SUM) latency and bus bandwidth from 8 B to
64 MiB, and the DDP step time of the test model (tests/python's 2-layer MLP)
and of a wider MLP, for the backends "chorus" and "gloo" living in the same
processes (default group chorus, a gloo group from new_group), so both see the
same machine at the same moment.  Prints a Markdown table; --json writes the
numbers.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_compare.py [--json out.json]

busbw = 2 (n-1)/n * bytes / time, as nccl-tests define it for all_reduce.
Speed is reported, never asserted: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from datetime import timedelta

SIZES = [8, 64, 1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def _probe(dist, t, group, iters=3):
    """Seconds per all_reduce over a fixed number of calls (every rank must
    issue the same calls, so nothing here depends on local timing)."""
    dist.all_reduce(t, group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    return (time.perf_counter() - t0) / iters


def _rank(rank, world, path, args, out):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import chorus.torch  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("chorus", init_method="file://" + path, rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    groups = {"chorus": None, "gloo": dist.new_group(backend="gloo")}
    ctrl = groups["gloo"]
    rows = []
    for size in SIZES:
        n = max(1, size // 4)
        row = {"bytes": n * 4}
        for name, group in groups.items():
            t = torch.ones(n)
            # Agree on the iteration count: time a short probe, then fix it.
            per = _probe(dist, t, group)
            iters = torch.tensor([max(3, min(args.max_iters, int(args.seconds / max(per, 1e-7))))])
            dist.broadcast(iters, src=0, group=ctrl)
            k = int(iters.item())
            dist.barrier(group=group)
            t0 = time.perf_counter()
            for _ in range(k):
                dist.all_reduce(t, group=group)
            sec = (time.perf_counter() - t0) / k
            sec_t = torch.tensor([sec], dtype=torch.float64)
            dist.all_reduce(sec_t, op=dist.ReduceOp.MAX, group=ctrl)
            sec = sec_t.item()
            row[name] = {"us": sec * 1e6, "busbw_GBps": 2 * (world - 1) / world * n * 4 / sec / 1e9, "iters": k}
        rows.append(row)
    ddp = {}
    for label, widths in (("test MLP 16-32-1", (16, 32, 1)), ("MLP 1024x4 (3.1 M params)", (1024, 1024, 1024,
                                                                                            1024, 1))):
        ddp[label] = {}
        for name, group in groups.items():
            torch.manual_seed(0)
            layers = []
            for a, b in zip(widths[:-1], widths[1:]):
                layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
            model = DDP(torch.nn.Sequential(*layers[:-1]), process_group=group)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            g = torch.Generator().manual_seed(rank)
            x, y = torch.randn(32, widths[0], generator=g), torch.randn(32, 1, generator=g)
            steps = args.ddp_steps if widths[0] < 100 else max(5, args.ddp_steps // 5)
            for i in range(steps + 5):
                if i == 5:
                    dist.barrier(group=ctrl)
                    t0 = time.perf_counter()
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            sec_t = torch.tensor([(time.perf_counter() - t0) / steps], dtype=torch.float64)
            dist.all_reduce(sec_t, op=dist.ReduceOp.MAX, group=ctrl)
            ddp[label][name] = {"ms": sec_t.item() * 1e3, "steps": steps}
    if rank == 0:
        out.put({"allreduce": rows, "ddp": ddp, "world": world})
    dist.destroy_process_group()


def _fmt_bytes(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k:
            return "{:g} {}".format(b / k, unit)
    return "{} B".format(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=0.5, help="time per size and backend")
    ap.add_argument("--max-iters", type=int, default=2000)
    ap.add_argument("--ddp-steps", type=int, default=100)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    world = 2
    path = os.path.join(tempfile.mkdtemp(prefix="chorus-torch-bench-"), "store")
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, path, args, out), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    res = out.get(timeout=1800)
    for p in procs:
        p.join(60)
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    print("all_reduce float32 SUM, {} ranks, torch.distributed ({})".format(world, time.strftime("%Y-%m-%d")))
    print()
    print("| size | chorus µs | gloo µs | latency gloo/chorus | chorus busbw GB/s | gloo busbw GB/s | busbw chorus/gloo |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in res["allreduce"]:
        c, g = r["chorus"], r["gloo"]
        print("| {} | {:.1f} | {:.1f} | {:.1f}x | {:.3f} | {:.3f} | {:.2f}x |".format(
            _fmt_bytes(r["bytes"]), c["us"], g["us"], g["us"] / c["us"], c["busbw_GBps"], g["busbw_GBps"],
            c["busbw_GBps"] / g["busbw_GBps"]))
    print()
    print("| DDP step (batch 32) | chorus ms | gloo ms | gloo/chorus |")
    print("|---|---:|---:|---:|")
    for label, d in res["ddp"].items():
        print("| {} | {:.3f} | {:.3f} | {:.2f}x |".format(label, d["chorus"]["ms"], d["gloo"]["ms"],
                                                          d["gloo"]["ms"] / d["chorus"]["ms"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
