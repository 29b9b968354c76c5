"""Measures this machine and writes a chorus-sim cluster file (the calibration of ``chorus-sim train`` for
the CPU training job ``chorus.examples.train_gpt``).

    python3 -m chorus.examples.calibrate --out cluster.json --hidden 256 --heads 8 --seq 128 --micro-batch 2 \\
        --vocab 1024 --tp 1,2,4 --ranks-per-host 8 [--hosts 2 --tcp] [--bench build/tools/chorus-bench]
    chorus-sim calibrate --out cluster.json ...      # the same: chorus-sim runs this module

Nothing here sees a training run.  What is measured, with torch.set_num_threads(--threads) as the job uses:

- **GEMMs** at the job's shapes: every linear of a layer and the head (forward y = x W^T, and the two
  backward GEMMs, input gradient and weight gradient) for each tensor-parallel width in ``--tp``, each the
  median of ``--repeats`` timed calls after one warm-up.  chorus-sim prices a GEMM of m x n x k as
  2mnk / (peak x eff x size / (size + half)) + overhead with size = mnk, which is a straight line in 2mnk:
  slope 1 / peak, intercept 2 half / peak + overhead.  The least-squares line through the measured
  (2mnk, seconds) points gives ``gpu.peak_tflops`` (with ``gemm_efficiency`` 1: the peak is the rate
  reached) and ``gpu.gemm_half_size``; ``gpu.kernel_overhead_us`` is the median time of a one-element add
  (a kernel call's fixed cost).
- **Element-wise kernels** at the activation shape (B x S x H fp32): add, GELU, layer norm, softmax over
  the attention scores; bytes moved / median time, each; ``gpu.hbm_gbyte_s`` is the median rate over them
  (``hbm_efficiency`` 1).
- **Host time per layer pass** (Python, autograd's graph, operator dispatch: what no kernel rate sees): the job's
  own model (``chorus.examples.train_gpt``'s Stage, one process, no collectives) at tiny shapes (hidden 8, 2
  heads, sequence 4, one sequence, vocabulary 8), where every kernel is a few elements and the time is the
  framework's.  The medians of its forward, its forward + backward and its SGD step (``zero_grad`` + ``step``)
  with 1 and 3 layers give per micro-batch one layer's forward and backward (the difference of the two
  depths, / 2) and the embedding + head + loss's (the 1-layer model less one layer), and per step the
  optimizer's time per layer: ``host.layer_fwd_us``, ``layer_bwd_us``, ``head_fwd_us``, ``head_bwd_us``,
  ``step_layer_us``.  Since that host time holds every operator's fixed cost, ``gpu.kernel_overhead_us`` is
  written as 0 (the one-element add stays in ``calibration.kernel_overhead_s``; the GEMM fit's half size still
  subtracts it).
- **Cores**: ``node.cpu_cores`` is the number of cores this process may run on (``sched_getaffinity``):
  chorus-sim time-shares them among the ranks of a host that has more ranks than cores.  ``node.cpu_capacity`` is
  what the host gives this job now: the throughput of ``cpu_cores`` concurrent busy processes over one alone's
  (the median of 3 interleaved trials), between 1 and the cores.  Other work lowers it: Linux's scheduler shares
  the cores between sessions (autogroup) before threads, so a job's ranks share its session's part whatever
  their number, and the load average does not say what that part is.
- **Optimizer**: torch.optim.SGD's step over a 4 M-element parameter (reads the parameter and gradient,
  writes the parameter: 12 B per element), recorded in ``calibration.optimizer``.
- **Transport**: chorus-bench (the transport's own benchmark) ``sendrecv`` and ``allreduce`` between 2 local
  ranks over shared memory: ``node.nvlink_gbyte_s`` is sendrecv's bandwidth at the largest size,
  ``node.nvlink_latency_us`` its time at 8 B (``nvlink_efficiency`` 1).  With ``--tcp``, the same over TCP
  (``CHORUS_TRANSPORT=tcp``, loopback unless chorus-bench runs under a launcher spanning netns hosts) gives
  ``network.nic_gbit_s`` and ``network.latency_us``; without it the network keys repeat the shm figures
  (a one-host job never uses them).

The raw measurements, the fit and the conditions (load average, threads, torch version) are kept in the
file's ``calibration`` object, which chorus-sim reads past.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F


def _median_time(fn, repeats, min_s=0.02):
    """Median seconds of fn() over `repeats` timed windows, each at least min_s long (calls averaged)."""
    fn()  # warm-up
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    calls = max(1, int(min_s / once))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def gemm_shapes(a):
    """(name, m, n, k) of every GEMM of one layer and of the head, forward and backward, per tp width."""
    h, f, v, tokens = a.hidden, 4 * a.hidden, a.vocab, a.micro_batch * a.seq
    shapes = []
    for t in a.tp:
        for name, out_f, in_f in (("qkv", 3 * h // t, h), ("proj", h, h // t), ("fc1", f // t, h),
                                  ("fc2", h, f // t), ("head", v // t, h)):
            shapes.append(("{}/tp{}/fwd".format(name, t), tokens, out_f, in_f))
            shapes.append(("{}/tp{}/dgrad".format(name, t), tokens, in_f, out_f))
            shapes.append(("{}/tp{}/wgrad".format(name, t), out_f, in_f, tokens))
    seen, unique = set(), []
    for s in shapes:
        if s[1:] not in seen:
            seen.add(s[1:])
            unique.append(s)
    return unique


def measure_gemms(a):
    rows = []
    for name, m, n, k in gemm_shapes(a):
        x = torch.randn(m, k)
        w = torch.randn(k, n)
        sec = _median_time(lambda: torch.matmul(x, w), a.repeats)
        rows.append({"name": name, "m": m, "n": n, "k": k, "flops": 2.0 * m * n * k, "seconds": sec})
    return rows


def fit_gemm(rows, overhead_s):
    """Least squares of seconds = flops / peak + c; half = (c - overhead) x peak / 2 (>= 0)."""
    xs = [r["flops"] for r in rows]
    ys = [r["seconds"] for r in rows]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else my / mx
    if slope <= 0:  # degenerate (one shape, or noise): the best rate seen
        slope = min(y / x for x, y in zip(xs, ys))
    c = my - slope * mx
    peak = 1.0 / slope
    half = max(0.0, (c - overhead_s) * peak / 2)
    resid = [abs((x * slope + c) - y) / y for x, y in zip(xs, ys)]
    return {"peak_flop_s": peak, "intercept_s": c, "gemm_half_size": half,
            "mean_abs_rel_residual": sum(resid) / n, "max_abs_rel_residual": max(resid)}


def measure_elementwise(a):
    B, S, H = a.micro_batch, a.seq, a.hidden
    heads = max(1, a.heads // min(a.tp))
    x = torch.randn(B, S, H)
    y = torch.randn(B, S, H)
    w = torch.ones(H)
    b = torch.zeros(H)
    s = torch.randn(B, heads, S, S)
    e = x.numel() * 4
    cases = [
        ("add", lambda: x + y, 3 * e),
        ("gelu", lambda: F.gelu(x), 2 * e),
        ("layer_norm", lambda: F.layer_norm(x, (H,), w, b), 2 * e),
        ("softmax", lambda: s.softmax(dim=-1), 2 * s.numel() * 4),
    ]
    rows = []
    for name, fn, nbytes in cases:
        sec = _median_time(fn, a.repeats)
        rows.append({"name": name, "bytes": nbytes, "seconds": sec, "gbyte_s": nbytes / sec / 1e9})
    one = torch.ones(1)
    overhead = _median_time(lambda: one + one, a.repeats)
    return rows, overhead


def measure_optimizer(a):
    p = torch.nn.Parameter(torch.randn(4 << 20))
    p.grad = torch.randn(4 << 20)
    opt = torch.optim.SGD([p], lr=1e-6)
    sec = _median_time(opt.step, a.repeats)
    return {"kind": "sgd", "params": p.numel(), "bytes_per_param": 12, "seconds": sec,
            "gbyte_s": p.numel() * 12 / sec / 1e9, "params_per_s": p.numel() / sec}


def measure_host(a, repeats):
    """The framework's host time per layer pass: train_gpt's own Stage at tiny shapes (see the docstring)."""
    from chorus.examples import train_gpt

    def times(layers):
        ja = train_gpt.parse(["--layers", str(layers), "--hidden", "8", "--heads", "2", "--vocab", "8", "--seq", "4",
                              "--micro-batch", "1", "--micro-batches", "1", "--threads", str(a.threads)])
        stage = train_gpt.Stage(ja, train_gpt.Layout(1, 1, 1, 0), None)
        opt = torch.optim.SGD(stage.parameters(), lr=1e-6)
        ids, target = train_gpt._batch(ja, 0, 0)

        def fwd():
            stage(ids, target)

        def fwd_bwd():
            stage(ids, target).backward()

        def step():
            opt.zero_grad(set_to_none=False)
            opt.step()

        fwd_bwd()  # gradients exist before the optimizer is timed
        return {"fwd": _median_time(fwd, repeats), "fwd_bwd": _median_time(fwd_bwd, repeats),
                "step": _median_time(step, repeats), "tensors": len(list(stage.parameters()))}

    one, three = times(1), times(3)
    layer_f = max(0.0, (three["fwd"] - one["fwd"]) / 2)
    layer_fb = max(0.0, (three["fwd_bwd"] - one["fwd_bwd"]) / 2)
    layer_b = max(0.0, layer_fb - layer_f)
    return {
        "model": "train_gpt Stage: hidden 8, heads 2, seq 4, micro-batch 1, vocab 8; 1 and 3 layers",
        "one_layer": one, "three_layers": three,
        "layer_fwd_s": layer_f, "layer_bwd_s": layer_b,
        "head_fwd_s": max(0.0, one["fwd"] - layer_f), "head_bwd_s": max(0.0, one["fwd_bwd"] - one["fwd"] - layer_b),
        "step_layer_s": max(0.0, (three["step"] - one["step"]) / 2),
    }


def _spin(n):
    x = 0
    for i in range(n):
        x += i
    return x


def _timed_spin(n, conn):
    t0 = time.perf_counter()
    _spin(n)
    conn.send(time.perf_counter() - t0)


def measure_capacity(_unused=None, seconds=0.3, trials=3):
    """Throughput of `cores` concurrent busy processes over one alone's, median of `trials` interleaved pairs."""
    import multiprocessing as mp
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    n = 200000
    t0 = time.perf_counter()
    _spin(n)
    n = max(n, int(n * seconds / max(time.perf_counter() - t0, 1e-6)))
    ctx = mp.get_context("fork")

    def run(k):
        pipes = [ctx.Pipe() for _ in range(k)]
        procs = [ctx.Process(target=_timed_spin, args=(n, w)) for _, w in pipes]
        for p in procs:
            p.start()
        times = [r.recv() for r, _ in pipes]
        for p in procs:
            p.join()
        return times

    rows = []
    for _ in range(trials):
        alone = run(1)[0]
        together = run(cores)
        rows.append({"alone_s": alone, "concurrent_s": together,
                     "ratio": cores * alone / max(together)})
    ratio = statistics.median(r["ratio"] for r in rows)
    return {"cores": cores, "work": n, "trials": rows, "capacity": round(min(float(cores), max(1.0, ratio)), 3)}


def _bench_path(a):
    if a.bench:
        return a.bench
    for cand in (os.environ.get("CHORUS_BENCH"), shutil.which("chorus-bench")):
        if cand and os.path.exists(cand):
            return cand
    run = os.environ.get("CHORUS_RUN") or shutil.which("chorus-run")
    if run:
        cand = os.path.join(os.path.dirname(os.path.abspath(run)), "chorus-bench")
        if os.path.exists(cand):
            return cand
    raise SystemExit("calibrate: chorus-bench not found (pass --bench PATH, set CHORUS_BENCH, or put it on PATH)")


def run_bench(a, collective, transport):
    """chorus-bench <collective> between 2 local ranks; its JSON rows."""
    with tempfile.TemporaryDirectory(prefix="chorus-calibrate-") as d:
        out = os.path.join(d, "rows.jsonl")
        cmd = [_bench_path(a), collective, "--np", "2", "-b", "8", "-e", a.max_bytes, "-f", "4",
               "-n", str(a.bench_iters), "-w", "5", "--json", out]
        env = dict(os.environ)
        if transport:
            env["CHORUS_TRANSPORT"] = transport
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.bench_timeout)
        if proc.returncode != 0:
            raise SystemExit("calibrate: {} failed ({}):\n{}\n{}".format(" ".join(cmd), proc.returncode,
                                                                          proc.stdout[-2000:], proc.stderr[-2000:]))
        with open(out) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    keep = ("bytes", "count", "dtype", "inplace", "time_us", "algbw_gbps", "busbw_gbps", "algo")
    return {"command": " ".join(cmd), "rows": [{k: r[k] for k in keep if k in r} for r in rows]}


def link_figures(sendrecv):
    rows = [r for r in sendrecv["rows"] if r.get("time_us") and not r.get("inplace")]
    small = min(rows, key=lambda r: r["bytes"])
    large = max(rows, key=lambda r: r["bytes"])
    return {"gbyte_s": large["algbw_gbps"], "latency_us": small["time_us"]}


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m chorus.examples.calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the cluster file to write")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--tp", default="1,2,4", help="tensor-parallel widths whose GEMM shapes are measured")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (the job's per-rank count)")
    p.add_argument("--ranks-per-host", type=int, default=8, help="node.gpus of the cluster file")
    p.add_argument("--hosts", type=int, default=1, help="nodes of the cluster file")
    p.add_argument("--tcp", action="store_true", help="also measure the TCP transport (network.*)")
    p.add_argument("--bench", help="chorus-bench binary (default: CHORUS_BENCH, PATH, or next to chorus-run)")
    p.add_argument("--max-bytes", default="16M", help="largest chorus-bench size")
    p.add_argument("--bench-iters", type=int, default=20)
    p.add_argument("--bench-timeout", type=float, default=300)
    p.add_argument("--repeats", type=int, default=5, help="timed windows per kernel (median)")
    p.add_argument("--name", default=None, help="the cluster's name (default: cpu-<host>-<threads>t)")
    a = p.parse_args(argv)
    try:
        a.tp = sorted({int(x) for x in a.tp.split(",") if x})
    except ValueError:
        p.error("--tp {!r} is not a comma-separated list of integers".format(a.tp))
    if not a.tp or min(a.tp) < 1:
        p.error("--tp needs widths >= 1")
    for t in a.tp:
        if a.heads % t or a.vocab % t:
            p.error("--tp {} must divide --heads {} and --vocab {}".format(t, a.heads, a.vocab))
    for k in ("hidden", "heads", "vocab", "seq", "micro_batch", "threads", "ranks_per_host", "hosts", "repeats",
              "bench_iters"):
        if getattr(a, k) < 1:
            p.error("--{} must be >= 1".format(k.replace("_", "-")))
    return a


def calibrate(a):
    torch.set_num_threads(a.threads)
    load = os.getloadavg()
    t_start = time.time()
    ew, overhead = measure_elementwise(a)
    gemms = measure_gemms(a)
    fit = fit_gemm(gemms, overhead)
    opt = measure_optimizer(a)
    host = measure_host(a, max(a.repeats, 7))
    capacity = measure_capacity()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    shm = {"sendrecv": run_bench(a, "sendrecv", "shm"), "allreduce": run_bench(a, "allreduce", "shm")}
    shm_link = link_figures(shm["sendrecv"])
    transport = {"shm": shm}
    net_link = dict(shm_link)
    if a.tcp:
        tcp = {"sendrecv": run_bench(a, "sendrecv", "tcp"), "allreduce": run_bench(a, "allreduce", "tcp")}
        transport["tcp"] = tcp
        net_link = link_figures(tcp["sendrecv"])
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    hbm = statistics.median(r["gbyte_s"] for r in ew)
    cluster = {
        "name": a.name or "cpu-{}-{}t".format(platform.node() or "host", a.threads),
        "nodes": a.hosts,
        "gpu": {
            "name": "cpu-rank-{}t".format(a.threads),
            "peak_tflops": fit["peak_flop_s"] / 1e12,
            "hbm_gib": round(mem_gib / a.ranks_per_host, 3),
            "hbm_gbyte_s": hbm,
            "gemm_efficiency": 1.0,
            "gemm_half_size": fit["gemm_half_size"],
            "hbm_efficiency": 1.0,
            "kernel_overhead_us": 0.0,
            "comm_sm_fraction": 0.0,
        },
        "node": {
            "gpus": a.ranks_per_host,
            "nvlink_gbyte_s": shm_link["gbyte_s"],
            "nvlink_latency_us": shm_link["latency_us"],
            "nvlink_efficiency": 1.0,
            "cpu_cores": cores,
            "cpu_capacity": capacity["capacity"],
        },
        "host": {k + "_us": host[k + "_s"] * 1e6
                 for k in ("layer_fwd", "layer_bwd", "head_fwd", "head_bwd", "step_layer")},
        "network": {
            "topology": "fat-tree",
            "nics_per_node": 1,
            "nic_gbit_s": net_link["gbyte_s"] * 8,
            "latency_us": net_link["latency_us"],
            "oversubscription": 1,
            "efficiency": 1.0,
        },
        "calibration": {
            "tool": "python3 -m chorus.examples.calibrate",
            "argv": sys.argv[1:],
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "cpu_cores": cores,
            "threads": a.threads,
            "torch": torch.__version__,
            "load_average_start": list(load),
            "load_average_end": list(os.getloadavg()),
            "seconds": time.time() - t_start,
            "job": {"hidden": a.hidden, "heads": a.heads, "vocab": a.vocab, "seq": a.seq,
                    "micro_batch": a.micro_batch, "tp": a.tp, "dtype": "float32"},
            "gemm": gemms,
            "gemm_fit": fit,
            "elementwise": ew,
            "kernel_overhead_s": overhead,
            "host": host,
            "capacity": capacity,
            "optimizer": opt,
            "transport": transport,
        },
    }
    return cluster


def main(argv=None):
    a = parse(argv)
    cluster = calibrate(a)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(cluster, f, indent=2)
        f.write("\n")
    os.replace(tmp, a.out)
    g = cluster["gpu"]
    hs = cluster["host"]
    print("calibrate: wrote {}: GEMM {:.1f} GFLOP/s (half size {:.3g}), element-wise {:.2f} GB/s, "
          "host per layer {:.0f} + {:.0f} us (head {:.0f} + {:.0f} us, step {:.0f} us/layer), {} cores (capacity {}), "
          "shm {:.2f} GB/s {:.1f} us, network {:.2f} Gbit/s {:.1f} us; load average {:.2f}".format(
              a.out, g["peak_tflops"] * 1e3, g["gemm_half_size"], g["hbm_gbyte_s"], hs["layer_fwd_us"],
              hs["layer_bwd_us"], hs["head_fwd_us"], hs["head_bwd_us"], hs["step_layer_us"], cluster["node"]["cpu_cores"],
              cluster["node"]["cpu_capacity"],
              cluster["node"]["nvlink_gbyte_s"], cluster["node"]["nvlink_latency_us"],
              cluster["network"]["nic_gbit_s"], cluster["network"]["latency_us"],
              cluster["calibration"]["load_average_start"][0]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
