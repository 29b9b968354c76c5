"""chorus.moe.ExpertParallel's low-latency mode (decode) on 2 and 4 ranks
against the normal dispatch/combine of the same tokens on the same ranks:
per local expert the same rows in the same order (at fixed offsets e x size x
M), the same weights, counts equal to the layout's recv_per_expert, and
combine's output bit for bit the normal one.  Also: a rank with more tokens
than M fails the call on every rank, and a handle without M refuses."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

E_PER_RANK = 2
TOPK = 3
HIDDEN = 24
M = 6


def _case(rank, world, ids):
    import torch

    import chorus
    import chorus.moe

    comm = harness.comm(rank, world, ids)
    experts = world * E_PER_RANK
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(99 + rank)
        tokens = M - rank % 3  # ranks send different token counts, all <= M
        x = torch.randn(tokens, HIDDEN, generator=g).to(dtype)
        scores = torch.softmax(torch.randn(tokens, experts, generator=g), -1)
        vals, idx = scores.topk(TOPK, dim=-1)
        normal = chorus.moe.ExpertParallel(comm, experts, TOPK, HIDDEN, dtype)
        ll = chorus.moe.ExpertParallel(comm, experts, TOPK, HIDDEN, dtype, low_latency_max_tokens=M)
        with torch.no_grad():
            rx, rw, counts = normal.dispatch(x, idx, vals)
            lx, lw, lcounts = ll.low_latency_dispatch(x, idx, vals)
            assert lcounts == counts, "rank {}: counts {} vs layout {}".format(rank, lcounts, counts)
            assert lx.shape == (E_PER_RANK, world * M, HIDDEN), lx.shape
            q = 0
            for e in range(E_PER_RANK):
                c = counts[e]
                assert torch.equal(lx[e, :c], rx[q:q + c]), "rank {}: expert {} rows differ".format(rank, e)
                assert torch.equal(lw[e, :c], rw[q:q + c]), "rank {}: expert {} weights differ".format(rank, e)
                q += c
            # Experts: a different scale per local expert; padding rows get garbage combine must ignore.
            y = torch.cat([rx[sum(counts[:e]):sum(counts[:e + 1])] * (e + 2) for e in range(E_PER_RANK)])
            ly = torch.full(lx.shape, float("nan")).to(dtype)
            for e in range(E_PER_RANK):
                ly[e, :counts[e]] = lx[e, :counts[e]] * (e + 2)
            out = normal.combine(y, rw)
            lout = ll.low_latency_combine(ly, lw)
            assert torch.equal(out.view(torch.int16) if dtype == torch.bfloat16 else out.view(torch.int32),
                               lout.view(torch.int16) if dtype == torch.bfloat16 else lout.view(torch.int32)), \
                "rank {}: low-latency combine is not bitwise the normal one".format(rank)
        # M + 1 tokens on the last rank: every rank fails, naming it.
        many = M + 1 if rank == world - 1 else 1
        xm = torch.ones(many, HIDDEN, dtype=dtype)
        im = torch.arange(many * TOPK, dtype=torch.int64).remainder(experts).view(many, TOPK)
        try:
            ll.low_latency_dispatch(xm, im, None)
            raise AssertionError("rank {}: an overflowing dispatch was accepted".format(rank))
        except chorus.Error as e:
            # The offending rank names its count; the others name that rank.
            want = "exceeds config.lowLatencyMaxTokens" if rank == world - 1 else "rank {}".format(world - 1)
            assert want in str(e), "rank {}: {}".format(rank, e)
        try:
            normal.low_latency_dispatch(x, idx, vals)
            raise AssertionError("a handle without low_latency_max_tokens took a low-latency dispatch")
        except ValueError as e:
            assert "low_latency_max_tokens" in str(e), str(e)
    comm.close()


def main():
    checks = harness.Checks()
    for world in (2, 4):
        checks.run("ep_low_latency_{}ranks".format(world), harness.run, _case, world, 180, mp.Queue())
    checks.finish()


if __name__ == "__main__":
    main()
