"""Type stubs of chorus._chorus_torch (python/src/process_group_chorus.cpp)."""

from datetime import timedelta

import torch
import torch.distributed as dist

def create_process_group(
    store: dist.Store, rank: int, world_size: int, timeout: timedelta, reproducible: int = -1
) -> dist.ProcessGroup: ...
def abort(process_group: dist.ProcessGroup) -> None: ...
def compressed_allreduce(process_group: dist.ProcessGroup, tensor: torch.Tensor, compress: int,
                         fp8_block: int = -1, average: bool = True) -> dist.Work: ...
