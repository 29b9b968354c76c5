#!/usr/bin/env python3
"""200 steps of CPU DDP training with chorus.torch.compressed_allreduce_hook
against the same training uncompressed (issue 19): the loss curves side by
side and the final loss's relative difference (goal: within 2 % for bf16,
5 % for fp8).  Exit status 1 when a goal is missed.

    PYTHONPATH=build/python /usr/bin/python3 bench/compress_train.py [--world 4] [--steps 200]

The model is a 3-layer MLP on a fixed synthetic regression task (each rank its
own batches); every run starts from the same seed, so the only difference is
the gradient compression.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _train(rank: int, world: int, path: str, steps: int, wire: "str | None") -> list[float]:
    import chorus.torch as ct
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                    torch.nn.ReLU(), torch.nn.Linear(256, 4)))
    if wire is not None:
        model.register_comm_hook(ct.CompressedAllreduceState(None, wire), ct.compressed_allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    target = torch.Generator().manual_seed(7)
    w_true = torch.randn(32, 4, generator=target)
    losses = []
    for step in range(steps):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(64, 32, generator=gen)
        y = torch.tanh(x @ w_true)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        # The loss over all ranks (uncompressed: a measurement, not training).
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(t.item() / world)
    return losses


def _worker(rank: int, world: int, path: str, steps: int, out: str) -> None:
    import chorus.torch  # noqa: F401

    dist.init_process_group("chorus", init_method="file://" + path, rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    curves = {str(w): _train(rank, world, path, steps, w) for w in (None, "bf16", "fp8")}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(curves, f)
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "curves.json")
        mp.spawn(_worker, args=(args.world, os.path.join(tmp, "store"), args.steps, out), nprocs=args.world)
        curves = json.load(open(out))
    base = curves["None"]
    tail = max(1, args.steps // 20)  # the final loss: the mean of the last 5 % of the steps
    final = {k: sum(v[-tail:]) / tail for k, v in curves.items()}
    print(f"{args.world} ranks, {args.steps} steps; loss every {args.steps // 10} steps:")
    print(f"{'step':>6} {'off':>10} {'bf16':>10} {'fp8':>10}")
    for s in range(0, args.steps, max(1, args.steps // 10)):
        print(f"{s:>6} {base[s]:10.5f} {curves['bf16'][s]:10.5f} {curves['fp8'][s]:10.5f}")
    ok = True
    for wire, goal in (("bf16", 0.02), ("fp8", 0.05)):
        rel = (final[wire] - final["None"]) / final["None"]
        ok = ok and abs(rel) <= goal
        print(f"final loss {wire}: {final[wire]:.5f} vs {final['None']:.5f} uncompressed ({rel:+.2%}; goal "
              f"within {goal:.0%})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
