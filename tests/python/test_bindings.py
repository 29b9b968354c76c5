"""The chorus Python binding (no torch.distributed): every collective on NumPy
arrays and CPU torch tensors, zero-copy, in place and out of place, streams
and handles, groups, split, PreMulSum, and errors as exceptions, on 2 and 4
ranks.  Expected values are computed independently with NumPy."""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def _data(rank, n, dtype, salt=0):
    # Small integers: exact in every dtype, sums and products included.
    return ((np.arange(n) * (rank + 3) + salt + rank) % 5 + 1).astype(dtype)


def _numpy_collectives(rank, world, ids):
    import chorus

    comm = harness.comm(rank, world, ids)
    assert comm.rank == rank and comm.size == world
    all_in = lambda n, dt, salt=0: [_data(r, n, dt, salt) for r in range(world)]  # noqa: E731
    for dt in (np.float32, np.float64, np.int32, np.int64, np.int8, np.uint8, np.float16, np.uint32, np.uint64):
        for n in (0, 1, 7, 1000):
            ins = all_in(n, dt)
            for op, ref in ((chorus.Op.SUM, np.sum), (chorus.Op.MAX, np.max), (chorus.Op.MIN, np.min)):
                x = ins[rank].copy()
                comm.all_reduce(x, op=op)  # in place
                np.testing.assert_array_equal(x, ref(np.stack(ins), axis=0).astype(dt), err_msg=f"{dt} {n} {op}")
            if dt in (np.float32, np.float64, np.int64):
                out = np.empty_like(ins[rank])
                comm.all_reduce(ins[rank], out, op=chorus.Op.PROD)  # out of place
                np.testing.assert_array_equal(out, np.prod(np.stack(ins), axis=0).astype(dt))
    # AVG on floats
    ins = all_in(100, np.float64)
    x = ins[rank].copy()
    comm.all_reduce(x, op=chorus.Op.AVG)
    np.testing.assert_allclose(x, np.mean(np.stack(ins), axis=0))
    # broadcast, in place and out of place, every root
    for root in range(world):
        x = _data(rank, 33, np.float32, salt=root)
        comm.broadcast(x, root=root)
        np.testing.assert_array_equal(x, _data(root, 33, np.float32, salt=root))
        y = np.zeros(33, np.float32)
        comm.broadcast(_data(rank, 33, np.float32), root=root, recv=y)
        np.testing.assert_array_equal(y, _data(root, 33, np.float32))
    # reduce to each root
    ins = all_in(17, np.int32)
    for root in range(world):
        out = np.zeros(17, np.int32)
        comm.reduce(ins[rank], out, op=chorus.Op.SUM, root=root)
        if rank == root:
            np.testing.assert_array_equal(out, np.sum(np.stack(ins), axis=0))
    # all_gather, reduce_scatter, all_to_all
    ins = all_in(9, np.float32)
    out = np.zeros(9 * world, np.float32)
    comm.all_gather(ins[rank], out)
    np.testing.assert_array_equal(out, np.concatenate(ins))
    big = all_in(6 * world, np.int64, salt=1)
    out = np.zeros(6, np.int64)
    comm.reduce_scatter(big[rank], out)
    np.testing.assert_array_equal(out, np.sum(np.stack(big), axis=0)[rank * 6:(rank + 1) * 6])
    out = np.zeros(6 * world, np.int64)
    comm.all_to_all(big[rank], out)
    np.testing.assert_array_equal(out, np.concatenate([big[r][rank * 6:(rank + 1) * 6] for r in range(world)]))
    # v-variants: rank r contributes r+1 elements
    counts = [r + 1 for r in range(world)]
    mine = np.full(rank + 1, rank, np.float64)
    out = np.zeros(sum(counts), np.float64)
    comm.all_gather_v(mine, out, counts)
    np.testing.assert_array_equal(out, np.concatenate([np.full(r + 1, r, np.float64) for r in range(world)]))
    # all_to_all_v: rank r sends (d+1) copies of 10*r+d to rank d
    send = np.concatenate([np.full(d + 1, 10 * rank + d, np.int32) for d in range(world)])
    recv = np.zeros(world * (rank + 1), np.int32)
    comm.all_to_all_v(send, [d + 1 for d in range(world)], recv, [rank + 1] * world)
    np.testing.assert_array_equal(recv, np.concatenate([np.full(rank + 1, 10 * s + rank, np.int32)
                                                        for s in range(world)]))
    # gather / scatter at the last rank
    root = world - 1
    out = np.zeros(4 * world, np.uint8) if rank == root else None
    comm.gather(np.full(4, rank, np.uint8), out, root=root)
    if rank == root:
        np.testing.assert_array_equal(out, np.repeat(np.arange(world, dtype=np.uint8), 4))
    src = np.repeat(np.arange(world, dtype=np.int32) * 7, 3) if rank == root else None
    got = np.zeros(3, np.int32)
    comm.scatter(src, got, root=root)
    np.testing.assert_array_equal(got, np.full(3, 7 * rank, np.int32))
    # send / recv around a ring, inside a group so any order completes
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    got = np.zeros(5, np.float32)
    with chorus.group():
        comm.send(np.full(5, rank, np.float32), nxt)
        comm.recv(got, prv)
    np.testing.assert_array_equal(got, np.full(5, prv, np.float32))
    comm.barrier()
    # PreMulSum: sum of 0.5 * x
    op = comm.premul_sum(0.5, chorus.DataType.float32)
    x = np.full(8, rank + 1, np.float32)
    comm.all_reduce(x, op=op)
    comm.destroy_op(op)
    np.testing.assert_allclose(x, 0.5 * sum(range(1, world + 1)))
    comm.close()


def _torch_and_streams(rank, world, ids):
    import chorus
    import torch

    comm = harness.comm(rank, world, ids)
    # Zero-copy on torch tensors: the tensor itself changes, every dtype.
    for dt in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.int8):
        t = torch.full((3, 5), rank + 1, dtype=dt)
        ptr = t.data_ptr()
        comm.all_reduce(t)
        assert t.data_ptr() == ptr
        assert torch.equal(t, torch.full((3, 5), sum(range(1, world + 1)), dtype=dt)), (dt, t)
    view = torch.arange(12, dtype=torch.float32)[2:8]  # a contiguous view at an offset
    comm.broadcast(view, root=0)
    assert torch.equal(view, torch.arange(2, 8, dtype=torch.float32))
    out = torch.empty(4 * world, dtype=torch.bfloat16)
    comm.all_gather(torch.full((4,), rank, dtype=torch.bfloat16), out)
    assert torch.equal(out, torch.arange(world, dtype=torch.bfloat16).repeat_interleave(4))
    # Streams: calls return handles at once; buffers are kept alive.
    s = chorus.Stream()
    xs = [np.full(1000, rank + i, np.float32) for i in range(4)]
    handles = [comm.all_reduce(x, stream=s) for x in xs]
    assert s.pending_objects >= 4
    handles[-1].wait()
    assert handles[0].done()
    assert s.pending_objects == 0
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(x, np.full(1000, sum(r + i for r in range(world)), np.float32))
    h = comm.all_reduce(np.ones(10, np.float32), stream=s)  # a temporary: the stream keeps it alive
    s.synchronize()
    assert h.done()
    # split: even and odd ranks
    sub = comm.split(rank % 2, rank)
    x = np.array([rank], np.int64)
    sub.all_reduce(x)
    assert x[0] == sum(r for r in range(world) if r % 2 == rank % 2), x
    sub.close()
    # Errors carry chorus's message and code.
    try:
        comm.broadcast(np.zeros(3, np.float32), root=world + 5)
        raise AssertionError("a bad root did not raise")
    except chorus.InvalidArgumentError as e:
        assert e.code == chorus.Result.InvalidArgument and "root" in str(e), str(e)
        assert isinstance(e, ValueError) and isinstance(e, chorus.Error)
    for bad, exc in ((np.zeros((4, 4), np.float32)[:, 1], ValueError), (np.zeros(3, np.complex64), TypeError),
                     ([1, 2, 3], TypeError), (torch.zeros(4, 4).t(), ValueError)):
        try:
            comm.all_reduce(bad)
            raise AssertionError("all_reduce({!r}) did not raise".format(bad))
        except exc:
            pass
    try:
        comm.all_reduce(np.zeros(3, np.float32), np.zeros(3, np.float64))
        raise AssertionError("mixed dtypes did not raise")
    except TypeError as e:
        assert "dtype" in str(e)
    try:
        comm.all_reduce(np.frombuffer(b"\0" * 16, np.float32))
        raise AssertionError("a read-only buffer was reduced in place")
    except ValueError:
        pass
    comm.close()
    try:
        comm.barrier()
        raise AssertionError("a closed communicator did not raise")
    except chorus.InvalidUsageError:
        pass


def _size_checks(rank, world, ids):
    """Every call with a buffer of the wrong size raises ValueError naming both
    sizes, before any communication: only rank 0 makes the bad calls (at root
    0 for the rooted ones), and the ranks' next collective still matches."""
    import chorus

    comm = harness.comm(rank, world, ids)
    f = np.float32
    z = lambda n: np.zeros(n, f)  # noqa: E731
    if rank == 0:
        w = world
        bad = [
            ("all_reduce", lambda: comm.all_reduce(z(8), z(7)), ("recv.size=7", "send.size=8")),
            ("all_gather short by 1", lambda: comm.all_gather(z(9), z(9 * w - 1)), (f"recv.size={9 * w - 1}", "send.size=9")),
            ("all_gather short by 3", lambda: comm.all_gather(z(9), z(9 * w - 3)), (f"recv.size={9 * w - 3}",)),
            ("all_gather too long", lambda: comm.all_gather(z(9), z(9 * w + 1)), (f"recv.size={9 * w + 1}",)),
            ("reduce_scatter", lambda: comm.reduce_scatter(z(6 * w - 1), z(6)), (f"send.size={6 * w - 1}", "recv.size=6")),
            ("all_to_all recv short", lambda: comm.all_to_all(z(4 * w), z(4 * w - 1)), (f"recv.size={4 * w - 1}",)),
            ("all_to_all not a multiple", lambda: comm.all_to_all(z(4 * w + 1), z(4 * w + 1)), ("multiple",)),
            ("broadcast", lambda: comm.broadcast(z(5), root=0, recv=z(4)), ("recv.size=4", "buf.size=5")),
            ("reduce", lambda: comm.reduce(z(5), z(3), root=0), ("recv.size=3", "send.size=5")),
            ("gather", lambda: comm.gather(z(4), z(4 * w - 1), root=0), (f"recv.size={4 * w - 1}", "send.size=4")),
            ("gather without recv", lambda: comm.gather(z(4), None, root=0), ("recv is required",)),
            ("scatter", lambda: comm.scatter(z(3 * w - 1), z(3), root=0), (f"send.size={3 * w - 1}", "recv.size=3")),
            ("scatter without send", lambda: comm.scatter(None, z(3), root=0), ("send is required",)),
            ("all_gather_v recv short", lambda: comm.all_gather_v(z(1), z(w - 1), [1] * w), (f"recv.size={w - 1}",)),
            ("all_gather_v counts", lambda: comm.all_gather_v(z(1), z(w), [1] * (w + 1)), ("counts has",)),
            ("all_gather_v own count", lambda: comm.all_gather_v(z(2), z(w), [1] * w), ("send.size=2", "counts[0]=1")),
            ("all_to_all_v send short", lambda: comm.all_to_all_v(z(2 * w - 1), [2] * w, z(2 * w), [2] * w),
             (f"send.size={2 * w - 1}",)),
            ("all_to_all_v recv short", lambda: comm.all_to_all_v(z(2 * w), [2] * w, z(2 * w - 3), [2] * w),
             (f"recv.size={2 * w - 3}",)),
        ]
        for name, call, needles in bad:
            try:
                call()
                raise AssertionError(f"{name}: a wrong buffer size did not raise")
            except ValueError as e:
                for needle in needles:
                    assert needle in str(e), f"{name}: {needle!r} not in {str(e)!r}"
    # Nothing reached the wire: the ranks' next collectives match.
    out = z(3 * world)
    comm.all_gather(np.full(3, rank, f), out)
    np.testing.assert_array_equal(out, np.repeat(np.arange(world, dtype=f), 3))
    x = np.full(5, rank + 1, np.int64)
    comm.all_reduce(x)
    np.testing.assert_array_equal(x, np.full(5, sum(range(1, world + 1)), np.int64))
    comm.close()


def main():
    checks = harness.Checks()
    import multiprocessing as mp

    for world in (2, 4):
        checks.run(f"numpy_collectives_{world}ranks", harness.run, _numpy_collectives, world, 120, mp.Queue())
        checks.run(f"size_checks_{world}ranks", harness.run, _size_checks, world, 120, mp.Queue())
        checks.run(f"torch_tensors_streams_errors_{world}ranks", harness.run, _torch_and_streams, world, 120,
                   mp.Queue())
    checks.finish()


if __name__ == "__main__":
    main()
