"""A small GPT trained on CPU ranks through chorus's torch backend, with Megatron-style parallelism.

    chorus-run -n 8 -- python3 -m chorus.examples.train_gpt --tp 2 --pp 2 --dp 2 --layers 4 --hidden 256 \\
        --heads 8 --seq 128 --micro-batch 2 --micro-batches 4 --steps 6
    python3 -m chorus.examples.train_gpt --layers 4 --hidden 256 ... --micro-batches 8   # one process
    python3 -m chorus.examples.train_gpt --print-model-json --layers 4 --hidden 256 ...   # chorus-sim's model

Ranks are laid out as Megatron-LM does: rank = (stage x dp + replica) x tp + tp_rank (tensor-parallel ranks
adjacent).  Parallelism:

- **Tensor** (Megatron-LM, Shoeybi et al. 2019, sec. 3): the QKV and FC1 linears are column-parallel (each tp
  rank holds heads / tp heads and ffn / tp columns), the attention projection and FC2 are row-parallel; their
  biases are added after the reduction.  The operator ``f`` before a column-parallel linear is the identity
  forward and an allreduce of the input gradient backward; ``g`` after a row-parallel linear is an allreduce
  forward and the identity backward.  The output head is vocab-parallel (``f``, then each tp rank's vocab / tp
  logits) with Megatron's vocab-parallel cross-entropy: three allreduces (max, target logit, sum of exp).
  The embeddings, layer norms and row-parallel biases are replicated; their gradients are equal on every tp
  rank because the gradients reaching them went through ``f``'s allreduce.
- **Pipeline**: the layers are split into pp contiguous stages (the first holds the embeddings, the last the
  final norm, head and loss).  Micro-batches run 1F1B (Narayanan et al. 2021, PipeDream-Flush): stage s
  runs min(pp - s - 1, M) warm-up forwards, then alternates one forward and one backward, then drains.
  Activations and their gradients cross stages with send/recv on the stage pair's group; the exchanges
  that send one way and receive the other go as one ``batch_isend_irecv`` (a chorus group), as Megatron's
  ``send_forward_recv_backward`` and ``send_backward_recv_forward``.
- **Data**: each replica runs its own M micro-batches; the flat gradient of a stage is allreduced over the
  replicas (SUM, then / dp) before the SGD step.

Every parameter is drawn whole from a generator seeded by (seed, parameter name), and a rank keeps its
slice, so any layout trains the same model as one process given the same global batch (dp x M micro-batches
of B sequences; global micro-batch j of step k is seeded by (seed, k, j)).  The loss of each step is the mean
over the global batch, printed before the update.

Output: rank 0 prints one line ``TRAIN_GPT {json}``: the layout, the losses, and per rank the median over
the steps after ``--warmup`` of the step time and of its split: ``tp_s`` (time in the tensor-parallel
allreduces), ``pp_s`` (in sends and receives, waits for the neighbouring stage included), ``dp_s`` (the
gradient allreduce) and ``compute_s`` (the rest: kernels, the optimizer and Python).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import zlib
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

# Seconds spent in communication during the current step, by kind.
_COMM = {"tp": 0.0, "pp": 0.0, "dp": 0.0}
_FAULT = {"skip_tp_allreduce": False}


def _timed(kind, fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    _COMM[kind] += time.perf_counter() - t0
    return out


def _allreduce(t, group, kind, op=None):
    if group is None:
        return
    if op is None:
        _timed(kind, dist.all_reduce, t, group=group)
    else:
        _timed(kind, dist.all_reduce, t, op=op, group=group)


class _CopyToTp(torch.autograd.Function):
    """Megatron's f: identity forward, allreduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        g = grad.contiguous().clone()
        _allreduce(g, ctx.group, "tp")
        return g, None


class _ReduceFromTp(torch.autograd.Function):
    """Megatron's g: allreduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()
        if not _FAULT["skip_tp_allreduce"]:
            _allreduce(out, group, "tp")
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split by vocabulary across the tp group (Megatron's
    vocab_parallel_cross_entropy): per token, an allreduce of the max, of the target's logit and of the
    sum of exponentials.  Returns the per-token loss."""

    @staticmethod
    def forward(ctx, logits, target, vocab_start, group):
        logits = logits.float()
        m = logits.max(dim=-1)[0].contiguous()
        _allreduce(m, group, "tp", dist.ReduceOp.MAX)
        z = logits - m.unsqueeze(-1)
        local = target - vocab_start
        inside = (local >= 0) & (local < z.shape[-1])
        idx = local.clamp(0, z.shape[-1] - 1)
        picked = z.gather(-1, idx.unsqueeze(-1)).squeeze(-1) * inside
        picked = picked.contiguous()
        _allreduce(picked, group, "tp")
        e = z.exp()
        s = e.sum(dim=-1).contiguous()
        _allreduce(s, group, "tp")
        ctx.save_for_backward(e / s.unsqueeze(-1), idx, inside)
        return s.log() - picked

    @staticmethod
    def backward(ctx, grad):
        softmax, idx, inside = ctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(-1, idx.unsqueeze(-1), -inside.to(g.dtype).unsqueeze(-1))
        return g * grad.unsqueeze(-1), None, None, None


class Layout:
    def __init__(self, tp, pp, dp, rank):
        self.tp, self.pp, self.dp = tp, pp, dp
        self.world = tp * pp * dp
        self.rank = rank
        self.t = rank % tp
        self.d = (rank // tp) % dp
        self.s = rank // (tp * dp)

    def rank_of(self, s, d, t):
        return (s * self.dp + d) * self.tp + t


def _group_along(lay, axis, backend):
    """The groups that vary one coordinate ("t", "s" or "d") with the other two fixed, every one created (in
    the other two's order) and this rank's returned; None where that axis has one rank."""
    size = {"s": lay.pp, "d": lay.dp, "t": lay.tp}
    if size[axis] == 1:
        return None
    outer, inner = (k for k in "sdt" if k != axis)
    mine = None
    for a in range(size[outer]):
        for b in range(size[inner]):
            fixed = {outer: a, inner: b}
            g = dist.new_group([lay.rank_of(**fixed, **{axis: i}) for i in range(size[axis])], backend=backend)
            if (a, b) == (getattr(lay, outer), getattr(lay, inner)):
                mine = g
    return mine


def _make_groups(lay, backend):
    """Every rank creates every group in the same order (torch's rule): tp, then pp, then dp."""
    return tuple(_group_along(lay, axis, backend) for axis in "tsd")


class Stage(torch.nn.Module):
    """This rank's share of the model: its stage's layers, each linear's tp slice."""

    def __init__(self, a, lay, tp_group):
        super().__init__()
        self.a, self.lay, self.tp_group = a, lay, tp_group
        h, nh, T = a.hidden, a.heads, lay.tp
        self.hp = nh // T  # heads on this rank
        self.dh = h // nh
        ffn = 4 * h
        t = lay.t
        per = a.layers // lay.pp
        self.first = lay.s == 0
        self.last = lay.s == lay.pp - 1
        self.layer_ids = list(range(lay.s * per, (lay.s + 1) * per))

        def full(name, shape, std):
            g = torch.Generator().manual_seed(a.seed * 1000003 + zlib.crc32(name.encode()))
            return torch.randn(*shape, generator=g) * std

        def param(x):
            return torch.nn.Parameter(x.contiguous())

        std = 0.02
        out_std = 0.02 / math.sqrt(2 * a.layers)  # GPT-2's scaled init of the residual projections
        w = self.hp * self.dh
        f = ffn // T
        if self.first:
            self.tok = param(full("tok", (a.vocab, h), std))
            self.pos = param(full("pos", (a.seq, h), std))
        self.blocks = torch.nn.ModuleList()
        for i in self.layer_ids:
            b = torch.nn.Module()
            p = "layer{}.".format(i)
            b.ln1_w = param(1 + full(p + "ln1_w", (h,), std))
            b.ln1_b = param(full(p + "ln1_b", (h,), std))
            qkv_w = full(p + "qkv_w", (3 * h, h), std)
            qkv_b = full(p + "qkv_b", (3 * h,), std)
            rows = torch.cat([torch.arange(part * h + t * w, part * h + (t + 1) * w) for part in range(3)])
            b.qkv_w = param(qkv_w[rows])
            b.qkv_b = param(qkv_b[rows])
            b.proj_w = param(full(p + "proj_w", (h, h), out_std)[:, t * w:(t + 1) * w])
            b.proj_b = param(full(p + "proj_b", (h,), std))
            b.ln2_w = param(1 + full(p + "ln2_w", (h,), std))
            b.ln2_b = param(full(p + "ln2_b", (h,), std))
            b.fc1_w = param(full(p + "fc1_w", (ffn, h), std)[t * f:(t + 1) * f])
            b.fc1_b = param(full(p + "fc1_b", (ffn,), std)[t * f:(t + 1) * f])
            b.fc2_w = param(full(p + "fc2_w", (h, ffn), out_std)[:, t * f:(t + 1) * f])
            b.fc2_b = param(full(p + "fc2_b", (h,), std))
            self.blocks.append(b)
        if self.last:
            v = a.vocab // T
            self.lnf_w = param(1 + full("lnf_w", (h,), std))
            self.lnf_b = param(full("lnf_b", (h,), std))
            self.head_w = param(full("head_w", (a.vocab, h), std)[t * v:(t + 1) * v])
            self.vocab_start = t * v
        mask = torch.full((a.seq, a.seq), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def _block(self, b, x):
        B, S, H = x.shape
        g = self.tp_group
        y = F.layer_norm(x, (H,), b.ln1_w, b.ln1_b)
        y = _CopyToTp.apply(y, g)
        qkv = F.linear(y, b.qkv_w, b.qkv_b)
        q, k, v = qkv.split(self.hp * self.dh, dim=-1)
        q, k, v = (z.view(B, S, self.hp, self.dh).transpose(1, 2) for z in (q, k, v))
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.dh)) + self.mask
        ctx = torch.matmul(att.softmax(dim=-1), v).transpose(1, 2).reshape(B, S, self.hp * self.dh)
        x = x + _ReduceFromTp.apply(F.linear(ctx, b.proj_w), g) + b.proj_b
        y = F.layer_norm(x, (H,), b.ln2_w, b.ln2_b)
        y = _CopyToTp.apply(y, g)
        y = F.gelu(F.linear(y, b.fc1_w, b.fc1_b))
        return x + _ReduceFromTp.apply(F.linear(y, b.fc2_w), g) + b.fc2_b

    def forward(self, x, target=None):
        """Stage input (token ids on the first stage) -> output (the loss, per-token mean, on the last)."""
        if self.first:
            x = F.embedding(x, self.tok) + self.pos
        for b in self.blocks:
            x = self._block(b, x)
        if not self.last:
            return x
        H = x.shape[-1]
        y = F.layer_norm(x, (H,), self.lnf_w, self.lnf_b)
        y = _CopyToTp.apply(y, self.tp_group)
        logits = F.linear(y, self.head_w)
        if self.tp_group is None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none")
        else:
            loss = _VocabParallelCrossEntropy.apply(logits, target, self.vocab_start, self.tp_group)
        return loss.mean()


def _batch(a, step, j):
    """Global micro-batch j of step k: B sequences x_{t+1} = x_t + c (mod vocab), random start and c."""
    g = torch.Generator().manual_seed(a.seed * 7919 + step * 100003 + j)
    start = torch.randint(0, a.vocab, (a.micro_batch, 1), generator=g)
    stride = torch.randint(1, 8, (a.micro_batch, 1), generator=g)
    seq = (start + stride * torch.arange(a.seq + 1)) % a.vocab
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


class Pipe:
    """Send/recv between neighbouring stages on the pipeline's group (timed as pp)."""

    def __init__(self, lay, group, shape):
        self.lay, self.group, self.shape = lay, group, shape
        self.prev = lay.rank_of(lay.s - 1, lay.d, lay.t) if lay.s > 0 else None
        self.next = lay.rank_of(lay.s + 1, lay.d, lay.t) if lay.s < lay.pp - 1 else None

    def _batch(self, ops):
        def run():
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        _timed("pp", run)

    def recv_forward(self):
        x = torch.empty(self.shape)
        _timed("pp", dist.recv, x, src=self.prev, group=self.group)
        return x

    def send_forward(self, y):
        _timed("pp", dist.send, y.detach().contiguous(), dst=self.next, group=self.group)

    def recv_backward(self):
        g = torch.empty(self.shape)
        _timed("pp", dist.recv, g, src=self.next, group=self.group)
        return g

    def send_backward(self, g):
        _timed("pp", dist.send, g.contiguous(), dst=self.prev, group=self.group)

    def send_forward_recv_backward(self, y):
        g = torch.empty(self.shape)
        self._batch([dist.P2POp(dist.isend, y.detach().contiguous(), self.next, self.group),
                     dist.P2POp(dist.irecv, g, self.next, self.group)])
        return g

    def send_backward_recv_forward(self, gx):
        x = torch.empty(self.shape)
        self._batch([dist.P2POp(dist.isend, gx.contiguous(), self.prev, self.group),
                     dist.P2POp(dist.irecv, x, self.prev, self.group)])
        return x


def _step(a, lay, stage, pipe, step):
    """One 1F1B iteration over this replica's micro-batches; returns the replica's mean loss (last stage)."""
    M = a.micro_batches
    first_mb = lay.d * M
    fwd_j = 0
    losses = []
    queue = []

    def forward(x):
        nonlocal fwd_j
        ids, target = _batch(a, step, first_mb + fwd_j)
        fwd_j += 1
        if stage.first:
            inp = ids
        else:
            inp = x.requires_grad_()
        out = stage(inp, target)
        if stage.last:
            losses.append(out.detach().item())
            out = out / M
        queue.append((inp, out))
        return out

    def backward(grad):
        inp, out = queue.pop(0)
        if stage.last:
            out.backward()
        else:
            out.backward(grad)
        return None if stage.first else inp.grad

    if pipe is None:  # pp = 1: forward and backward per micro-batch
        for _ in range(M):
            forward(None)
            backward(None)
        return sum(losses) / M
    warmup = min(lay.pp - lay.s - 1, M)
    remaining = M - warmup
    for _ in range(warmup):
        x = None if stage.first else pipe.recv_forward()
        y = forward(x)
        pipe.send_forward(y)
    x = None if stage.first or remaining == 0 else pipe.recv_forward()
    for i in range(remaining):
        y = forward(x)
        gy = None if stage.last else pipe.send_forward_recv_backward(y)
        gx = backward(gy)
        if stage.first:
            continue
        if i == remaining - 1:
            pipe.send_backward(gx)
        else:
            x = pipe.send_backward_recv_forward(gx)
    for _ in range(warmup):
        gy = pipe.recv_backward()
        gx = backward(gy)
        if not stage.first:
            pipe.send_backward(gx)
    return sum(losses) / M if losses else 0.0


def model_json(a):
    """The chorus-sim model file of this GPT (src/sim/config.cpp's format)."""
    return {
        "name": "train_gpt-L{}-H{}-A{}".format(a.layers, a.hidden, a.heads),
        "layers": a.layers, "hidden": a.hidden, "heads": a.heads, "ffn_hidden": 4 * a.hidden,
        "vocab": a.vocab, "activation": "gelu", "dropout": False, "qkv_bias": True, "o_bias": True,
        "tie_embeddings": False, "weight_bytes": 4, "dtype": "fp32",
    }


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m chorus.examples.train_gpt", description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches per replica and step")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1, help="steps left out of the timing medians")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank")
    p.add_argument("--timeout", type=float, default=300, help="seconds before a stuck collective fails")
    p.add_argument("--backend", default="chorus", help="torch.distributed backend (gloo: the same job on gloo)")
    p.add_argument("--print-model-json", action="store_true", help="print chorus-sim's model file and exit")
    p.add_argument("--fault", choices=["skip-tp-allreduce"], help="break the job on purpose (tests)")
    a = p.parse_args(argv)
    for k in ("tp", "pp", "dp", "layers", "hidden", "heads", "vocab", "seq", "micro_batch", "micro_batches",
              "steps", "threads"):
        if getattr(a, k) < 1:
            p.error("--{} must be >= 1".format(k.replace("_", "-")))
    if a.hidden % a.heads:
        p.error("--hidden {} is not a multiple of --heads {}".format(a.hidden, a.heads))
    if a.heads % a.tp or a.vocab % a.tp:
        p.error("--tp {} must divide --heads {} and --vocab {}".format(a.tp, a.heads, a.vocab))
    if a.layers % a.pp:
        p.error("--pp {} must divide --layers {}".format(a.pp, a.layers))
    if a.warmup >= a.steps:
        p.error("--warmup {} leaves no step to time (--steps {})".format(a.warmup, a.steps))
    return a


def main(argv=None):
    a = parse(argv)
    if a.print_model_json:
        print(json.dumps(model_json(a), indent=2))
        return 0
    torch.set_num_threads(a.threads)
    _FAULT["skip_tp_allreduce"] = a.fault == "skip-tp-allreduce"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != a.tp * a.pp * a.dp:
        raise SystemExit("train_gpt: tp x pp x dp = {} but WORLD_SIZE = {} (launch {} ranks)".format(
            a.tp * a.pp * a.dp, world, a.tp * a.pp * a.dp))
    rank = 0
    if world > 1:
        if a.backend == "chorus":
            import chorus.torch  # noqa: F401  registers the "chorus" backend

        dist.init_process_group(a.backend, init_method="env://", timeout=timedelta(seconds=a.timeout))
        rank = dist.get_rank()
    lay = Layout(a.tp, a.pp, a.dp, rank)
    tp_group, pp_group, dp_group = _make_groups(lay, a.backend) if world > 1 else (None, None, None)
    stage = Stage(a, lay, tp_group)
    pipe = Pipe(lay, pp_group, (a.micro_batch, a.seq, a.hidden)) if a.pp > 1 else None
    opt = torch.optim.SGD(stage.parameters(), lr=a.lr)
    params = list(stage.parameters())
    if world > 1:
        dist.barrier()
    rows = []  # per step: total, tp, pp, dp
    losses = []
    for step in range(a.steps):
        for k in _COMM:
            _COMM[k] = 0.0
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        losses.append(_step(a, lay, stage, pipe, step))
        if dp_group is not None:
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            _allreduce(flat, dp_group, "dp")
            flat /= a.dp
            off = 0
            for p in params:
                p.grad.copy_(flat[off:off + p.numel()].view_as(p.grad))
                off += p.numel()
        opt.step()
        rows.append((time.perf_counter() - t0, _COMM["tp"], _COMM["pp"], _COMM["dp"]))
    timed = rows[a.warmup:]
    med = [statistics.median(r[i] for r in timed) for i in range(4)]
    compute = statistics.median(r[0] - r[1] - r[2] - r[3] for r in timed)
    mine = [med[0], compute, med[1], med[2], med[3]]
    # Rank 0 collects every rank's medians and the last stage's losses in one allreduce.
    buf = torch.zeros(world * 5 + a.steps, dtype=torch.float64)
    buf[rank * 5:(rank + 1) * 5] = torch.tensor(mine, dtype=torch.float64)
    if stage.last and lay.t == 0:
        buf[world * 5:] = torch.tensor(losses, dtype=torch.float64) / a.dp
    if world > 1:
        dist.all_reduce(buf)
    if rank == 0:
        per_rank = [dict(zip(("step_s", "compute_s", "tp_s", "pp_s", "dp_s"), buf[r * 5:(r + 1) * 5].tolist()))
                    for r in range(world)]
        out = {
            "tp": a.tp, "pp": a.pp, "dp": a.dp, "world": world, "layers": a.layers, "hidden": a.hidden,
            "heads": a.heads, "vocab": a.vocab, "seq": a.seq, "micro_batch": a.micro_batch,
            "micro_batches": a.micro_batches, "steps": a.steps, "warmup": a.warmup, "threads": a.threads,
            "losses": buf[world * 5:].tolist(),
            "step_s": max(r["step_s"] for r in per_rank),
            "compute_s": max(r["compute_s"] for r in per_rank),
            "comm_s": max(r["tp_s"] + r["pp_s"] + r["dp_s"] for r in per_rank),
            "ranks": per_rank,
        }
        print("TRAIN_GPT " + json.dumps(out), flush=True)
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
