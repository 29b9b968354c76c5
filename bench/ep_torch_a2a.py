#!/usr/bin/env python3
"""MoE dispatch + combine written with torch.distributed's all_to_all_single
(gloo, CPU tensors): the comparison issue 36 asks for next to chorus-bench
dispatch|combine (bench/ep_netns.sh runs both on the same netns hosts).

The routing is chorus-bench's (plan::ep::uniformRoute, re-implemented here bit
for bit: the same splitmix64 stream), so the bytes are the same as chorus-bench
--form alltoallv moves: the per-(rank, expert) counts exchanged first, one row
per (token, expert) sorted by expert, all_to_all_single of the rows and of the
weights, the received rows sorted into expert-major order; combine is the
reverse and the weighted sum at home.  Identity experts: the combined output
must be x * sum(weights), checked once.

One rank per process; RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the
environment (torchrun's), --hosts equal groups of consecutive ranks.
Prints one JSON line per op and repeat on rank 0.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist

M64 = (1 << 64) - 1
GOLD = 0x9E3779B97F4A7C15


def mix(x):
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    x ^= x >> 31
    return x


def route(seed, rank, t, experts, topk, nhosts, max_hosts):
    """plan::ep::uniformRoute."""
    state = mix(mix((seed * GOLD + 1) & M64) ^ (rank << 40) ^ t)

    def nxt():
        nonlocal state
        state = (state + GOLD) & M64
        return mix(state)

    if max_hosts > 0 and nhosts > 1:
        hs = list(range(nhosts))
        m = min(max_hosts, nhosts)
        for i in range(m):
            j = i + nxt() % (nhosts - i)
            hs[i], hs[j] = hs[j], hs[i]
        per = experts // nhosts
        pool = [hs[i] * per + e for i in range(m) for e in range(per)]
    else:
        pool = list(range(experts))
    ids = []
    for j in range(min(topk, len(pool))):
        s = j + nxt() % (len(pool) - j)
        pool[j], pool[s] = pool[s], pool[j]
        ids.append(pool[j])
    return ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--hosts", type=int, default=1)
    ap.add_argument("--max-hosts", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-n", "--iters", type=int, default=2)
    ap.add_argument("-w", "--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    L = a.experts // n
    k = a.topk
    ids = torch.tensor([route(a.seed, rank, t, a.experts, k, a.hosts, a.max_hosts) for t in range(a.tokens)],
                       dtype=torch.int64)
    g = torch.Generator().manual_seed(rank + 1)
    x = torch.randint(-8, 8, (a.tokens, a.hidden), generator=g).to(torch.bfloat16)
    w = (torch.randint(1, 9, (a.tokens, k), generator=g).float() / 8)

    flat = ids.reshape(-1)
    order = torch.argsort(flat * a.tokens + torch.arange(a.tokens).repeat_interleave(k))  # by expert, then token
    st = {}

    def dispatch():
        counts = torch.bincount(flat, minlength=a.experts)  # per (rank, local expert)
        rcounts = torch.empty_like(counts)
        dist.all_to_all_single(rcounts, counts)
        st.pop("recv_x", None)
        send = x.index_select(0, order // k)  # one row per (token, expert), sorted by expert
        sw = w.reshape(-1).index_select(0, order)
        ssplit = counts.reshape(n, L).sum(1).tolist()
        rsplit = rcounts.reshape(n, L).sum(1).tolist()
        recv = torch.empty((sum(rsplit), a.hidden), dtype=torch.bfloat16)
        dist.all_to_all_single(recv.view(torch.float16), send.view(torch.float16), rsplit, ssplit)
        del send
        rw = torch.empty(sum(rsplit))
        dist.all_to_all_single(rw, sw, rsplit, ssplit)
        # source-major (then expert) -> expert-major (then source)
        blocks = rcounts.reshape(n, L)
        perm = torch.arange(sum(rsplit)).split(blocks.reshape(-1).tolist())
        emajor = torch.cat([perm[p * L + e] for e in range(L) for p in range(n)]) if perm else torch.arange(0)
        st.update(recv_x=recv.index_select(0, emajor), recv_w=rw.index_select(0, emajor), emajor=emajor,
                  ssplit=ssplit, rsplit=rsplit)

    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel())  # (token, choice) -> its row in the send order

    def combine():
        y = st["recv_x"]  # identity experts
        back = torch.empty_like(y)
        back.index_copy_(0, st["emajor"], y)  # expert-major -> source-major
        home = torch.empty((a.tokens * k, a.hidden), dtype=torch.bfloat16)
        dist.all_to_all_single(home.view(torch.float16), back.view(torch.float16), st["ssplit"], st["rsplit"])
        del back
        out = torch.zeros((a.tokens, a.hidden))
        for j in range(k):  # weighted sum at home, one choice at a time (memory: 8 ranks share the host)
            out += home.index_select(0, inv[j::k]).float() * w[:, j:j + 1]
        st["out"] = out.to(torch.bfloat16)

    dispatch()
    combine()
    want = x.float() * w.sum(1, keepdim=True)
    err = (st["out"].float() - want).abs().max().item() if a.tokens else 0.0
    bad = torch.tensor([1.0 if err > 2 ** -7 * (k + 3) * max(1.0, want.abs().max().item()) else 0.0])
    dist.all_reduce(bad)
    rows_out = []
    for rep in range(a.repeats):
        for op, fn in (("dispatch", dispatch), ("combine", combine)):
            for _ in range(a.warmup):
                fn()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(a.iters):
                fn()
            s = torch.tensor([(time.perf_counter() - t0) / a.iters], dtype=torch.float64)
            dist.all_reduce(s, op=dist.ReduceOp.MAX)
            rows_out.append({"op": op, "form": "torch", "repeat": rep, "nranks": n, "hosts": a.hosts,
                             "tokens": a.tokens, "hidden": a.hidden, "experts": a.experts, "topk": k,
                             "max_hosts": a.max_hosts, "type": "bf16", "time_us": s.item() * 1e6,
                             "wrong": int(bad.item())})
    if rank == 0:
        for r in rows_out:
            print(json.dumps(r))
        if a.json:
            with open(a.json, "w") as f:
                for r in rows_out:
                    f.write(json.dumps(r) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
