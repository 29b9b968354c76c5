"""A small MoE layer over chorus.moe.ExpertParallel (router + experts as
linear layers + dispatch/combine + backward through both) on 2 and 4 ranks,
against a single-process reference that this file computes on its own: it
regenerates every rank's tokens and weights from seeds, groups the rows for
each rank's experts with its own loops, and sums in chorus.h's documented
order (per rank holding a token's experts, ascending expert id, from +0; the
partials in ascending rank order, from +0) with autograd Functions whose
backward follows the same order.  Forward outputs and every gradient (the
tokens, the router's weights, the experts' weights) must be bitwise equal.
Also: bad input raises on every rank."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

E_PER_RANK = 2
TOPK = 3
HIDDEN = 16


def _params(world):
    """Every rank's tokens and router copy, every expert, the loss weights: the same in every process."""
    import torch

    g = torch.Generator().manual_seed(1234)
    experts = world * E_PER_RANK
    tokens = [5 + 3 * q for q in range(world)]
    xs = [torch.randn(tokens[q], HIDDEN, generator=g) for q in range(world)]
    wg = torch.randn(experts, HIDDEN, generator=g)
    we = [torch.randn(HIDDEN, HIDDEN, generator=g) / 4 for _ in range(experts)]
    lossw = [torch.randn(tokens[q], HIDDEN, generator=g) for q in range(world)]
    return experts, xs, wg, we, lossw


def _route(x, wg):
    import torch

    probs = torch.softmax(x @ wg.t(), dim=-1)
    vals, idx = probs.topk(TOPK, dim=-1)
    return vals, idx


# ---------------------------------------------------------------- reference (one process)

def _reference(world):
    """Per rank: (out, grad_x, grad_wg) and per expert grad_we, computed in one process."""
    import torch

    experts, xs0, wg0, we0, lossw = _params(world)
    xs = [x.clone().requires_grad_(True) for x in xs0]
    wgs = [wg0.clone().requires_grad_(True) for _ in range(world)]  # each rank's router copy
    we = [w.clone().requires_grad_(True) for w in we0]
    routes = [_route(xs[q], wgs[q]) for q in range(world)]
    idx = [r[1].detach() for r in routes]
    rank_of = lambda e: e // E_PER_RANK  # noqa: E731

    # Rows of rank r: (expert, source rank, token, choice), expert-major, then source rank, then token.
    rows = []
    for r in range(world):
        rr = []
        for e in range(r * E_PER_RANK, (r + 1) * E_PER_RANK):
            for q in range(world):
                for t in range(xs[q].shape[0]):
                    for j in range(TOPK):
                        if int(idx[q][t, j]) == e:
                            rr.append((e, q, t, j))
        rows.append(rr)

    class RefDispatch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):  # xs..., vals...
            xin, vin = inputs[:world], inputs[world:]
            outs = []
            for r in range(world):
                outs.append(torch.stack([xin[q][t] for (_, q, t, _) in rows[r]]) if rows[r]
                            else torch.zeros(0, HIDDEN))
                outs.append(torch.tensor([float(vin[q][t, j]) for (_, q, t, j) in rows[r]], dtype=torch.float32))
            return tuple(outs)

        @staticmethod
        def backward(ctx, *grads):
            gx = [torch.zeros(xs[q].shape) for q in range(world)]
            gv = [torch.zeros(TOPK * xs[q].shape[0]).view(-1, TOPK) for q in range(world)]
            for q in range(world):
                for t in range(xs[q].shape[0]):
                    acc = torch.zeros(HIDDEN)
                    for r in range(world):
                        part, seen = torch.zeros(HIDDEN), False
                        # the token's rows on r, in ascending expert id (rows are expert-major)
                        for i, (e, qq, tt, j) in enumerate(rows[r]):
                            if qq == q and tt == t:
                                part = part + grads[2 * r][i]
                                seen = True
                                gv[q][t, j] = grads[2 * r + 1][i]
                        if seen:
                            acc = acc + part
                    gx[q][t] = acc
            return tuple(gx) + tuple(gv)

    class RefCombine(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):  # (y_r, w_r) for each r
            ctx.save_for_backward(*inputs)
            outs = []
            for q in range(world):
                o = torch.zeros(xs[q].shape)
                for t in range(xs[q].shape[0]):
                    acc = torch.zeros(HIDDEN)
                    for r in range(world):
                        y, w = inputs[2 * r], inputs[2 * r + 1]
                        part, seen = torch.zeros(HIDDEN), False
                        for i, (e, qq, tt, j) in enumerate(rows[r]):
                            if qq == q and tt == t:
                                part = part + w[i] * y[i]
                                seen = True
                        if seen:
                            acc = acc + part
                    o[t] = acc
                outs.append(o)
            return tuple(outs)

        @staticmethod
        def backward(ctx, *gouts):
            saved = ctx.saved_tensors
            grads = []
            for r in range(world):
                y, w = saved[2 * r], saved[2 * r + 1]
                g = (torch.stack([gouts[q][t] for (_, q, t, _) in rows[r]]) if rows[r] else torch.zeros(0, HIDDEN))
                grads.append(g * w[:, None])
                grads.append((g * y).sum(1))
            return tuple(grads)

    disp = RefDispatch.apply(*xs, *[r[0] for r in routes])
    ys = []
    for r in range(world):
        rx, rw = disp[2 * r], disp[2 * r + 1]
        counts = [sum(1 for row in rows[r] if row[0] == e) for e in range(r * E_PER_RANK, (r + 1) * E_PER_RANK)]
        y = torch.cat([torch.nn.functional.linear(g, we[r * E_PER_RANK + i]) for i, g in enumerate(rx.split(counts))])
        ys += [y, rw]
    outs = RefCombine.apply(*ys)
    loss = sum((outs[q] * lossw[q]).sum() for q in range(world))
    loss.backward()
    return ([(outs[q].detach(), xs[q].grad, wgs[q].grad) for q in range(world)], [w.grad for w in we], rank_of)


# ---------------------------------------------------------------- the distributed layer

def _moe(rank, world, ids):
    import torch

    import chorus
    import chorus.torch  # noqa: F401  (chorus.torch.ExpertParallel is chorus.moe's)

    torch.set_num_threads(1)
    comm = harness.comm(rank, world, ids)
    experts, xs0, wg0, we0, lossw = _params(world)
    ep = chorus.torch.ExpertParallel(comm, experts, TOPK, HIDDEN, torch.float32)
    assert ep.num_local_experts == E_PER_RANK
    x = xs0[rank].clone().requires_grad_(True)
    wg = wg0.clone().requires_grad_(True)
    local = [we0[rank * E_PER_RANK + i].clone().requires_grad_(True) for i in range(E_PER_RANK)]
    vals, idx = _route(x, wg)
    recv_x, recv_w, counts = ep.dispatch(x, idx, vals)
    y = torch.cat([torch.nn.functional.linear(g, w) for g, w in zip(recv_x.split(counts), local)])
    out = ep.combine(y, recv_w)
    (out * lossw[rank]).sum().backward()

    ref, ref_we, _ = _reference(world)
    r_out, r_gx, r_gwg = ref[rank]

    def same(a, b, what):
        assert a.shape == b.shape, "{}: shape {} vs reference {}".format(what, a.shape, b.shape)
        if not torch.equal(a, b):
            d = (a - b).abs().max().item()
            raise AssertionError("rank {}: {} differs from the reference (max |diff| {:.3g})".format(rank, what, d))

    same(out.detach(), r_out, "combine output")
    same(x.grad, r_gx, "gradient of the tokens")
    same(wg.grad, r_gwg, "gradient of the router")
    for i in range(E_PER_RANK):
        same(local[i].grad, ref_we[rank * E_PER_RANK + i], "gradient of expert {}".format(rank * E_PER_RANK + i))
    assert x.grad.abs().sum() > 0 and wg.grad.abs().sum() > 0, "gradients are zero: the test would prove nothing"
    comm.close()


def _errors(rank, world, ids):
    import torch

    import chorus
    import chorus.moe

    comm = harness.comm(rank, world, ids)
    ep = chorus.moe.ExpertParallel(comm, 2 * world, 2, 4, torch.float32)
    idx = torch.tensor([[0, 1], [1, 2]], dtype=torch.int64)
    if rank == world - 1:
        idx[1, 1] = 2 * world  # out of range on the last rank only
    try:
        ep.layout(idx)
        raise AssertionError("rank {}: an out-of-range expert id was accepted".format(rank))
    except chorus.Error as e:
        want = "topkIdx[3]" if rank == world - 1 else "rank {} refused".format(world - 1)
        assert want in str(e), "rank {}: '{}' not in {}".format(rank, want, e)
    # The communicator goes on: a good layer step.
    idx[1, 1] = 2
    x = torch.ones(2, 4)
    recv_x, recv_w, counts = ep.dispatch(x, idx, torch.ones(2, 2))
    out = ep.combine(recv_x, recv_w)
    assert torch.equal(out, torch.full((2, 4), 2.0)), "rank {}: {}".format(rank, out)
    # fp8 dispatch: a block's largest element crosses exactly (scale = amax / 256), so all-equal rows do.
    ep8 = chorus.moe.ExpertParallel(comm, 2 * world, 2, 4, torch.float32, dispatch_compress="fp8", fp8_block=32)
    recv_x, recv_w, counts = ep8.dispatch(torch.full((2, 4), 3.0), idx, torch.ones(2, 2))
    assert torch.equal(recv_x, torch.full(recv_x.shape, 3.0)), "rank {}: fp8 dispatch gave {}".format(rank, recv_x)
    out = ep8.combine(recv_x, recv_w)
    assert torch.equal(out, torch.full((2, 4), 6.0)), "rank {}: {}".format(rank, out)
    try:
        chorus.moe.ExpertParallel(comm, 2 * world, 2, 4, torch.float32, dispatch_compress="zip")
        raise AssertionError("dispatch_compress='zip' was accepted")
    except ValueError as e:
        assert "'off', 'bf16' or 'fp8'" in str(e), str(e)
    try:
        chorus.moe.ExpertParallel(comm, 2 * world, 2, 4, torch.float32, max_hosts_per_token=-1)
        raise AssertionError("max_hosts_per_token=-1 was accepted")
    except chorus.Error as e:
        assert "config.maxHostsPerToken=-1 must be >= 0" in str(e), str(e)
    comm.close()


def main():
    checks = harness.Checks()
    for world in (2, 4):
        checks.run("moe_layer_bitwise_{}ranks".format(world), harness.run, _moe, world, 240, mp.Queue())
        checks.run("moe_errors_{}ranks".format(world), harness.run, _errors, world, 120, mp.Queue())
    checks.finish()


if __name__ == "__main__":
    main()
