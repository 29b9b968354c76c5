"""One rank of test_chorus_run.py, launched by chorus-run: the communicator
comes from chorus-run's environment, the torch group from a FileStore
(argv[1]) with the rank and size chorus-run assigned."""

import json
import os
import sys
from datetime import timedelta

import numpy as np

import chorus

with chorus.Communicator.from_env() as comm:
    rank, world = comm.rank, comm.size
    assert rank == int(os.environ["CHORUS_RANK"]) and world == int(os.environ["CHORUS_WORLD_SIZE"])
    x = np.full(1000, rank + 1, np.float64)
    comm.all_reduce(x)
    assert (x == world * (world + 1) / 2).all(), x

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import chorus.torch  # noqa: E402,F401

dist.init_process_group("chorus", init_method="file://" + sys.argv[1], rank=rank, world_size=world,
                        timeout=timedelta(seconds=60))
t = torch.full((257,), float(rank), dtype=torch.bfloat16)
dist.all_reduce(t)
assert torch.equal(t, torch.full((257,), float(sum(range(world))), dtype=torch.bfloat16)), t
outs = [torch.zeros(3, dtype=torch.int64) for _ in range(world)]
dist.all_gather(outs, torch.full((3,), rank, dtype=torch.int64))
assert [int(o[0]) for o in outs] == list(range(world))
dist.destroy_process_group()
print(json.dumps({"rank": rank, "world": world, "ok": True}), flush=True)
