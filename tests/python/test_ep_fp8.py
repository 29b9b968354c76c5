"""chorus.moe.ExpertParallel.dispatch_fp8 (chorusEpDispatchFp8) on 2 ranks:
the e4m3 codes and per-block scales it hands out decode (code x scale,
rounded to the datatype) to exactly the rows the decoding fp8 dispatch
delivers; every scale is the block's amax / 256 of the token it came from
(each token is found by the rows' origin: the test makes every row of a rank
distinct); combine after it equals combine after the normal dispatch.  A
hidden size that is not a multiple of the block fails on every rank, naming it."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

E_PER_RANK = 2
TOPK = 2
BLOCK = 32
HIDDEN = 3 * BLOCK


def _tokens(torch, rank, experts, dtype):
    g = torch.Generator().manual_seed(7 + rank)
    x = (torch.randn(5 + rank, HIDDEN, generator=g) * 4).to(dtype)
    vals, idx = torch.softmax(torch.randn(5 + rank, experts, generator=g), -1).topk(TOPK, dim=-1)
    return x, idx, vals


def _e4m3_values(torch):
    """The value of each e4m3 (FN) code by its defining formula: S.EEEE.MMM, bias 7."""
    v = []
    for c in range(256):
        e, m = (c >> 3) & 15, c & 7
        a = m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        v.append(-a if c & 0x80 else a)
    return torch.tensor(v, dtype=torch.float32)


def _case(rank, world, ids):
    import torch

    import chorus
    import chorus.moe

    comm = harness.comm(rank, world, ids)
    experts = world * E_PER_RANK
    for dtype in (torch.float32, torch.bfloat16):
        x, idx, vals = _tokens(torch, rank, experts, dtype)
        ep = chorus.moe.ExpertParallel(comm, experts, TOPK, HIDDEN, dtype, dispatch_compress="fp8", fp8_block=BLOCK)
        with torch.no_grad():
            rx, rw, counts = ep.dispatch(x, idx, vals)
            out = ep.combine(rx * 3, rw)
            codes, scales, cw, ccounts = ep.dispatch_fp8(x, idx, vals)
            assert ccounts == counts and torch.equal(cw, rw), "rank {}: counts or weights differ".format(rank)
            assert codes.shape == (rx.shape[0], HIDDEN) and scales.shape == (rx.shape[0], HIDDEN // BLOCK)
            vals8 = _e4m3_values(torch)[codes.view(torch.uint8).long()]  # the codes' values (torch may lack float8)
            dec = (vals8.view(-1, HIDDEN // BLOCK, BLOCK) * scales.unsqueeze(-1)).view(-1, HIDDEN)
            assert torch.equal(dec.to(dtype), rx), "rank {}: codes x scales differ from the decoded dispatch".format(rank)
            # Every scale is amax / 256 of its block of some token of the job.
            allx = torch.cat([_tokens(torch, q, experts, dtype)[0] for q in range(world)]).to(torch.float32)
            want = {tuple(r.tolist()) for r in allx.abs().view(-1, HIDDEN // BLOCK, BLOCK).amax(-1) / 256}
            for i in range(scales.shape[0]):
                assert tuple(scales[i].tolist()) in want, "rank {}: row {}'s scales are no token's".format(rank, i)
            cout = ep.combine(rx * 3, rw)
            assert torch.equal(out, cout), "rank {}: combine after dispatch_fp8 differs".format(rank)
    bad = chorus.moe.ExpertParallel(comm, experts, TOPK, HIDDEN + 8, torch.float32, dispatch_compress="fp8",
                                    fp8_block=BLOCK)
    x, idx, vals = _tokens(torch, rank, experts, torch.float32)
    try:
        bad.dispatch_fp8(torch.zeros(x.shape[0], HIDDEN + 8), idx, vals)
        raise AssertionError("rank {}: a partial fp8 block was accepted".format(rank))
    except chorus.Error as e:
        assert "is not a multiple of the fp8 block 32" in str(e), "rank {}: {}".format(rank, e)
    comm.close()


def main():
    checks = harness.Checks()
    checks.run("ep_fp8_2ranks", harness.run, _case, 2, 180, mp.Queue())
    checks.finish()


if __name__ == "__main__":
    main()
