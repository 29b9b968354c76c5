"""Surviving a failure through torch.distributed (issue 43, item 4): 4 ranks
train a small model with DistributedDataParallel over the "chorus" process
group; rank 3 is SIGKILLed in the middle of a step; the survivors' backward
raises, they revoke the group (chorus.torch.revoke), reconfigure it to the
ranks still alive (chorus.torch.reconfigure(shrink=True): the new default
group), wrap the model in a new DDP and redo the step within 10 s; later a
replacement process joins (chorus.torch.join) while they reconfigure with
grow=1, the new DDP hands it the parameters, a broadcast the optimizer's
momentum, and training finishes on 4 ranks.  With CHORUS_REPRODUCIBLE=canonical
the final parameters and momentum equal, bit for bit, those of three fresh
jobs without failure (4, 3, then 4 ranks, DDP each, handing the state over
through a file) on the same batches.  Also: supports_reconfigure is True for a
chorus group and False for gloo's, and reconfigure refuses nothing to do."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import signal
import socket
import sys
import tempfile
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

os.environ["CHORUS_REPRODUCIBLE"] = "canonical"
os.environ["CHORUS_TIMEOUT_MS"] = "60000"
os.environ["CHORUS_SHRINK_WINDOW_MS"] = "1500"

GLOBAL_BATCH = 24  # divisible by 4 and by 3
KILL_STEP, GROW_STEP, STEPS = 3, 6, 9


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _stores(port):
    """This rank's view of the job's store, and the keys the default group
    sees (init_process_group(store=...) prefixes them with the group's name, "0")."""
    import torch.distributed as dist

    tcp = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    job = dist.PrefixStore("job", tcp)
    return tcp, job, dist.PrefixStore("0", job)


class Trainer:
    """DDP over the current default group, SGD with momentum."""

    def __init__(self):
        import torch

        torch.manual_seed(7)
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        for p in self.model.parameters():  # momentum buffers exist from the start (zeros)
            self.opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
        self.ddp = None

    def wrap(self):
        """A new DDP over the default group: drops the old one's autograd
        hooks first, then broadcasts rank 0's parameters."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.ddp = None
        gc.collect()
        self.ddp = DDP(self.model)

    def momentum(self):
        import torch

        return torch.cat([self.opt.state[p]["momentum_buffer"].reshape(-1) for p in self.model.parameters()])

    def flat(self):
        import torch

        return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()] + [self.momentum()])

    def load(self, flat):
        import torch

        off = 0
        with torch.no_grad():
            for p in self.model.parameters():
                p.copy_(flat[off:off + p.numel()].view_as(p))
                off += p.numel()
            for p in self.model.parameters():
                self.opt.state[p]["momentum_buffer"].copy_(flat[off:off + p.numel()].view_as(p))
                off += p.numel()

    def load_momentum(self, flat):
        import torch

        off = 0
        with torch.no_grad():
            for p in self.model.parameters():
                self.opt.state[p]["momentum_buffer"].copy_(flat[off:off + p.numel()].view_as(p))
                off += p.numel()

    def step(self, step):
        import torch
        import torch.distributed as dist

        n, r = dist.get_world_size(), dist.get_rank()
        g = torch.Generator().manual_seed(500 + step)
        x = torch.randn(GLOBAL_BATCH, 16, generator=g)
        y = torch.sin(x[:, :4] * 2)
        per = GLOBAL_BATCH // n
        self.opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(self.ddp(x[r * per:(r + 1) * per]), y[r * per:(r + 1) * per])
        loss.backward()  # DDP averages the gradients; raises when a rank is gone
        self.opt.step()


def _with_failure(rank, world, port, ids, out):
    import torch
    import torch.distributed as dist

    import chorus.torch

    _, job, group_keys = _stores(port)
    if rank == 4:  # the replacement: joins when the survivors grow
        uid = ids.get(timeout=120)
        pg = chorus.torch.join(uid, group_keys)
        assert dist.get_world_size() == 4 and dist.get_rank() == 3, (dist.get_world_size(), dist.get_rank())
        assert pg is dist.distributed_c10d._get_default_group()
        t = Trainer()
        t.wrap()  # rank 0's parameters arrive here
        m = t.momentum()
        dist.broadcast(m, 0)
        t.load_momentum(m)
        for step in range(GROW_STEP, STEPS):
            t.step(step)
        return
    dist.init_process_group("chorus", store=job, rank=rank, world_size=4, timeout=timedelta(seconds=60))
    assert chorus.torch.supports_reconfigure()
    t = Trainer()
    t.wrap()
    step = 0
    while step < KILL_STEP:
        t.step(step)
        step += 1
    if rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)  # mid-job: its gradients never arrive
    t0 = time.monotonic()
    try:
        t.step(step)
        raise AssertionError("a step with a dead rank succeeded")
    except RuntimeError as e:
        assert "rank 3" in str(e) or "revoked" in str(e), str(e)
    chorus.torch.revoke()
    old = dist.distributed_c10d._get_default_group()
    pg = chorus.torch.reconfigure(shrink=True)
    assert pg is dist.distributed_c10d._get_default_group() and pg is not old
    assert dist.get_world_size() == 3 and dist.get_rank() == rank, (dist.get_world_size(), dist.get_rank())
    t.wrap()
    t.step(step)  # the same step again, on 3 ranks
    recovered = time.monotonic() - t0
    assert recovered < 10, f"detect + revoke + reconfigure + redo took {recovered:.1f} s"
    step += 1
    while step < GROW_STEP:
        t.step(step)
        step += 1
    if rank == 0:
        ids.put(chorus.torch.unique_id())
    chorus.torch.reconfigure(grow=1)
    assert dist.get_world_size() == 4 and dist.get_rank() == rank
    t.wrap()
    m = t.momentum()
    dist.broadcast(m, 0)
    while step < STEPS:
        t.step(step)
        step += 1
    if rank == 0:
        torch.save({"flat": t.flat(), "recovered_s": recovered}, out)


def _phase(rank, world, port, state_in, steps, state_out):
    """A fresh DDP job of `world` ranks from state_in (None: the initial model)."""
    import torch
    import torch.distributed as dist

    import chorus.torch  # noqa: F401

    _, job, _ = _stores(port)
    dist.init_process_group("chorus", store=job, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    t = Trainer()
    if state_in:
        t.load(torch.load(state_in))
    t.wrap()
    for step in steps:
        t.step(step)
    if rank == 0:
        torch.save(t.flat(), state_out)
    dist.destroy_process_group()


def _api(rank, world, port):
    import torch.distributed as dist

    import chorus.torch

    _, job, _ = _stores(port)
    dist.init_process_group("chorus", store=job, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    assert chorus.torch.supports_reconfigure() and not chorus.torch.supports_reconfigure(gloo)
    try:
        chorus.torch.reconfigure()
        raise AssertionError("reconfigure with nothing to do succeeded")
    except ValueError as e:
        assert "nothing to do" in str(e), str(e)
    try:
        chorus.torch.revoke(gloo)
        raise AssertionError("revoke on a gloo group succeeded")
    except TypeError as e:
        assert "not a chorus process group" in str(e), str(e)
    assert len(chorus.torch.unique_id()) > 0
    dist.destroy_process_group()


def main():
    import torch
    import torch.distributed as dist

    ctx = mp.get_context("fork")
    d = tempfile.mkdtemp(prefix="chorus-torch-survive-")
    checks = harness.Checks()

    def with_store(fn, world, timeout, *args, **kwargs):
        port = _free_port()
        server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                               timeout=timedelta(seconds=60))
        try:
            harness.run(fn, world, timeout, port, *args, **kwargs)
        finally:
            del server

    checks.run("api_2_ranks", with_store, _api, 2, 90)
    failed_run = os.path.join(d, "failure.pt")
    checks.run("ddp_kill_revoke_shrink_grow", with_store, _with_failure, 5, 240, ctx.Queue(), failed_run,
               expect_exit={3})
    a, b, c = (os.path.join(d, f"ref{i}.pt") for i in range(3))
    checks.run("reference_4_ranks", with_store, _phase, 4, 120, None, range(0, KILL_STEP), a)
    checks.run("reference_3_ranks", with_store, _phase, 3, 120, a, range(KILL_STEP, GROW_STEP), b)
    checks.run("reference_4_ranks_again", with_store, _phase, 4, 120, b, range(GROW_STEP, STEPS), c)

    def same():
        got = torch.load(failed_run)
        ref = torch.load(c)
        print(f"recovered in {got['recovered_s']:.2f} s; max |difference| "
              f"{(got['flat'] - ref).abs().max().item():.3g}", flush=True)
        assert torch.equal(got["flat"], ref), "the recovered run's parameters differ from the reference's"
        assert not torch.equal(ref, Trainer().flat()), "the model did not train"

    checks.run("bitwise_equal_to_reference", same)
    checks.finish()


if __name__ == "__main__":
    main()
