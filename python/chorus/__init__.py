"""chorus: collective communication for distributed deep learning, from Python.

A thin, zero-copy binding of chorus's C API (include/chorus/chorus.h).  Buffers
are NumPy arrays (or anything exposing the buffer protocol) and CPU torch
tensors; they are never copied, and must be C-contiguous.

Start a job with ``chorus-run -n 4 python3 train.py`` (or torchrun, mpirun,
Slurm) and create the communicator from the environment::

    import numpy as np, chorus
    with chorus.Communicator.from_env() as comm:
        x = np.full(1024, comm.rank, dtype=np.float32)
        comm.all_reduce(x)                      # in place, blocking
        s = chorus.Stream()
        h = comm.all_reduce(x, op=chorus.Op.MAX, stream=s)   # asynchronous
        h.wait()

or without a launcher: rank 0 creates a ``UniqueId``, sends ``bytes(uid)`` to
the others over any channel, and each calls
``Communicator.from_unique_id(nranks, uid, rank)``.

Semantics follow chorus.h: operations on one communicator match across ranks
in the order they are issued; ``stream=None`` blocks (the GIL is released
meanwhile), a :class:`Stream` runs calls in the background and keeps their
buffers alive until it is synchronised; ``with chorus.group():`` issues the
enclosed sends, receives and collectives as one unit.  Every failure raises a
subclass of :class:`chorus.Error` whose message is chorus's own (which rank,
which peer, which values, a likely fix) and whose ``code`` is a
:class:`chorus.Result`.

For PyTorch, ``import chorus.torch`` registers the torch.distributed backend
"chorus": ``torch.distributed.init_process_group("chorus", ...)``.
"""

from __future__ import annotations

import enum as _enum

from ._chorus import (  # noqa: F401  (re-exported API)
    AbortedError,
    RevokedError,
    Communicator,
    DataType,
    Error,
    ExpertParallel,
    Handle,
    InProgressError,
    InternalError,
    InvalidArgumentError,
    InvalidUsageError,
    KvAgent,
    MismatchError,
    RemoteError,
    Result,
    Stream,
    SystemError,
    TimeoutError,
    UniqueId,
    error_string,
    group_end,
    group_start,
    version,
)
from . import _chorus


class Op(_enum.IntEnum):
    """Reduction operators (chorusRedOp_t).  Ops made by
    :meth:`Communicator.premul_sum` are plain ints beyond these."""

    SUM = _chorus.SUM
    PROD = _chorus.PROD
    MAX = _chorus.MAX
    MIN = _chorus.MIN
    AVG = _chorus.AVG


def group() -> "_chorus._Group":
    """Context manager around chorusGroupStart/chorusGroupEnd: the calls in
    the block are issued as one unit, so matching sends and receives in any
    order complete without deadlock.  Groups may nest."""
    return _chorus._Group()


def _comm_enter(self: Communicator) -> Communicator:
    return self


def _comm_exit(self: Communicator, *exc: object) -> None:
    self.close()


# Communicators are context managers that close (chorusCommDestroy) on exit.
Communicator.__enter__ = _comm_enter  # type: ignore[attr-defined]
Communicator.__exit__ = _comm_exit  # type: ignore[attr-defined]

__version__ = "{}.{}.{}".format(version() // 10000, version() // 100 % 100, version() % 100)

__all__ = [
    "AbortedError", "RevokedError", "Communicator", "DataType", "Error", "ExpertParallel", "Handle",
    "InProgressError", "InternalError",
    "InvalidArgumentError", "InvalidUsageError", "KvAgent", "MismatchError", "Op", "RemoteError", "Result", "Stream",
    "UniqueId", "error_string", "group", "group_end", "group_start", "version",
]  # chorus.SystemError and chorus.TimeoutError stay qualified: a star import must not shadow the builtins
