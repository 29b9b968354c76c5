"""Disaggregated serving with chorus.KvAgent (issue 37, docs/kv.md): a prefill
process computes each request's KV cache and first token and pushes the KV
pages into a decode process's paged cache, one notification per request; the
decode process continues every sequence with continuous batching.

    python -m chorus.kv_disagg single  --out ref.json            # one process: the reference tokens
    python -m chorus.kv_disagg prefill --uid-file F --out p.json  # serves the store, writes F
    python -m chorus.kv_disagg decode  --uid-file F --out d.json  # reads F
    python -m chorus.kv_disagg local   --out d.json               # both, as two local processes (shm)
    python -m chorus.kv_disagg kernels --out k.json               # timings of the model's own kernels
    python -m chorus.kv_disagg kernels --corun --out k.json       # ... and of each beside the other
    python -m chorus.kv_disagg calibrate --out c.json             # per-op costs: what chorus-sim is given

The model is a small decoder-only transformer on the CPU (torch, float32, one
thread, greedy decoding), weights drawn from --seed.  Its KV cache is paged
as vLLM's: blocks of --block-tokens tokens, layer-major
[layer][k|v][block][token][head][dim] on both sides (docs/kv.md, "Paged KV
layouts"), so one descriptor per (layer, plane, block).  A request's block
tables on both sides are a fixed scatter of the pools that both processes
compute from the request id (no block-manager round trip; the blocks of a
request are not contiguous, so the transfer is really paged).

Requests (vLLM benchmark_serving style): --requests prompts of --input random
tokens each, arriving as a Poisson process of --rate per second (seeded);
each produces --output tokens (the first by the prefill, the rest by the
decode).  TTFT is the first token's arrival at the decode side minus the
request's arrival; ITL every gap between consecutive tokens of a request
(pooled).  Both processes read the same CLOCK_MONOTONIC (network namespaces
share the kernel's clock).

The tokens of every request must equal those of `single`, which runs the
same per-request kernels with the same shapes in one process, and so must the
winning logit of every decode step, bit for bit (a random tiny model's greedy
tokens alone can survive a damaged page; its logits cannot: every prompt
position has a nonzero attention weight).  --corrupt R damages one page of
request R on purpose; tests/python/test_kv_disagg.py checks that the
comparison catches it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import sys
import time

import torch

NOTIFY_START = 1 << 62  # value | NOTIFY_START: the stream's t0 (microseconds of CLOCK_MONOTONIC)
NOTIFY_BYE = 1 << 61    # decode -> prefill: every request finished


class Config:
    def __init__(self, a):
        self.vocab = a.vocab
        self.d = a.d_model
        self.layers = a.layers
        self.heads = a.heads
        self.head_dim = a.d_model // a.heads
        self.ffn = 4 * a.d_model
        self.block_tokens = a.block_tokens
        self.seed = a.seed
        self.requests = a.requests
        self.input = a.input
        self.output = a.output
        self.rate = a.rate
        if a.d_model % a.heads:
            raise SystemExit(f"--d-model {a.d_model} is not a multiple of --heads {a.heads}")
        self.blocks_per_request = (self.input + self.output + self.block_tokens - 1) // self.block_tokens

    @property
    def block_bytes(self):  # one (layer, plane, block) page
        return self.block_tokens * self.heads * self.head_dim * 4


class Model:
    """Weights from the seed; every kernel works on one request at a time, so
    the shapes (and the float results) do not depend on what else runs."""

    def __init__(self, c: Config):
        self.c = c
        g = torch.Generator().manual_seed(c.seed)
        d, f = c.d, c.ffn

        def w(*shape, scale):
            return torch.randn(*shape, generator=g) * scale

        self.emb = w(c.vocab, d, scale=1.0)
        self.wq = [w(d, d, scale=d ** -0.5) for _ in range(c.layers)]
        self.wk = [w(d, d, scale=d ** -0.5) for _ in range(c.layers)]
        self.wv = [w(d, d, scale=d ** -0.5) for _ in range(c.layers)]
        self.wo = [w(d, d, scale=d ** -0.5) for _ in range(c.layers)]
        self.w1 = [w(d, f, scale=d ** -0.5) for _ in range(c.layers)]
        self.w2 = [w(f, d, scale=f ** -0.5) for _ in range(c.layers)]
        self.wout = w(d, c.vocab, scale=d ** -0.5)  # untied: the next token is not the input's echo
        pos = torch.arange(4096, dtype=torch.float32)[:, None]
        inv = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float32) / d)
        self.pos = torch.zeros(4096, d)
        self.pos[:, 0::2] = 0.1 * torch.sin(pos * inv)
        self.pos[:, 1::2] = 0.1 * torch.cos(pos * inv)

    @staticmethod
    def _norm(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def _mlp(self, l, x):
        return torch.nn.functional.gelu(self._norm(x) @ self.w1[l]) @ self.w2[l]

    def prefill(self, tokens, cache, table, between_layers=None):
        """The prompt's K and V into cache blocks `table`; returns the first token."""
        c = self.c
        n = len(tokens)
        x = self.emb[torch.tensor(tokens)] + self.pos[:n]
        mask = torch.full((n, n), float("-inf")).triu(1)
        for l in range(c.layers):
            h = self._norm(x)
            q = (h @ self.wq[l]).view(n, c.heads, c.head_dim).transpose(0, 1)
            k = (h @ self.wk[l]).view(n, c.heads, c.head_dim)
            v = (h @ self.wv[l]).view(n, c.heads, c.head_dim)
            cache.put(l, table, 0, k, v)
            s = (q @ k.permute(1, 2, 0)) / math.sqrt(c.head_dim) + mask
            a = (torch.softmax(s, -1) @ v.transpose(0, 1)).transpose(0, 1).reshape(n, c.d)
            x = x + a @ self.wo[l]
            x = x + self._mlp(l, x)
            if between_layers:
                between_layers()
        return int(torch.argmax(self._norm(x[-1]) @ self.wout))

    def decode(self, tok, pos, cache, table, between_layers=None):
        """One token at position `pos` over the paged cache; returns the next
        token and its logit (compared bit for bit: any wrong byte of a page
        the attention reads changes it)."""
        c = self.c
        x = (self.emb[tok] + self.pos[pos])[None, :]
        for l in range(c.layers):
            h = self._norm(x)
            q = (h @ self.wq[l]).view(c.heads, 1, c.head_dim)
            k = (h @ self.wk[l]).view(1, c.heads, c.head_dim)
            v = (h @ self.wv[l]).view(1, c.heads, c.head_dim)
            cache.put(l, table, pos, k, v)
            kk, vv = cache.get(l, table, pos + 1)
            s = (q @ kk.permute(1, 2, 0)) / math.sqrt(c.head_dim)
            a = (torch.softmax(s, -1) @ vv.transpose(0, 1)).reshape(1, c.d)
            x = x + a @ self.wo[l]
            x = x + self._mlp(l, x)
            if between_layers:
                between_layers()
        logits = self._norm(x[0]) @ self.wout
        t = int(torch.argmax(logits))
        return t, float(logits[t])


class PagedCache:
    """[layer][k|v][block][token][head][dim] float32, one registered tensor."""

    def __init__(self, c: Config, blocks: int):
        self.c = c
        self.blocks = blocks
        self.t = torch.zeros(c.layers, 2, blocks, c.block_tokens, c.heads, c.head_dim)

    def put(self, l, table, start, k, v):
        T = self.c.block_tokens
        n = k.shape[0]
        p = start
        while p < start + n:
            b, off = table[p // T], p % T
            m = min(T - off, start + n - p)
            self.t[l, 0, b, off:off + m] = k[p - start:p - start + m]
            self.t[l, 1, b, off:off + m] = v[p - start:p - start + m]
            p += m

    def get(self, l, table, length):
        T = self.c.block_tokens
        nb = (length + T - 1) // T
        idx = torch.tensor(table[:nb])
        k = self.t[l, 0].index_select(0, idx).reshape(nb * T, self.c.heads, self.c.head_dim)[:length]
        v = self.t[l, 1].index_select(0, idx).reshape(nb * T, self.c.heads, self.c.head_dim)[:length]
        return k, v

    def offset(self, l, plane, block):
        return ((l * 2 + plane) * self.blocks + block) * self.c.block_bytes


def block_table(c: Config, rid: int, side: int):
    """Request rid's blocks in a pool of requests x blocks_per_request: a
    fixed scatter (request-minor, reversed on the decode side)."""
    bpr = c.blocks_per_request
    if side == 0:
        return [j * c.requests + rid for j in range(bpr)]
    return [(bpr - 1 - j) * c.requests + (c.requests - 1 - rid) for j in range(bpr)]


def workload(c: Config):
    """(arrival offsets in s, prompts): Poisson arrivals at c.rate, random tokens."""
    g = torch.Generator().manual_seed(c.seed + 1)
    gaps = -torch.log(1.0 - torch.rand(c.requests, generator=g, dtype=torch.float64)) / c.rate
    arrivals = torch.cumsum(gaps, 0) - gaps[0]  # the first request at t0
    prompts = torch.randint(0, c.vocab, (c.requests, c.input), generator=g).tolist()
    return arrivals.tolist(), prompts


def corrupt_page(cache: PagedCache, c: Config, rid: int):
    """Damages the first K page of layer 0 of request rid (the negative test)."""
    b = block_table(c, rid, 0)[0]
    cache.t[0, 0, b] += 1.0


def reference(c: Config):
    """Every request's tokens, prefill then decode, in one process."""
    model = Model(c)
    cache = PagedCache(c, c.requests * c.blocks_per_request)
    _, prompts = workload(c)
    out = {}
    for rid, prompt in enumerate(prompts):
        table = block_table(c, rid, 1)
        toks, scores = [model.prefill(prompt, cache, table)], []
        for i in range(c.output - 1):
            t, s = model.decode(toks[-1], c.input + i, cache, table)
            toks.append(t)
            scores.append(s)
        out[rid] = (toks, scores)
    return out


def _agent(chorus, name, uid_file, serve):
    if serve:
        uid = chorus.UniqueId()
        tmp = uid_file + ".tmp"
        with open(tmp, "wb") as f:
            f.write(bytes(uid))
        os.replace(tmp, uid_file)
    else:
        for _ in range(6000):
            if os.path.exists(uid_file):
                break
            time.sleep(0.01)
        with open(uid_file, "rb") as f:
            uid = chorus.UniqueId.from_bytes(f.read())
    return chorus.KvAgent(name, uid, serve_store=serve)


def run_prefill(c: Config, uid_file: str, corrupt=None, timeout_s=120.0):
    """The prefill worker: FCFS over the arriving requests, one at a time; a
    request's pages are written to the decode side as soon as its prefill is
    done, while the next prefill runs.  Returns per-request times."""
    import chorus

    model = Model(c)
    cache = PagedCache(c, c.requests * c.blocks_per_request)
    arrivals, prompts = workload(c)
    bpr = c.blocks_per_request
    with _agent(chorus, "prefill", uid_file, True) as agent:
        region = agent.register(cache.t, "r")
        agent.publish()
        agent.connect("decode", int(timeout_s * 1000))
        t0 = time.monotonic() + 0.2
        agent.wait(agent.write("decode", [], notify=NOTIFY_START | int(t0 * 1e6)), int(timeout_s * 1000))
        pending = {}
        acked = {}
        times = []
        for rid, prompt in enumerate(prompts):
            while time.monotonic() < t0 + arrivals[rid]:
                agent.progress()
                _retire(agent, pending, acked)
                time.sleep(0.0002)
            start = time.monotonic()
            table = block_table(c, rid, 0)
            first = model.prefill(prompt, cache, table, between_layers=agent.progress)
            if corrupt == rid:
                corrupt_page(cache, c, rid)
            done = time.monotonic()
            dst = block_table(c, rid, 1)
            descs = [(region, cache.offset(l, p, table[j]), 0, cache.offset(l, p, dst[j]), c.block_bytes)
                     for l in range(c.layers) for p in range(2) for j in range(bpr)
                     if j * c.block_tokens < c.input]
            pending[agent.write("decode", descs, notify=(rid << 16) | first)] = rid
            times.append({"rid": rid, "arrival": arrivals[rid], "start": start - t0, "prefill_done": done - t0,
                          "bytes": len(descs) * c.block_bytes, "descs": len(descs)})
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            _retire(agent, pending, acked)
        if pending:
            raise RuntimeError(f"prefill: transfers of requests {sorted(pending.values())} did not complete")
        for t in times:
            t["acked"] = acked[t["rid"]] - t0
        while time.monotonic() < deadline:  # serve until decode says goodbye
            n = agent.notification()
            if n is not None and n[1] == NOTIFY_BYE:
                break
            time.sleep(0.0005)
        else:
            raise RuntimeError("prefill: no goodbye from decode")
    return {"role": "prefill", "requests": times}


def _retire(agent, pending, acked):
    """Releases the finished transfers; acked[rid]: when the prefill worker saw its batch complete (every
    page acknowledged by the decode side), for the TTFT timeline (bench/kv_netns.sh)."""
    for x in list(pending):
        st = agent.test(x)
        if st != "pending":
            if st != "done":
                raise RuntimeError(f"prefill: transfer of request {pending[x]}: {st}")
            acked[pending[x]] = time.monotonic()
            agent.release(x)
            del pending[x]


def run_decode(c: Config, uid_file: str, timeout_s=120.0):
    """The decode worker: admits a request when its notification arrives (its
    pages have landed), then one token per running request per step
    (continuous batching; every token of a step is emitted at the step's end)."""
    import chorus

    model = Model(c)
    cache = PagedCache(c, c.requests * c.blocks_per_request)
    arrivals, _ = workload(c)
    with _agent(chorus, "decode", uid_file, False) as agent:
        agent.register(cache.t, "w")
        agent.publish()
        agent.connect("prefill", int(timeout_s * 1000))
        t0 = None
        running = {}  # rid -> [tokens, token times]
        done = {}
        steps = []
        deadline = time.monotonic() + timeout_s
        while len(done) < c.requests:
            if time.monotonic() > deadline:
                raise RuntimeError(f"decode: {len(done)} of {c.requests} requests finished in {timeout_s} s")
            while True:
                n = agent.notification()
                if n is None:
                    break
                now = time.monotonic()
                if n[1] & NOTIFY_START:
                    t0 = (n[1] & ~NOTIFY_START) / 1e6
                    continue
                rid, first = n[1] >> 16, n[1] & 0xFFFF
                running[rid] = [[first], [now - t0], []]
                if c.output == 1:
                    done[rid] = running.pop(rid)
            if not running:
                time.sleep(0.0002)
                continue
            step_start = time.monotonic()
            for rid in sorted(running):
                toks = running[rid][0]
                t, s = model.decode(toks[-1], c.input + len(toks) - 1, cache, block_table(c, rid, 1),
                                    between_layers=agent.progress)
                toks.append(t)
                running[rid][2].append(s)
            now = time.monotonic() - t0
            steps.append({"batch": len(running), "start": step_start - t0, "end": now})
            for rid in list(running):
                running[rid][1].append(now)
                if len(running[rid][0]) == c.output:
                    done[rid] = running.pop(rid)
        agent.wait(agent.write("prefill", [], notify=NOTIFY_BYE), int(timeout_s * 1000))
    reqs = [{"rid": r, "arrival": arrivals[r], "tokens": done[r][0], "logits": done[r][2], "times": done[r][1]}
            for r in sorted(done)]
    return {"role": "decode", "requests": reqs, "steps": steps}


def metrics(decode_out):
    """TTFT and ITL (ms): median, p90, mean; as vLLM's benchmark_serving."""
    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]
    ttft = [(r["times"][0] - r["arrival"]) * 1e3 for r in decode_out["requests"]]
    itl = [(b - a) * 1e3 for r in decode_out["requests"] for a, b in zip(r["times"], r["times"][1:])]
    out = {}
    for name, xs in (("ttft_ms", ttft), ("itl_ms", itl)):
        if xs:
            out[name] = {"median": statistics.median(xs), "p90": pct(xs, 0.9), "mean": statistics.fmean(xs),
                         "n": len(xs)}
    return out


def kernels(c: Config, reps=20, sustained_s=2.0, corun=False, argv=None, pairs=8):
    """Times of the model's own kernels on this machine: a prefill of
    --input tokens, and one decode token at a few context lengths; what
    chorus-sim is given as this machine's compute rate (docs/kv.md).
    `prefill_s` / `decode_s`: medians of `reps` runs (an uncontended run's
    time); `prefill_mean_s` / `decode_mean_s`: the mean of back-to-back runs
    for `sustained_s` seconds each, the rate a worker that computes without
    pause gets from a CPU it shares (time slices and all): what the demo's
    workers see, and what bench/kv_disagg_validate.sh calibrates with.
    corun (--corun): `prefill_corun_mean_s` / `decode_corun_mean_s`, the same
    means while the other kernel runs in another process (from `pairs` paired
    windows, their ratios in `corun_ratios`)."""
    model = Model(c)
    cache = PagedCache(c, c.blocks_per_request)
    table = list(range(c.blocks_per_request))
    prompt = workload(c)[1][0]

    def med(fn):
        fn()
        ts = []
        for _ in range(reps):
            s = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - s)
        return statistics.median(ts)

    def window(fn, secs, at_least=2):
        """The mean time of fn run back to back for secs (and at least at_least times)."""
        n, s = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            t = time.perf_counter() - s
            if t >= secs and n >= at_least:
                return t / n

    def mean(fn):
        fn()  # warm-up, untimed
        return window(fn, sustained_s, at_least=3)

    def prefill():
        model.prefill(prompt, cache, table)

    out = {"prefill_s": med(prefill), "prefill_mean_s": mean(prefill)}
    ctx = sorted({c.input, c.input + c.output // 2, c.input + c.output - 1})
    out["decode_s"] = {str(p): med(lambda p=p: model.decode(1, p, cache, table)) for p in ctx}
    out["decode_mean_s"] = {str(p): mean(lambda p=p: model.decode(1, p, cache, table)) for p in ctx}
    out["sustained_s"] = sustained_s
    if corun:
        # Each kernel beside the other worker's kernel, which runs back to back
        # in a process of its own (`burn`): the rate a worker gets while both
        # compute, as the demo's do whenever a prefill overlaps decode steps.
        # Paired windows: the co-runner is stopped (SIGSTOP) for one window and
        # running for the next, `pairs` times, and the co-run mean is the alone
        # mean times the median of the pairs' ratios.  This VM's speed drifts by
        # tens of percent from one quarter second to the next, more than the
        # effect, so two separate 2 s means would measure the drift instead.
        def ratios(fn, secs):
            got = []
            for _ in range(pairs):
                with burner.stopped():
                    a = window(fn, secs)
                b = window(fn, secs)
                got.append(b / a)
            return got
        out["corun_ratios"] = {}
        with _Burner(argv, "decode", c.input + c.output // 2) as burner:
            r = out["corun_ratios"]["prefill"] = ratios(prefill, sustained_s / 5)
            out["prefill_corun_mean_s"] = out["prefill_mean_s"] * max(1.0, statistics.median(r))
        out["decode_corun_mean_s"] = {}
        with _Burner(argv, "prefill", 0) as burner:
            for p in ctx:
                r = out["corun_ratios"][f"decode@{p}"] = ratios(lambda p=p: model.decode(1, p, cache, table), sustained_s / 8)
                out["decode_corun_mean_s"][str(p)] = out["decode_mean_s"][str(p)] * max(1.0, statistics.median(r))
    return out


class _Burner:
    """A `burn` process running one of the model's kernels back to back
    until this context ends; entered once its first kernel finished."""

    def __init__(self, argv, kernel, pos):
        self.cmd = [sys.executable, "-m", "chorus.kv_disagg", "burn", "--kernel", kernel, "--pos", str(pos)] + \
            [x for x in _passthrough(argv) if x not in ("kernels",)]

    def __enter__(self):
        import subprocess
        self.p = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, text=True)
        if self.p.stdout.readline().strip() != "ready":
            self.p.kill()
            raise RuntimeError(f"kernels: the co-running process did not start ({' '.join(self.cmd)})")
        return self

    def __exit__(self, *exc):
        self.p.send_signal(signal.SIGCONT)
        self.p.terminate()
        self.p.wait(timeout=30)

    @contextlib.contextmanager
    def stopped(self):
        """The co-runner paused (off the CPU) inside the block."""
        self.p.send_signal(signal.SIGSTOP)
        time.sleep(0.02)
        try:
            yield
        finally:
            self.p.send_signal(signal.SIGCONT)
            time.sleep(0.02)


def burn(c: Config, kernel: str, pos: int, limit_s: float):
    """Runs one kernel back to back (a prefill of --input tokens, or a decode
    token at context `pos`) for at most limit_s seconds; prints "ready" after
    the first.  The co-runner of `kernels`."""
    model = Model(c)
    cache = PagedCache(c, c.blocks_per_request)
    table = list(range(c.blocks_per_request))
    prompt = workload(c)[1][0]
    fn = (lambda: model.prefill(prompt, cache, table)) if kernel == "prefill" else \
        (lambda: model.decode(1, pos, cache, table))
    fn()
    print("ready", flush=True)
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        fn()


def calibrate(c: Config, reps=2000):
    """The workers' fixed costs beside the model's kernels (what `kernels`
    times), each measured alone: an agent's progress call, building a
    request's descriptor list, a decode step's bookkeeping per request and
    an idle worker's poll sleep.  With `kernels` and the link's setting they
    make the host emulation chorus-sim predicts the demo from
    (src/sim/infer_host.hpp, bench/kv_disagg_validate.sh); nothing here runs
    a prefill, a decode step or a transfer."""
    def med(fn, n=reps):
        for _ in range(max(3, n // 20)):
            fn()
        ts = []
        for _ in range(n):
            s = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - s)
        return statistics.median(ts)

    cache = PagedCache(c, 1)
    table, dst, bpr = block_table(c, 0, 0), block_table(c, 0, 1), c.blocks_per_request

    def descs():
        return [(0, cache.offset(l, p, table[j]), 0, cache.offset(l, p, dst[j]), c.block_bytes)
                for l in range(c.layers) for p in range(2) for j in range(bpr) if j * c.block_tokens < c.input]

    def bookkeeping():  # run_decode's per-request work in a step besides model.decode
        toks, times = [1], []
        block_table(c, 0, 1)
        toks.append(2)
        times.append(0.0)
        return len(toks) == c.output

    out = {"post_s": med(descs, reps // 10), "decode_request_s": med(bookkeeping),
           "poll_s": med(lambda: time.sleep(0.0002), reps // 10)}
    try:  # an agent's progress call (no peer connected: the C call and its polls)
        import chorus
        with chorus.KvAgent("calibrate", chorus.UniqueId(), serve_store=True) as agent:
            out["progress_s"] = med(agent.progress)
    except Exception as e:  # noqa: BLE001 -- reported; the caller decides
        out["progress_error"] = str(e)
    return out


def _args(argv):
    ap = argparse.ArgumentParser(prog="python -m chorus.kv_disagg", description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["single", "prefill", "decode", "local", "kernels", "calibrate", "burn"])
    ap.add_argument("--uid-file", default="", help="prefill writes the store's UniqueId here, decode reads it")
    ap.add_argument("--out", default="", help="JSON result (default: stdout)")
    ap.add_argument("--ref", default="", help="decode/local: a `single` result to compare the tokens with")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--input", type=int, default=128, help="prompt tokens")
    ap.add_argument("--output", type=int, default=32, help="output tokens (the first from the prefill)")
    ap.add_argument("--rate", type=float, default=4.0, help="requests per second (Poisson)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--corrupt", type=int, default=None, help="prefill: damage one page of this request")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds")
    ap.add_argument("--corun", action="store_true", help="kernels: also time each kernel beside the other")
    ap.add_argument("--calib-seconds", type=float, default=2.0,
                    help="kernels: seconds of each sustained mean (the co-run windows are 1/5 and 1/8 of it)")
    ap.add_argument("--kernel", choices=["prefill", "decode"], default="decode", help="burn: which kernel")
    ap.add_argument("--pos", type=int, default=0, help="burn: the decode token's context position")
    a = ap.parse_args(argv)
    if not 0 < a.calib_seconds <= 600:
        ap.error("--calib-seconds must be in (0, 600]")
    if a.vocab > 0xFFFF or a.requests >= 1 << 40 or min(a.requests, a.input, a.output, a.rate) <= 0:
        ap.error("--vocab at most 65535; --requests, --input, --output, --rate positive")
    return a


def compare(ref, dec):
    """Request ids whose tokens or decode logits differ (bit for bit) from the reference's."""
    got = {str(r["rid"]): (r["tokens"], r["logits"]) for r in dec["requests"]}
    return sorted(int(r) for r in ref["tokens"] if got.get(r) != (ref["tokens"][r], ref["logits"][r]))


def main(argv=None):
    a = _args(argv)
    torch.set_num_threads(1)
    c = Config(a)
    with torch.no_grad():
        if a.mode == "single":
            ref = reference(c)
            out = {"role": "single", "tokens": {str(k): v[0] for k, v in ref.items()},
                   "logits": {str(k): v[1] for k, v in ref.items()}}
        elif a.mode == "kernels":
            out = kernels(c, sustained_s=a.calib_seconds, corun=a.corun, argv=argv)
        elif a.mode == "burn":
            burn(c, a.kernel, a.pos or c.input, a.timeout)
            return 0
        elif a.mode == "calibrate":
            out = calibrate(c)
        elif a.mode == "prefill":
            out = run_prefill(c, a.uid_file, a.corrupt, a.timeout)
        elif a.mode == "decode":
            out = run_decode(c, a.uid_file, a.timeout)
        else:
            import subprocess
            import tempfile
            with tempfile.TemporaryDirectory() as d:
                uid = os.path.join(d, "uid")
                cmd = [sys.executable, "-m", "chorus.kv_disagg", "prefill", "--uid-file", uid] + _passthrough(argv)
                p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
                try:
                    out = run_decode(c, uid, a.timeout)
                finally:
                    if p.wait(timeout=a.timeout) != 0:
                        raise SystemExit(f"prefill exited with {p.returncode}")
        if a.mode in ("decode", "local"):
            out["metrics"] = metrics(out)
            if a.ref:
                with open(a.ref) as f:
                    ref = json.load(f)
                out["mismatched"] = compare(ref, out)
    text = json.dumps(out)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        print(text)
    if a.mode in ("decode", "local"):
        m = out["metrics"]
        print(f"kv_disagg: {c.requests} requests at {c.rate}/s, input {c.input}, output {c.output}: TTFT median "
              f"{m['ttft_ms']['median']:.2f} ms p90 {m['ttft_ms']['p90']:.2f} ms; ITL median "
              f"{m.get('itl_ms', {}).get('median', 0):.2f} ms p90 {m.get('itl_ms', {}).get('p90', 0):.2f} ms"
              + (f"; tokens or logits differ from the reference in requests {out['mismatched']}" if out.get("mismatched")
                 else "; tokens and logits equal the reference" if a.ref else ""), file=sys.stderr)
        if out.get("mismatched"):
            return 1
    return 0


def _passthrough(argv):
    """local: the prefill's flags (the model and workload, --corrupt)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out, skip = [], False
    for i, x in enumerate(argv):
        if skip:
            skip = False
            continue
        if x in ("local", "--corun"):
            continue
        if x in ("--out", "--ref", "--uid-file", "--kernel", "--pos"):
            skip = True
            continue
        if x.startswith(("--out=", "--ref=", "--uid-file=", "--kernel=", "--pos=")):
            continue
        out.append(x)
    return out


if __name__ == "__main__":
    sys.exit(main())
