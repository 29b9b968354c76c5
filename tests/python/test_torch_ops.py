"""The torch.distributed backend "chorus": every op's result equals the gloo
backend's on the same inputs (exact for integers, within float tolerance
otherwise), on 2 and 4 processes.  Where gloo (torch 1.13) lacks an op
(_allgather_base, reduce_scatter, _reduce_scatter_base, alltoall, AVG,
PREMUL_SUM, bf16), the reference is composed from gloo ops that it has.
Both groups live in each process: the default group is chorus, and a gloo
group is created with new_group over the same FileStore."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def _ops(rank, world, path):
    import warnings

    import torch
    import torch.distributed as dist

    import chorus.torch  # noqa: F401  (registers "chorus")

    warnings.filterwarnings("ignore", category=UserWarning)  # torch's deprecation notices for private ops
    torch.manual_seed(0)
    dist.init_process_group("chorus", init_method="file://" + path, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    assert dist.get_backend() == "chorus"
    gloo = dist.new_group(backend="gloo")
    R = dist.ReduceOp

    def inp(r, n, dt, salt=0):
        v = (torch.arange(n, dtype=torch.int64) * (r + 3) + salt + r) % 5 + 1
        return v.to(dt)

    def same(a, b, what):
        if a.dtype in (torch.float16, torch.bfloat16):
            torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2, msg=what)
        elif a.dtype.is_floating_point:
            torch.testing.assert_close(a, b, msg=what)
        else:
            assert torch.equal(a, b), "{}: chorus {} vs reference {}".format(what, a, b)

    def gloo_or(fn, fallback):
        try:
            return fn()
        except RuntimeError:
            return fallback()

    dtypes = [torch.float32, torch.float64, torch.int32, torch.int64, torch.int8, torch.uint8, torch.float16,
              torch.bfloat16]
    counted = set()
    for dt in dtypes:
        for n in (1, 13, 4099):
            for op in (R.SUM, R.PRODUCT, R.MIN, R.MAX):
                if op == R.PRODUCT and n > 13:
                    continue
                a = inp(rank, n, dt)
                dist.all_reduce(a, op=op)

                def ref_gloo(op=op, n=n, dt=dt):
                    b = inp(rank, n, dt)
                    dist.all_reduce(b, op=op, group=gloo)
                    return b

                def ref_local(op=op, n=n, dt=dt):
                    # gloo has no bf16: reduce the exact small integers in fp32
                    b = inp(rank, n, torch.float32)
                    dist.all_reduce(b, op=op, group=gloo)
                    return b.to(dt)

                same(a, gloo_or(ref_gloo, ref_local), "all_reduce {} {} n={}".format(dt, op, n))
    counted.add("allreduce")
    # AVG and PREMUL_SUM: gloo has neither; compare with its SUM, scaled.
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        a = inp(rank, 100, dt)
        dist.all_reduce(a, op=R.AVG)
        b = inp(rank, 100, torch.float64)
        dist.all_reduce(b, group=gloo)
        same(a, (b / world).to(dt), "all_reduce AVG {}".format(dt))
        a = inp(rank, 100, dt)
        dist.all_reduce(a, op=dist._make_nccl_premul_sum(0.25))
        same(a, (b * 0.25).to(dt), "all_reduce PREMUL_SUM {}".format(dt))
    counted.update({"avg", "premul_sum"})
    # allreduce_coalesced
    ts = [inp(rank, n, torch.float32, salt=n) for n in (3, 1, 70)]
    refs = [t.clone() for t in ts]
    dist.all_reduce_coalesced(ts)
    dist.all_reduce_coalesced(refs, group=gloo)
    for t, r in zip(ts, refs):
        same(t, r, "all_reduce_coalesced")
    counted.add("allreduce_coalesced")
    # broadcast and reduce from every root
    for root in range(world):
        for dt in (torch.float32, torch.int64, torch.float16, torch.uint8):
            a, b = inp(rank, 37, dt, salt=root), inp(rank, 37, dt, salt=root)
            dist.broadcast(a, src=root)
            dist.broadcast(b, src=root, group=gloo)
            same(a, b, "broadcast root {} {}".format(root, dt))
        a, b = inp(rank, 37, torch.int32), inp(rank, 37, torch.int32)
        dist.reduce(a, dst=root, op=R.SUM)
        dist.reduce(b, dst=root, op=R.SUM, group=gloo)
        if rank == root:
            same(a, b, "reduce root {}".format(root))
    counted.update({"broadcast", "reduce"})
    # all_gather (list), _all_gather_base, all_gather_coalesced
    for dt in (torch.float32, torch.int64, torch.bfloat16):
        x = inp(rank, 11, dt)
        outs = [torch.zeros(11, dtype=dt) for _ in range(world)]
        dist.all_gather(outs, x)
        refs = [torch.zeros(11, dtype=torch.float32) for _ in range(world)]
        dist.all_gather(refs, x.float(), group=gloo)
        for o, r in zip(outs, refs):
            same(o, r.to(dt), "all_gather {}".format(dt))
        flat = torch.zeros(11 * world, dtype=dt)
        dist._all_gather_base(flat, x)
        same(flat, torch.cat(refs).to(dt), "_all_gather_base {}".format(dt))
    ins = [inp(rank, 4, torch.float32), inp(rank, 2, torch.float32, salt=9)]
    outs = [[torch.zeros_like(t) for t in ins] for _ in range(world)]
    refs = [[torch.zeros_like(t) for t in ins] for _ in range(world)]
    dist.all_gather_coalesced(outs, ins)
    dist.all_gather_coalesced(refs, ins, group=gloo)
    for ol, rl in zip(outs, refs):
        for o, r in zip(ol, rl):
            same(o, r, "all_gather_coalesced")
    counted.update({"allgather", "_allgather_base", "allgather_coalesced"})
    # gather and scatter at every root
    for root in range(world):
        x = inp(rank, 5, torch.int64, salt=root)
        outs = [torch.zeros(5, dtype=torch.int64) for _ in range(world)] if rank == root else None
        refs = [torch.zeros(5, dtype=torch.int64) for _ in range(world)] if rank == root else None
        dist.gather(x, outs, dst=root)
        dist.gather(x, refs, dst=root, group=gloo)
        if rank == root:
            for o, r in zip(outs, refs):
                same(o, r, "gather root {}".format(root))
        src = [inp(r, 6, torch.float32, salt=root) for r in range(world)] if rank == root else None
        a, b = torch.zeros(6), torch.zeros(6)
        dist.scatter(a, src, src=root)
        dist.scatter(b, src, src=root, group=gloo)
        same(a, b, "scatter root {}".format(root))
    counted.update({"gather", "scatter"})
    # reduce_scatter (list) and _reduce_scatter_base: gloo has neither;
    # the reference is gloo's all_reduce of the whole input, sliced.
    for dt in (torch.float32, torch.int32, torch.bfloat16):
        for op in (R.SUM, R.MAX):
            full = inp(rank, 8 * world, dt, salt=3)
            ref = full.float().clone()
            dist.all_reduce(ref, op=op, group=gloo)
            ref = ref.to(dt)[rank * 8:(rank + 1) * 8]
            out = torch.zeros(8, dtype=dt)
            dist.reduce_scatter(out, list(full.chunk(world)), op=op)
            same(out, ref, "reduce_scatter {} {}".format(dt, op))
            out = torch.zeros(8, dtype=dt)
            dist._reduce_scatter_base(out, full, op=op)
            same(out, ref, "_reduce_scatter_base {} {}".format(dt, op))
    counted.update({"reduce_scatter", "_reduce_scatter_base"})
    # all_to_all_single (alltoall_base): equal and uneven splits, 2-D rows
    x = inp(rank, 3 * world * 2, torch.float32).view(3 * world, 2)
    a, b = torch.zeros_like(x), torch.zeros_like(x)
    dist.all_to_all_single(a, x)
    dist.all_to_all_single(b, x, group=gloo)
    same(a, b, "all_to_all_single equal")
    in_splits = [(rank + d) % 3 + 1 for d in range(world)]  # rows rank sends to d
    out_splits = [(s + rank) % 3 + 1 for s in range(world)]  # rows s sends to rank
    x = inp(rank, sum(in_splits) * 3, torch.int64, salt=5).view(-1, 3)
    a = torch.zeros(sum(out_splits), 3, dtype=torch.int64)
    b = torch.zeros_like(a)
    dist.all_to_all_single(a, x, out_splits, in_splits)
    dist.all_to_all_single(b, x, out_splits, in_splits, group=gloo)
    same(a, b, "all_to_all_single uneven")
    # all_to_all (lists): gloo has none; reference through gloo's all_to_all_single
    ins = [inp(rank, d + 1, torch.float32, salt=d) for d in range(world)]
    outs = [torch.zeros(rank + 1) for _ in range(world)]
    dist.all_to_all(outs, ins)
    ref = torch.zeros(world * (rank + 1))
    dist.all_to_all_single(ref, torch.cat(ins), [rank + 1] * world, [d + 1 for d in range(world)], group=gloo)
    same(torch.cat(outs), ref, "all_to_all")
    counted.update({"alltoall_base", "alltoall"})
    # send / recv around the ring, asynchronous, and the same over gloo
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for group in (None, gloo):
        got = torch.zeros(9, dtype=torch.float16)
        if rank % 2 == 0:
            s = dist.isend(torch.full((9,), rank, dtype=torch.float16), nxt, group=group)
            r = dist.irecv(got, prv, group=group)
        else:
            r = dist.irecv(got, prv, group=group)
            s = dist.isend(torch.full((9,), rank, dtype=torch.float16), nxt, group=group)
        s.wait()
        r.wait()
        same(got, torch.full((9,), prv, dtype=torch.float16), "send/recv")
    counted.update({"send", "recv"})
    dist.barrier()
    counted.add("barrier")
    # asynchronous works: many in flight, futures carry the outputs
    works = [dist.all_reduce(torch.full((1000,), float(i + rank)), async_op=True) for i in range(8)]
    for i, w in enumerate(works):
        w.wait()
        assert w.is_completed()
        (res,) = w.get_future().wait()
        same(res, torch.full((1000,), float(world * i + sum(range(world)))), "async all_reduce {}".format(i))
    # a subgroup of the first two ranks, and a chorus subgroup of all
    sub = dist.new_group(ranks=[0, 1], backend="chorus")
    if rank < 2:
        a = torch.tensor([rank + 10])
        dist.all_reduce(a, group=sub)
        assert a.item() == 21, a
    # errors: unsupported op, non-contiguous tensor, GPU-only bitwise ops
    for bad in (lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=R.BAND),
                lambda: dist.all_reduce(torch.ones(4, 4).t())):
        try:
            bad()
            raise AssertionError("an unsupported call did not raise")
        except RuntimeError as e:
            assert "chorus" in str(e) or "contiguous" in str(e), str(e)
    dist.barrier()
    expected = {"allreduce", "avg", "premul_sum", "allreduce_coalesced", "broadcast", "reduce", "allgather",
                "_allgather_base", "allgather_coalesced", "gather", "scatter", "reduce_scatter",
                "_reduce_scatter_base", "alltoall_base", "alltoall", "send", "recv", "barrier"}
    assert counted == expected, expected - counted
    dist.destroy_process_group()


def _reproducible(rank, world, path):
    """chorus.torch.set_reproducible: canonical groups sum float tensors as
    the canonical tree over ranks (left half [lo, mid), mid = lo + ceil((hi -
    lo) / 2)), computed here in float32; exact groups refuse integer sums."""
    import torch
    import torch.distributed as dist

    import chorus.torch

    try:
        chorus.torch.set_reproducible("bitwise")
        raise AssertionError("set_reproducible accepted an unknown mode")
    except ValueError as e:
        assert "canonical" in str(e), str(e)
    chorus.torch.set_reproducible("canonical")
    dist.init_process_group("chorus", init_method="file://" + path, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))

    def data(r):
        g = torch.Generator().manual_seed(1000 + r)
        x = torch.randn(3001, generator=g) * torch.pow(2.0, torch.randint(-20, 20, (3001,), generator=g).float())
        x[::3] += 1e6 if r % 2 == 0 else -1e6  # cancellation across ranks
        return x

    def tree(lo, hi):
        if hi - lo == 1:
            return data(lo)
        mid = lo + (hi - lo + 1) // 2
        return tree(lo, mid) + tree(mid, hi)

    want = tree(0, world)
    for n in (7, 3001):  # through the board and through the executor
        t = data(rank)[:n].clone()
        dist.all_reduce(t)
        assert torch.equal(t, want[:n]), "canonical allreduce of {} elements differs from the canonical tree".format(n)
    chorus.torch.set_reproducible("exact")
    exact = dist.new_group(backend="chorus")
    t = data(rank)
    dist.all_reduce(t, group=exact)
    ints = torch.ones(4, dtype=torch.int32)
    try:
        dist.all_reduce(ints, group=exact)
        raise AssertionError("an integer sum under exact mode did not raise")
    except RuntimeError as e:
        assert "CHORUS_REPRODUCIBLE=exact" in str(e), str(e)
    chorus.torch.set_reproducible(None)
    dist.destroy_process_group()


def main():
    checks = harness.Checks()
    for world in (2, 4):
        checks.run(f"torch_ops_vs_gloo_{world}ranks", harness.run, _ops, world, 240, harness.store_path("ops"))
    checks.run("torch_reproducible_3ranks", harness.run, _reproducible, 3, 240, harness.store_path("repro"))
    checks.finish()


if __name__ == "__main__":
    main()
