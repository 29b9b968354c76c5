"""The torch.distributed backend "chorus".

Importing this module registers the backend; then, with any init_method
(env://, tcp://, file://, a Store)::

    import torch.distributed as dist
    import chorus.torch  # noqa: F401
    dist.init_process_group("chorus", rank=rank, world_size=world_size)

The backend is a c10d ProcessGroup (C++, torch 1.13) over chorus: CPU tensors
of int8/uint8/bool/int32/int64/float16/bfloat16/float32/float64, the ops
allreduce (SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM; sparse COO tensors: SUM,
as gloo), allreduce_coalesced, broadcast, reduce, allgather, _allgather_base,
allgather_coalesced, gather, scatter, reduce_scatter, _reduce_scatter_base,
alltoall_base, alltoall, send, recv (from a given or any source), barrier and
batch_isend_irecv (one chorus group: completes in any order).  Operations run
in issue order on one background thread per group; ``Work.wait()`` raises
RuntimeError with chorus's message when an operation fails (e.g. a peer died),
and aborts the group when the op's timeout (a per-call option such as
``BarrierOptions.timeout``, else the group's) expires; ``Work.get_future()``
completes with the outputs (DDP communication hooks chain on it) and
``Work._source_rank()`` names a receive's sender.  It rendezvouses through the
Store that init_process_group hands it: no extra port or environment variable.
A receive from any source finds its sender through counts that every rank's
sends publish in that Store from a background thread (docs/python.md).

Reproducible reductions: ``chorus.torch.set_reproducible("canonical")`` (or
``"exact"``, ``"off"``, ``None`` for the ``CHORUS_REPRODUCIBLE`` environment
variable) before ``init_process_group`` makes the groups created afterwards
sum and average floating-point tensors bitwise identically whatever the
algorithm, chunk size, transport or rank placement (canonical), or correctly
rounded and identical across world sizes (exact; integer tensors are then
refused for SUM/AVG and every tensor for PRODUCT); docs/algorithms.md.

Not supported: message tags (messages between two ranks match in issue
order), BAND/BOR/BXOR, monitored_barrier (torch implements it for gloo only).
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as _dist

from . import _chorus_torch

BACKEND_NAME = "chorus"

_REPRODUCIBLE_MODES = {"off": 0, "canonical": 1, "exact": 2}
_reproducible = -1  # -1: CHORUS_REPRODUCIBLE (the environment)


def set_reproducible(mode: "str | None") -> None:
    """Sets the reproducibility mode of the chorus process groups created
    from now on: "off", "canonical", "exact", or None for the environment's
    CHORUS_REPRODUCIBLE (the default).  Every rank must use the same mode."""
    global _reproducible
    if mode is None:
        _reproducible = -1
        return
    if mode not in _REPRODUCIBLE_MODES:
        raise ValueError(f"set_reproducible: mode={mode!r} is not a mode (accepted: off, canonical, exact, None)")
    _reproducible = _REPRODUCIBLE_MODES[mode]


def _create(store: "_dist.Store", rank: int, world_size: int, timeout: timedelta) -> "_dist.ProcessGroup":
    return _chorus_torch.create_process_group(store, rank, world_size, timeout, _reproducible)


def abort(group: "_dist.ProcessGroup | None" = None) -> None:
    """Aborts a chorus process group (default: the default group): every
    pending and later operation on it fails at once."""
    pg = group if group is not None else _dist.distributed_c10d._get_default_group()
    _chorus_torch.abort(pg)


def _register() -> None:
    if BACKEND_NAME.upper() not in _dist.Backend._plugins:
        _dist.Backend.register_backend(BACKEND_NAME, _create)


_register()

__all__ = ["BACKEND_NAME", "abort", "set_reproducible"]
