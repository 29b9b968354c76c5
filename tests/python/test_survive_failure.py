"""Surviving a failure without restarting (issue 43, item 4): 4 ranks train a
small model data-parallel over chorus; rank 3 is SIGKILLed in the middle of a
step; the survivors see the error, revoke, shrink and redo the step on 3 ranks
within 10 s; later a replacement process joins with grow, receives the
parameters and the optimizer state, and training finishes on 4 ranks.  With
CHORUS_REPRODUCIBLE=canonical the final parameters equal, bit for bit, those
of a reference run without any failure that applies the same batches with the
same rank counts (three fresh jobs: 4, 3, then 4 ranks, handing the state
over through a file)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

os.environ["CHORUS_REPRODUCIBLE"] = "canonical"
os.environ["CHORUS_TIMEOUT_MS"] = "60000"
os.environ["CHORUS_SHRINK_WINDOW_MS"] = "1500"

GLOBAL_BATCH = 24  # divisible by 4 and by 3
KILL_STEP, GROW_STEP, STEPS = 4, 8, 12


def _model():
    import torch

    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _global_batch(step):
    import torch

    g = torch.Generator().manual_seed(500 + step)
    x = torch.randn(GLOBAL_BATCH, 16, generator=g)
    return x, torch.sin(x[:, :4] * 2)


class Trainer:
    """SGD with momentum by hand: the gradient of this rank's shard of the
    global batch, summed over the ranks by chorus (in canonical order)."""

    def __init__(self):
        import torch

        self.model = _model()
        self.params = list(self.model.parameters())
        self.momentum = [torch.zeros_like(p) for p in self.params]

    def flat(self):
        import torch

        return torch.cat([t.detach().reshape(-1) for t in self.params + self.momentum])

    def load(self, flat):
        import torch

        off = 0
        with torch.no_grad():
            for t in self.params + self.momentum:
                t.copy_(flat[off:off + t.numel()].view_as(t))
                off += t.numel()

    def step(self, comm, step):
        import torch

        n, r = comm.size, comm.rank
        x, y = _global_batch(step)
        per = GLOBAL_BATCH // n
        xs, ys = x[r * per:(r + 1) * per], y[r * per:(r + 1) * per]
        self.model.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(xs), ys, reduction="sum") / GLOBAL_BATCH
        loss.backward()
        grad = torch.cat([p.grad.reshape(-1) for p in self.params])
        comm.all_reduce(grad)  # raises when a rank is gone: the step is not applied
        off = 0
        with torch.no_grad():
            for p, m in zip(self.params, self.momentum):
                g = grad[off:off + p.numel()].view_as(p)
                off += p.numel()
                m.mul_(0.9).add_(g)
                p.sub_(0.05 * m)


def _uid(rank, ids, copies):
    import chorus

    if rank == 0:
        uid = chorus.UniqueId()
        for _ in range(copies):
            ids.put(bytes(uid))
        return uid
    return chorus.UniqueId.from_bytes(ids.get(timeout=60))


def _with_failure(rank, world, ids, out):
    import chorus
    import torch

    uid = _uid(rank, ids, world - 1)
    if rank == 4:  # the replacement: waits in join until the survivors grow
        comm = chorus.Communicator.join(uid)
        assert comm.size == 4 and comm.rank == 3, (comm.size, comm.rank)
        t = Trainer()
        state = torch.zeros_like(t.flat())
        comm.broadcast(state, root=0)  # parameters and optimizer state from rank 0
        t.load(state)
        for step in range(GROW_STEP, STEPS):
            t.step(comm, step)
        return
    comm = chorus.Communicator.from_unique_id(4, uid, rank)
    t = Trainer()
    step = 0
    while step < KILL_STEP:
        t.step(comm, step)
        step += 1
    if rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)  # mid-step: its gradient never arrives
    t0 = time.monotonic()
    try:
        t.step(comm, step)
        raise AssertionError("the step with a dead rank succeeded")
    except (chorus.RemoteError, chorus.RevokedError) as e:
        assert "rank 3" in str(e) or "revoked" in str(e), str(e)
    comm.revoke()
    survivors = comm.shrink()
    assert survivors.size == 3 and survivors.rank == rank, (survivors.size, survivors.rank)
    t.step(survivors, step)  # the same step again, on 3 ranks
    recovered = time.monotonic() - t0
    assert recovered < 10, f"detect + revoke + shrink + redo took {recovered:.1f} s"
    step += 1
    while step < GROW_STEP:
        t.step(survivors, step)
        step += 1
    grown = survivors.grow(1)
    assert grown.size == 4 and grown.rank == rank
    state = t.flat()
    grown.broadcast(state, root=0)
    while step < STEPS:
        t.step(grown, step)
        step += 1
    if rank == 0:
        torch.save({"flat": t.flat(), "recovered_s": recovered}, out)
    grown.close()
    survivors.close()


def _phase(rank, world, ids, state_in, steps, state_out):
    """A fresh job of `world` ranks from state_in (None: the initial model)."""
    import chorus
    import torch

    uid = _uid(rank, ids, world - 1)
    comm = chorus.Communicator.from_unique_id(world, uid, rank)
    t = Trainer()
    if state_in:
        t.load(torch.load(state_in))
    for step in steps:
        t.step(comm, step)
    if rank == 0:
        torch.save(t.flat(), state_out)
    comm.close()


def main():
    import torch

    ctx = mp.get_context("fork")
    d = tempfile.mkdtemp(prefix="chorus-survive-")
    checks = harness.Checks()
    failed_run = os.path.join(d, "failure.pt")
    checks.run("kill_revoke_shrink_grow", harness.run, _with_failure, 5, 240, ctx.Queue(), failed_run,
               expect_exit={3})
    a, b, c = (os.path.join(d, f"ref{i}.pt") for i in range(3))
    checks.run("reference_4_ranks", harness.run, _phase, 4, 120, ctx.Queue(), None, range(0, KILL_STEP), a)
    checks.run("reference_3_ranks", harness.run, _phase, 3, 120, ctx.Queue(), a, range(KILL_STEP, GROW_STEP), b)
    checks.run("reference_4_ranks_again", harness.run, _phase, 4, 120, ctx.Queue(), b, range(GROW_STEP, STEPS), c)

    def same():
        got = torch.load(failed_run)
        ref = torch.load(c)
        print(f"recovered in {got['recovered_s']:.2f} s; max |difference| "
              f"{(got['flat'] - ref).abs().max().item():.3g}", flush=True)
        assert torch.equal(got["flat"], ref), "the recovered run's parameters differ from the reference's"
        init = Trainer().flat()
        assert not torch.equal(ref, init), "the model did not train"

    checks.run("bitwise_equal_to_reference", same)
    checks.finish()


if __name__ == "__main__":
    main()
