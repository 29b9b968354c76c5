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

Compressed gradients: ``chorus.torch.compressed_allreduce_hook`` is a DDP
communication hook (like torch's fp16_compress_hook) that averages each fp32
bucket with a chorus compressed allreduce: bf16 or fp8 on the wire, fp32 sums
(``model.register_comm_hook(chorus.torch.CompressedAllreduceState(group,
"fp8:256"), chorus.torch.compressed_allreduce_hook)``; state None: the
default group, bf16).  The error bound is in docs/algorithms.md.

Surviving a failure: ``chorus.torch.revoke(group)`` makes every rank's
in-flight and later operations on the group fail promptly; then every
survivor calls ``new = chorus.torch.reconfigure(group, shrink=True)`` for the
group of the ranks still alive, and later ``chorus.torch.reconfigure(group,
grow=n)`` while n new processes call ``chorus.torch.join(unique_id, store)``
(``chorus.torch.unique_id(group)`` is what they need).  torch 1.13 fixes a
ProcessGroup's rank and size, so reconfigure returns a new group and, when the
old one was the default group, installs it as the default (wrap the model in
a new DistributedDataParallel over it).  ``supports_reconfigure(group)`` says
whether a group can do this, in the shape newer torch gives its backends
(``supportsReconfigure`` / ``reconfigure``); docs/reliability.md.

Not supported: message tags (messages between two ranks match in issue
order), BAND/BOR/BXOR, monitored_barrier (torch implements it for gloo only).
"""

from __future__ import annotations

from datetime import timedelta

import torch
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


def _group(group: "_dist.ProcessGroup | None") -> "_dist.ProcessGroup":
    return group if group is not None else _dist.distributed_c10d._get_default_group()


def supports_reconfigure(group: "_dist.ProcessGroup | None" = None) -> bool:
    """Whether the group can be revoked, shrunk and grown (every chorus group
    can; any other backend's cannot)."""
    return _chorus_torch.supports_reconfigure(_group(group))


def revoke(group: "_dist.ProcessGroup | None" = None) -> None:
    """Revokes a chorus group on every rank: in-flight and later operations
    fail with chorus's "revoked" error naming this rank (safe from any
    thread).  Then the survivors reconfigure(group, shrink=True)."""
    _chorus_torch.revoke(_group(group))


def unique_id(group: "_dist.ProcessGroup | None" = None) -> bytes:
    """The unique id that a process joining this group's job passes to join()."""
    return _chorus_torch.unique_id(_group(group))


def _install(new: "_dist.ProcessGroup", old: "_dist.ProcessGroup | None", store: "_dist.Store | None") -> None:
    """Puts `new` in torch.distributed's books in place of `old` (default
    group: the new default group)."""
    c10d = _dist.distributed_c10d
    was_default = old is None or (c10d.GroupMember.WORLD is not None and old is c10d.GroupMember.WORLD)
    name = c10d._pg_names.pop(old, None) if old is not None else None
    backend, old_store = c10d._pg_map.pop(old, (BACKEND_NAME, None)) if old is not None else (BACKEND_NAME, None)
    if old is not None:
        c10d._pg_group_ranks.pop(old, None)
    c10d._pg_map[new] = (backend, store if store is not None else old_store)
    c10d._pg_names[new] = name if name is not None else "0"
    c10d._pg_group_ranks[new] = {i: i for i in range(new.size())}
    if was_default:
        c10d._update_default_pg(new)


def reconfigure(group: "_dist.ProcessGroup | None" = None, *, shrink: bool = False,
                grow: int = 0) -> "_dist.ProcessGroup":
    """The group after a membership change, collective over its members:
    shrink=True (every survivor, after a failure and a revoke): the ranks
    still alive, renumbered in order; grow=n: this group's ranks followed by
    n processes that call join() (both: shrink first, then grow).  The new
    group replaces the old one in torch.distributed (as the default group if
    the old one was); the old one is left broken or idle."""
    old = _group(group)
    if not shrink and grow <= 0:
        raise ValueError("reconfigure: nothing to do (shrink=True and/or grow=n with n >= 1)")
    if grow < 0:
        raise ValueError(f"reconfigure: grow={grow} is negative")
    new = old
    if shrink:
        new = _chorus_torch.shrink(new)
    if grow > 0:
        new = _chorus_torch.grow(new, grow)
    _install(new, old, None)
    return new


def join(unique_id: bytes, store: "_dist.Store", timeout: timedelta = timedelta(minutes=30),
         set_default: bool = True) -> "_dist.ProcessGroup":
    """A new process joins a chorus job's group when its ranks
    reconfigure(grow=n): unique_id from unique_id(group) on one of them, store
    a torch Store with the same keys as the group's (its any-source receives
    count messages there).  Returns the grown group, installed as this
    process's default group when set_default (then DistributedDataParallel
    and the torch.distributed calls use it)."""
    new = _chorus_torch.join(store, unique_id, timeout)
    if set_default:
        _install(new, None, store)
    return new


_WIRE_MODES = {"bf16": 1, "fp8": 2}  # CHORUS_COMPRESS_BF16, CHORUS_COMPRESS_FP8


class CompressedAllreduceState:
    """The state of compressed_allreduce_hook: the process group (None: the
    default group, which must be a chorus group) and the wire format, "bf16",
    "fp8" (128 elements per scale) or "fp8:BLOCK" (BLOCK 32..1024)."""

    def __init__(self, process_group: "_dist.ProcessGroup | None" = None, wire: str = "bf16") -> None:
        kind, _, block = wire.partition(":")
        if kind not in _WIRE_MODES or (block and (kind != "fp8" or not block.isdigit())):
            raise ValueError(f"CompressedAllreduceState: wire={wire!r} is not a wire format "
                             "(accepted: bf16, fp8, fp8:BLOCK with BLOCK 32..1024)")
        self.process_group = process_group
        self.wire = wire
        self.mode = _WIRE_MODES[kind]
        self.fp8_block = int(block) if block else -1  # chorus checks the range, naming it


def compressed_allreduce_hook(state: "CompressedAllreduceState | _dist.ProcessGroup | None",
                              bucket: "_dist.GradBucket") -> "torch.futures.Future":
    """DDP communication hook: averages the bucket over the group with a
    compressed allreduce (every rank gets the same bits).  ``state`` is a
    CompressedAllreduceState, or a process group / None for bf16 on it.  A
    bucket that is not float32 fails (chorus names the dtype) rather than
    going uncompressed."""
    if not isinstance(state, CompressedAllreduceState):
        state = CompressedAllreduceState(state)
    pg = state.process_group if state.process_group is not None else _dist.distributed_c10d._get_default_group()
    buf = bucket.buffer()
    work = _chorus_torch.compressed_allreduce(pg, buf, state.mode, state.fp8_block, True)
    return work.get_future().then(lambda fut: fut.value()[0])


# DDP's register_comm_hook compares the annotations of `bucket` and of the
# return value with the objects themselves, which `from __future__ import
# annotations` turned into strings.
compressed_allreduce_hook.__annotations__.update(
    {"bucket": _dist.GradBucket, "return": torch.futures.Future[torch.Tensor]})


def _register() -> None:
    if BACKEND_NAME.upper() not in _dist.Backend._plugins:
        _dist.Backend.register_backend(BACKEND_NAME, _create)


_register()

__all__ = ["BACKEND_NAME", "ExpertParallel", "abort", "join", "reconfigure", "revoke", "set_reproducible",
           "supports_reconfigure", "unique_id"]

# MoE expert parallelism with autograd (chorus.moe): dispatch and combine on CPU tensors.
from .moe import ExpertParallel  # noqa: E402,F401
