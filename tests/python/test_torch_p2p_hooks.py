"""The torch backend's receive from any source, batched send/recv, sparse
allreduce, per-call barrier timeout and Work futures under DDP's
communication hooks (issue 17 item 16), on 2 and 4 processes.

- recv(src=None) from several senders, mixed with receives from a named
  source, small and large (the sender blocks until the receiver copies)
  messages: every message arrives exactly once with its sender's rank.
- batch_isend_irecv where every rank receives before it sends, 4 MiB each
  way: completes (before: each rank's worker blocked in its receive).
- sparse allreduce equals gloo's on the same tensors; ranks that disagree on
  the shape fail with a message naming the rank.
- a barrier with BarrierOptions.timeout = 1 s that one rank skips raises long
  before the group's 120 s timeout would.
- DDP with allreduce_hook, fp16_compress_hook and PowerSGD: the parameters
  after 20 steps equal gloo's with the same hook (before: PowerSGD hung, its
  callback waiting on the worker thread for an op queued behind itself).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def _init(rank, world, path, timeout_s=120):
    import torch.distributed as dist

    import chorus.torch  # noqa: F401

    dist.init_process_group("chorus", init_method="file://" + path, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    return dist


def _any_source(rank, world, path):
    import torch

    dist = _init(rank, world, path)
    for n in (1000, 1 << 20):  # 4 KB (ring) and 4 MiB (copied from the blocked sender)
        if rank == 0:
            got = []
            # Rank 1 sends three messages; the first is received by name.
            t = torch.empty(n)
            dist.recv(t, src=1)
            assert bool((t == 1).all()), "named recv from 1 got {}".format(t[:4])
            for _ in range(2 * (world - 1) - 1):  # and one irecv below: 2 per sender
                t = torch.full((n,), -1.0)
                src = dist.recv(t)
                assert bool((t == src).all()), "any-source recv says rank {}, data {}".format(src, t[:4])
                got.append(src)
            w = dist.irecv(torch.empty(n))
            w.wait()
            got.append(w._source_rank())
            expected = sorted(r for r in range(1, world) for _ in range(2))
            assert sorted(got) == expected, "senders {} (expected {})".format(sorted(got), expected)
        else:
            for _ in range(3 if rank == 1 else 2):
                dist.send(torch.full((n,), float(rank)), 0)
        dist.barrier()
    # A receive that no one matches fails (here: the group's timeout, 3 s).
    g = dist.new_group(backend="chorus", timeout=timedelta(seconds=3))
    if rank == 0:
        try:
            dist.recv(torch.empty(4), group=g)
        except RuntimeError as e:
            assert "recv" in str(e).lower(), str(e)
        else:
            raise AssertionError("recv from any source without a sender returned")
    dist.barrier()


def _batch_p2p(rank, world, path):
    import torch

    dist = _init(rank, world, path)
    n = 1 << 20
    ops, bufs = [], {}
    for peer in range(world):
        if peer == rank:
            continue
        bufs[peer] = torch.full((n,), -1.0)
        ops.append(dist.P2POp(dist.irecv, bufs[peer], peer))
        ops.append(dist.P2POp(dist.isend, torch.full((n,), float(rank * 10 + peer)), peer))
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    for peer, b in bufs.items():
        assert bool((b == peer * 10 + rank).all()), "from {}: {}".format(peer, b[:4])
    dist.barrier()


def _sparse(rank, world, path):
    import torch

    dist = _init(rank, world, path)
    gloo = dist.new_group(backend="gloo")
    g = torch.Generator().manual_seed(rank)
    for dense in ((), (3,)):
        nnz = 5 + rank
        idx = torch.stack([torch.randint(0, 6, (nnz,), generator=g), torch.randint(0, 4, (nnz,), generator=g)])
        val = torch.randn((nnz,) + dense, generator=g, dtype=torch.float64)
        a = torch.sparse_coo_tensor(idx, val, (6, 4) + dense)
        b = a.clone()
        dist.all_reduce(a)
        dist.all_reduce(b, group=gloo)
        torch.testing.assert_close(a.to_dense(), b.to_dense())
    bad = torch.sparse_coo_tensor(torch.zeros(1, 1, dtype=torch.long), torch.ones(1), (4 + (rank == 1),))
    try:
        dist.all_reduce(bad)
    except RuntimeError as e:
        assert "rank" in str(e) and "sizes" in str(e), str(e)
    else:
        raise AssertionError("sparse allreduce of different sizes returned")


def _barrier_timeout(rank, world, path):
    import torch.distributed as dist

    dist = _init(rank, world, path)
    pg = dist.new_group(backend="chorus")  # its group timeout: 120 s
    if rank == 0:
        opts = dist.BarrierOptions()
        opts.timeout = timedelta(seconds=1)
        try:
            pg.barrier(opts).wait()
        except RuntimeError as e:
            assert "1000 ms" in str(e), str(e)
        else:
            raise AssertionError("barrier that rank {} skipped returned".format(1))
    dist.barrier()


def _hooks(rank, world, path):
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as default
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist = _init(rank, world, path)
    gloo = dist.new_group(backend="gloo")
    chorus = dist.new_group(backend="chorus")

    def train(group, hook, make_state):
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)),
                    process_group=group)
        model.register_comm_hook(make_state(group), hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for step in range(20):
            gen = torch.Generator().manual_seed(100 * step + rank)
            x = torch.randn(8, 12, generator=gen)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), x[:, :2]).backward()
            opt.step()
        return [p.detach() for p in model.parameters()]

    cases = {
        "allreduce_hook": (default.allreduce_hook, lambda g: g),
        "fp16_compress_hook": (default.fp16_compress_hook, lambda g: g),
        "powerSGD_hook": (powerSGD.powerSGD_hook,
                          lambda g: powerSGD.PowerSGDState(process_group=g, matrix_approximation_rank=1,
                                                           start_powerSGD_iter=3, random_seed=0)),
    }
    for name, (hook, state) in cases.items():
        mine, ref = train(chorus, hook, state), train(gloo, hook, state)
        # fp16 sums may round differently (reduction order); fp32 ones agree closely.
        tol = dict(rtol=1e-2, atol=1e-3) if "fp16" in name else dict(rtol=1e-4, atol=1e-5)
        for a, b in zip(mine, ref):
            torch.testing.assert_close(a, b, msg=name, **tol)


def main():
    checks = harness.Checks()
    for world in (2, 4):
        checks.run(f"recv_any_source_{world}ranks", harness.run, _any_source, world, 120, harness.store_path("any"))
        checks.run(f"batch_isend_irecv_large_{world}ranks", harness.run, _batch_p2p, world, 120,
                   harness.store_path("batch"))
        checks.run(f"sparse_allreduce_vs_gloo_{world}ranks", harness.run, _sparse, world, 120,
                   harness.store_path("sparse"))
        checks.run(f"ddp_comm_hooks_vs_gloo_{world}ranks", harness.run, _hooks, world, 200,
                   harness.store_path("hooks"))
    # Bounded well below the group's 120 s: only the per-call 1 s can end it.
    checks.run("barrier_per_call_timeout_2ranks", harness.run, _barrier_timeout, 2, 60,
               harness.store_path("barrier"))
    checks.finish()


if __name__ == "__main__":
    main()
