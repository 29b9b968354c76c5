"""Training through the "chorus" backend: DistributedDataParallel for 50 steps
gives the same loss curve as with gloo; a ZeRO-style step (reduce_scatter of
gradients, sharded update, all_gather of parameters) matches DDP; and a
killed rank makes the survivors' wait() raise instead of hanging."""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

STEPS = 50


def _model():
    import torch

    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def _batch(step, rank, world):
    import torch

    g = torch.Generator().manual_seed(1000 + step * world + rank)
    x = torch.randn(8, 16, generator=g)
    return x, (x.sum(dim=1, keepdim=True) * 0.1).tanh()


def _train_ddp(group, rank, world):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model(), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS):
        x, y = _batch(step, rank, world)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.module.parameters()]


def _train_zero(rank, world):
    """Each rank owns 1/world of the flat parameters: gradients are
    reduce-scattered (averaged), the owner updates its shard, and the
    parameters are all-gathered back."""
    import torch
    import torch.distributed as dist

    model = _model()
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    shard = (numel + world - 1) // world
    losses = []
    for step in range(STEPS):
        x, y = _batch(step, rank, world)
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        losses.append(loss.item())
        flat_grad = torch.zeros(shard * world)
        flat_grad[:numel] = torch.cat([p.grad.reshape(-1) for p in params])
        my_grad = torch.zeros(shard)
        dist._reduce_scatter_base(my_grad, flat_grad, op=dist.ReduceOp.AVG)
        flat_param = torch.zeros(shard * world)
        flat_param[:numel] = torch.cat([p.detach().reshape(-1) for p in params])
        my_param = flat_param[rank * shard:(rank + 1) * shard] - 0.05 * my_grad
        gathered = torch.zeros(shard * world)
        dist._all_gather_base(gathered, my_param.contiguous())
        with torch.no_grad():
            off = 0
            for p in params:
                p.copy_(gathered[off:off + p.numel()].view_as(p))
                off += p.numel()
    return losses, [p.detach().clone() for p in params]


def _training(rank, world, path):
    import warnings

    import torch
    import torch.distributed as dist

    import chorus.torch  # noqa: F401

    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(1)
    dist.init_process_group("chorus", init_method="file://" + path, rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    chorus_losses, chorus_params = _train_ddp(None, rank, world)
    gloo_losses, gloo_params = _train_ddp(gloo, rank, world)
    assert len(chorus_losses) == STEPS
    # Same curve: sums in a different order differ only in the last bits.
    torch.testing.assert_close(torch.tensor(chorus_losses), torch.tensor(gloo_losses), rtol=1e-4, atol=1e-6)
    assert chorus_losses[-1] < chorus_losses[0], "the loss did not go down: {}".format(chorus_losses)
    for a, b in zip(chorus_params, gloo_params):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    zero_losses, zero_params = _train_zero(rank, world)
    torch.testing.assert_close(torch.tensor(zero_losses), torch.tensor(chorus_losses), rtol=1e-4, atol=1e-6)
    for a, b in zip(zero_params, chorus_params):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    if rank == 0:
        print("rank 0 losses chorus {:.6f} -> {:.6f}, gloo {:.6f} -> {:.6f}, zero {:.6f} -> {:.6f}".format(
            chorus_losses[0], chorus_losses[-1], gloo_losses[0], gloo_losses[-1], zero_losses[0],
            zero_losses[-1]), flush=True)
    dist.destroy_process_group()


def _killed_rank(rank, world, path):
    import torch
    import torch.distributed as dist

    import chorus.torch  # noqa: F401

    dist.init_process_group("chorus", init_method="file://" + path, rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    t = torch.ones(1 << 16)
    dist.all_reduce(t)
    assert t[0].item() == world
    dist.barrier()
    if rank == world - 1:
        os._exit(17)  # dies without a word to its peers
    t0 = time.monotonic()
    try:
        for _ in range(100):  # the first calls may still complete with the dead rank's old data in flight
            dist.all_reduce(t, async_op=True).wait()
        raise AssertionError("all_reduce kept succeeding after rank {} died".format(world - 1))
    except RuntimeError as e:
        elapsed = time.monotonic() - t0
        print("rank {}: wait() raised after {:.2f} s: {}".format(rank, elapsed, str(e).splitlines()[0]), flush=True)
        assert "chorus" in str(e), str(e)
    # The group is broken; later calls fail at once instead of hanging.
    t1 = time.monotonic()
    try:
        dist.all_reduce(t)
        raise AssertionError("a broken group accepted a collective")
    except RuntimeError:
        pass
    assert time.monotonic() - t1 < 10


def _stalled_peer(rank, world, path, released):
    """A live peer that stops calling collectives: wait(timeout) raises
    and aborts the group, so later calls fail instead of hanging."""
    import torch
    import torch.distributed as dist

    import chorus.torch  # noqa: F401

    dist.init_process_group("chorus", init_method="file://" + path, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    dist.barrier()
    if rank == 1:
        assert released.wait(60), "rank 0 never released rank 1"
        return
    work = dist.all_reduce(torch.ones(8), async_op=True)
    t0 = time.monotonic()
    try:
        work.wait(timeout=timedelta(seconds=2))
        raise AssertionError("wait() returned although rank 1 never joined the all_reduce")
    except RuntimeError as e:
        assert "did not complete within 2000 ms" in str(e), str(e)
    assert time.monotonic() - t0 < 30
    try:
        dist.all_reduce(torch.ones(8))
        raise AssertionError("an aborted group accepted a collective")
    except RuntimeError as e:
        assert "abort" in str(e), str(e)
    released.set()


def main():
    checks = harness.Checks()
    for world in (2, 4):
        checks.run(f"ddp_and_zero_vs_gloo_{world}ranks", harness.run, _training, world, 280,
                   harness.store_path("ddp"))
    for world in (2, 3):
        checks.run(f"killed_rank_raises_{world}ranks", harness.run, _killed_rank, world, 90,
                   harness.store_path("kill"), expect_exit={world - 1})
    import multiprocessing as mp

    checks.run("stalled_peer_wait_timeout_2ranks", harness.run, _stalled_peer, 2, 90, harness.store_path("stall"),
               mp.get_context("fork").Event())
    checks.finish()


if __name__ == "__main__":
    main()
