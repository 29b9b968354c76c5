"""The Python binding on OpenCL device buffers (docs/device.md, "Python"):
pyopencl arrays passed where NumPy arrays go, on 2 ranks (each its own
process, context and queue), against NumPy's reference: in place and out of
place (an offset view included), without a stream (blocking) and on
Stream.opencl(queue) (returns at once, completes in the queue's order).
Skipped, saying why, only where no OpenCL platform exists; pyopencl itself is
required (scripts/setup.sh installs python3-pyopencl)."""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def _data(rank, n, dtype, salt=0):
    return ((np.arange(n) * (rank + 3) + salt + rank) % 5 + 1).astype(dtype)


def _queue():
    import pyopencl as cl

    platform = cl.get_platforms()[0]
    ctx = cl.Context(platform.get_devices()[:1])
    return cl.CommandQueue(ctx)


def _device_collectives(rank, world, ids):
    import chorus
    import pyopencl.array as cla

    q = _queue()
    comm = harness.comm(rank, world, ids)
    ins = lambda n, dt, salt=0: [_data(r, n, dt, salt) for r in range(world)]  # noqa: E731
    # all_reduce in place, three dtypes and ops
    for dt, op, ref in ((np.float32, chorus.Op.SUM, np.sum), (np.int32, chorus.Op.MAX, np.max),
                        (np.float64, chorus.Op.MIN, np.min)):
        x = cla.to_device(q, ins(1000, dt)[rank])
        comm.all_reduce(x, op=op)
        np.testing.assert_array_equal(x.get(), ref(np.stack(ins(1000, dt)), axis=0).astype(dt), err_msg=str(dt))
    # out of place into a view at an offset of a larger array (its bytes around stay)
    big = cla.to_device(q, np.full(64, -7, np.int64))
    comm.all_reduce(cla.to_device(q, ins(20, np.int64)[rank]), big[10:30], op=chorus.Op.SUM)
    got = big.get()
    np.testing.assert_array_equal(got[10:30], np.sum(np.stack(ins(20, np.int64)), axis=0))
    assert (got[:10] == -7).all() and (got[30:] == -7).all(), got
    # broadcast from the last rank, all_gather, reduce_scatter
    b = cla.to_device(q, _data(rank, 33, np.float32, salt=9))
    comm.broadcast(b, root=world - 1)
    np.testing.assert_array_equal(b.get(), _data(world - 1, 33, np.float32, salt=9))
    g = cla.zeros(q, 9 * world, np.float32)
    comm.all_gather(cla.to_device(q, ins(9, np.float32)[rank]), g)
    np.testing.assert_array_equal(g.get(), np.concatenate(ins(9, np.float32)))
    rs = cla.zeros(q, 5, np.float32)
    comm.reduce_scatter(cla.to_device(q, ins(5 * world, np.float32)[rank]), rs, op=chorus.Op.SUM)
    np.testing.assert_array_equal(rs.get(), np.sum(np.stack(ins(5 * world, np.float32)), axis=0)[rank * 5:rank * 5 + 5])
    # on a stream of the queue: two calls return at once, the queue's later
    # read (arr.get(), same queue) sees both in order
    s = chorus.Stream.opencl(q)
    y = cla.to_device(q, ins(4099, np.float32)[rank])
    comm.all_reduce(y, stream=s)
    comm.all_reduce(y, stream=s)
    want = np.sum(np.stack(ins(4099, np.float32)), axis=0) * world
    np.testing.assert_array_equal(y.get(), want)
    s.synchronize()
    # a NumPy array on an OpenCL stream is refused, naming the argument
    try:
        comm.all_reduce(np.ones(4, np.float32), stream=s)
    except chorus.Error as e:  # noqa: F841
        assert "not in a registered OpenCL buffer" in str(e), str(e)
    else:
        raise AssertionError("a host array on an OpenCL stream was accepted")
    comm.close()


def main():
    try:
        import pyopencl as cl
    except ImportError as e:
        print(f"FAIL pyopencl is not installed ({e}); scripts/setup.sh installs python3-pyopencl", flush=True)
        sys.exit(1)
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:
        platforms = []
        print(f"no OpenCL platform: {e}")
    if not platforms:
        print("SKIP: no OpenCL platform (Debian: pocl-opencl-icd)", flush=True)
        return
    import multiprocessing as mp

    checks = harness.Checks()
    checks.run("pyopencl_collectives_2ranks", harness.run, _device_collectives, 2, 120, mp.Queue())
    checks.finish()


if __name__ == "__main__":
    main()
