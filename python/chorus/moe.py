"""MoE expert parallelism on CPU torch tensors: dispatch and combine with
autograd (chorus.h, "Expert parallelism"; docs/ep.md).

    import chorus, chorus.moe
    ep = chorus.moe.ExpertParallel(comm, num_experts=8, topk=2, hidden=64)  # comm: chorus.Communicator
    vals, idx = torch.softmax(x @ wg.t(), -1).topk(2, dim=-1)
    recv_x, recv_w, counts = ep.dispatch(x, idx, vals)     # rows grouped by local expert, counts per expert
    y = torch.cat([f(g) for f, g in zip(local_experts, recv_x.split(counts))])
    out = ep.combine(y, recv_w)                             # tokens x hidden, the weighted sum
    out.sum().backward()                                    # gradients reach x, the gate scores and the experts

Expert e lives on rank e // (num_experts // size).  Backward: dispatch's is a
combine without weights (each token's row gradients summed, in combine's
order) and the gate scores' gradients sent back to their (token, k); combine's
is a dispatch of the output's gradient, then per row ``w * g`` for the expert
output and ``(g * y).sum(1)`` for the weight.  Deterministic: the sums run in
chorus.h's documented order, so forward and gradients are bitwise what a
single process computes in that order (tests/python/test_torch_moe.py).

dispatch_compress ("bf16" or "fp8", fp8_block): dispatch's wire is compressed (chorus.h's
dispatchCompress); the gradient treats it as exact (straight through), and combine's backward, being a
dispatch of the output's gradient, crosses compressed too.  ``dispatch_fp8`` hands the experts the fp8
codes and per-block scales themselves instead of decoding them (no autograd).

Decode (low_latency_max_tokens = M > 0): ``low_latency_dispatch`` / ``low_latency_combine`` skip the
layout and the count exchange (fixed blocks of M tokens per rank, DeepEP's low-latency shape); no autograd.

One handle holds one layer's routing: a layer's dispatch, combine and their
backward must not interleave with another layer's on the same handle (use one
ExpertParallel per MoE layer).
"""

from __future__ import annotations

import torch

from . import _chorus

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


class ExpertParallel:
    """Collective: every rank creates it with the same arguments."""

    def __init__(self, comm, num_experts, topk, hidden, dtype=torch.float32, max_hosts_per_token=0,
                 dispatch_compress="off", fp8_block=-1, low_latency_max_tokens=0):
        if dtype not in _DTYPES:
            raise TypeError("dtype must be torch.float32 or torch.bfloat16, got {}".format(dtype))
        self.comm = comm
        self.num_experts, self.topk, self.hidden, self.dtype = num_experts, topk, hidden, dtype
        self.handle = _chorus.ExpertParallel(comm, num_experts, topk, hidden, _DTYPES[dtype], "int64",
                                             max_hosts_per_token, dispatch_compress, fp8_block,
                                             low_latency_max_tokens)
        self.low_latency_max_tokens = low_latency_max_tokens
        self.fp8_block = fp8_block
        self.last_layout = None

    @property
    def num_local_experts(self):
        return self.handle.num_local_experts

    def layout(self, topk_idx):
        """The dispatch layout of topk_idx (tokens x topk, int64): a dict of counts (see _chorus)."""
        self.last_layout = self.handle.layout(topk_idx.to(torch.int64).contiguous())
        self._tokens = topk_idx.shape[0]
        return self.last_layout

    def dispatch(self, x, topk_idx, topk_weights):
        """(recv_x, recv_weights, recv_per_expert): x (tokens x hidden) and topk_weights (tokens x topk,
        float32) are differentiable."""
        lay = self.layout(topk_idx)
        recv_x, recv_w = _Dispatch.apply(self, x, topk_weights)
        return recv_x, recv_w, list(lay["recv_per_expert"])

    def dispatch_fp8(self, x, topk_idx, topk_weights=None):
        """dispatch with the fp8 wire handed to the experts (dispatch_compress="fp8", hidden a multiple
        of fp8_block; DeepEP's fp8 recv_x): (recv_codes, recv_scales, recv_weights, recv_per_expert) with
        recv_codes num_recv x hidden e4m3 codes (torch.float8_e4m3fn where torch has it, else uint8
        bytes), recv_scales num_recv x (hidden / block) float32: element h of row i is
        codes[i, h] * scales[i, h // block], as the sender quantized it.  Rows grouped as dispatch's
        recv_x; combine undoes it.  No autograd (the codes are not differentiable)."""
        lay = self.layout(topk_idx)
        n = lay["num_recv"]
        block = 128 if self.fp8_block < 0 else self.fp8_block
        codes = torch.empty((n, self.hidden), dtype=torch.uint8)
        scales = torch.empty((n, self.hidden // block if self.hidden % block == 0 else 0), dtype=torch.float32)
        recv_w = torch.empty((n,), dtype=torch.float32)
        w = None if topk_weights is None else topk_weights.detach().to(torch.float32).contiguous()
        self.handle.dispatch_fp8(x.detach().contiguous(), w, codes, scales, recv_w)
        if hasattr(torch, "float8_e4m3fn"):
            codes = codes.view(torch.float8_e4m3fn)
        return codes, scales, recv_w, list(lay["recv_per_expert"])

    def combine(self, expert_out, weights):
        """tokens x hidden: each token's expert rows (expert_out, rows as dispatch's recv_x) weighted by
        weights (dispatch's recv_weights) and summed; both differentiable."""
        return _Combine.apply(self, expert_out, weights)

    def low_latency_dispatch(self, x, topk_idx, topk_weights=None):
        """Decode's dispatch (low_latency_max_tokens = M > 0; no layout, no count exchange first):
        (recv_x, recv_weights, counts) with recv_x num_local_experts x (size x M) x hidden, expert e's
        rows first in recv_x[e] (counts[e] of them), recv_weights num_local_experts x (size x M).  No
        autograd (inference)."""
        rows = self.handle.low_latency_rows
        if rows == 0:
            raise ValueError("low_latency_dispatch needs low_latency_max_tokens > 0")
        per = rows // self.num_local_experts
        recv_x = torch.empty((self.num_local_experts, per, self.hidden), dtype=self.dtype)
        recv_w = torch.empty((self.num_local_experts, per), dtype=torch.float32)
        counts = torch.empty((self.num_local_experts,), dtype=torch.int64)
        w = None if topk_weights is None else topk_weights.detach().to(torch.float32).contiguous()
        self.handle.low_latency_dispatch(topk_idx.to(torch.int64).contiguous(), x.detach().contiguous(), w,
                                         recv_x, recv_w, counts)
        self._ll_tokens = x.shape[0]
        return recv_x, recv_w, counts.tolist()

    def low_latency_combine(self, expert_out, weights=None):
        """Undoes the last low_latency_dispatch: expert_out (recv_x's shape) weighted by weights
        (recv_weights, or None: all 1) and summed per token, the same bits as combine.  No autograd."""
        out = torch.empty((self._ll_tokens, self.hidden), dtype=self.dtype)
        w = None if weights is None else weights.detach().to(torch.float32).contiguous()
        self.handle.low_latency_combine(expert_out.detach().contiguous(), w, out)
        return out

    # The raw collectives, on fresh tensors.
    def _dispatch_raw(self, x, topk_weights):
        n = self.last_layout["num_recv"]
        recv_x = torch.empty((n, self.hidden), dtype=self.dtype)
        recv_w = torch.empty((n,), dtype=torch.float32)
        w = None if topk_weights is None else topk_weights.detach().to(torch.float32).contiguous()
        self.handle.dispatch(x.detach().contiguous(), w, recv_x, recv_w)
        return recv_x, recv_w

    def _combine_raw(self, y, weights):
        out = torch.empty((self._tokens, self.hidden), dtype=self.dtype)
        w = None if weights is None else weights.detach().to(torch.float32).contiguous()
        self.handle.combine(y.detach().contiguous(), w, out)
        return out


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ep, x, topk_weights):
        ctx.ep = ep
        recv_x, recv_w = ep._dispatch_raw(x, topk_weights)
        return recv_x, recv_w

    @staticmethod
    def backward(ctx, g_rx, g_rw):
        ep = ctx.ep
        n = ep.last_layout["num_recv"]
        if g_rx is None:
            g_rx = torch.zeros((n, ep.hidden), dtype=ep.dtype)
        grad_x = ep._combine_raw(g_rx, None)  # per token: its rows' gradients summed, combine's order
        grad_w = None
        if ctx.needs_input_grad[2]:
            if g_rw is None:
                g_rw = torch.zeros((n,), dtype=torch.float32)
            grad_w = torch.empty((ep._tokens, ep.topk), dtype=torch.float32)
            ep.handle.return_topk(g_rw.to(torch.float32).contiguous(), grad_w)
        return None, grad_x, grad_w


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ep, y, weights):
        ctx.ep = ep
        ctx.save_for_backward(y, weights)
        return ep._combine_raw(y, weights)

    @staticmethod
    def backward(ctx, g_out):
        ep = ctx.ep
        y, weights = ctx.saved_tensors
        # Each row receives its token's output gradient (dispatch of g_out on the same layout).
        g_rows, _ = ep._dispatch_raw(g_out, None)
        grad_y = g_rows * weights.to(g_rows.dtype)[:, None]
        grad_w = (g_rows.to(torch.float32) * y.to(torch.float32)).sum(1)
        return None, grad_y, grad_w
