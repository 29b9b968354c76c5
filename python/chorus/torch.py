"""The torch.distributed backend "chorus".

Importing this module registers the backend; then, with any init_method
(env://, tcp://, file://, a Store)::

    import torch.distributed as dist
    import chorus.torch  # noqa: F401
    dist.init_process_group("chorus", rank=rank, world_size=world_size)

The backend is a c10d ProcessGroup (C++, torch 1.13) over chorus: CPU tensors
of int8/uint8/bool/int32/int64/float16/bfloat16/float32/float64, the ops
allreduce (SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM), allreduce_coalesced,
broadcast, reduce, allgather, _allgather_base, allgather_coalesced, gather,
scatter, reduce_scatter, _reduce_scatter_base, alltoall_base, alltoall, send,
recv and barrier.  Operations run in issue order on one background thread per
group; ``Work.wait()`` raises RuntimeError with chorus's message when an
operation fails (e.g. a peer died), and aborts the group when the group's
timeout expires.  It rendezvouses through the Store that init_process_group
hands it: no extra port or environment variable.

Not supported: recv from any source (chorus matches messages per peer),
message tags (messages between two ranks match in issue order), BAND/BOR/BXOR.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as _dist

from . import _chorus_torch

BACKEND_NAME = "chorus"


def _create(store: "_dist.Store", rank: int, world_size: int, timeout: timedelta) -> "_dist.ProcessGroup":
    return _chorus_torch.create_process_group(store, rank, world_size, timeout)


def abort(group: "_dist.ProcessGroup | None" = None) -> None:
    """Aborts a chorus process group (default: the default group): every
    pending and later operation on it fails at once."""
    pg = group if group is not None else _dist.distributed_c10d._get_default_group()
    _chorus_torch.abort(pg)


def _register() -> None:
    if BACKEND_NAME.upper() not in _dist.Backend._plugins:
        _dist.Backend.register_backend(BACKEND_NAME, _create)


_register()

__all__ = ["BACKEND_NAME", "abort"]
