"""`chorus-sim calibrate` (python -m chorus.examples.calibrate): the cluster file it writes has chorus-sim's
schema, every figure comes from a recorded measurement, and `chorus-sim train` reads it and prices the
train_gpt job's own model file.  Small shapes and sizes: the schema is checked, never the values' speed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

JOB = ["--hidden", "64", "--heads", "4", "--vocab", "128", "--seq", "32", "--micro-batch", "2"]


def _tool(var):
    path = os.environ.get(var)
    assert path and os.path.exists(path), "set {} (ctest does)".format(var)
    return path


def _positive(x, what):
    assert isinstance(x, (int, float)) and math.isfinite(x) and x > 0, "{} = {!r} is not a positive number".format(
        what, x)


def _check_schema(c, ranks_per_host):
    assert set(c) == {"name", "nodes", "gpu", "node", "network", "host", "calibration"}, sorted(c)
    assert isinstance(c["name"], str) and c["name"]
    assert c["nodes"] == 1
    g = c["gpu"]
    for k in ("peak_tflops", "hbm_gib", "hbm_gbyte_s"):
        _positive(g[k], "gpu." + k)
    # Every operator's fixed cost is in the host time per layer pass, not again per kernel.
    assert g["kernel_overhead_us"] == 0.0, g
    _positive(c["calibration"]["kernel_overhead_s"], "calibration.kernel_overhead_s")
    assert g["gemm_efficiency"] == 1.0 and g["hbm_efficiency"] == 1.0, g
    assert g["gemm_half_size"] >= 0, g
    n = c["node"]
    assert n["gpus"] == ranks_per_host, n
    assert n["cpu_cores"] == len(os.sched_getaffinity(0)), n
    cap = c["calibration"]["capacity"]
    assert n["cpu_capacity"] == cap["capacity"] and 1 <= n["cpu_capacity"] <= n["cpu_cores"], (n, cap)
    assert len(cap["trials"]) == 3 and all(t["alone_s"] > 0 for t in cap["trials"]), cap
    _positive(n["nvlink_gbyte_s"], "node.nvlink_gbyte_s")
    _positive(n["nvlink_latency_us"], "node.nvlink_latency_us")
    w = c["network"]
    _positive(w["nic_gbit_s"], "network.nic_gbit_s")
    cal = c["calibration"]
    # Every GEMM shape of the job at tp 1 and 2 (forward, input and weight gradient), each timed.
    assert len(cal["gemm"]) >= 10, cal["gemm"]
    for r in cal["gemm"]:
        _positive(r["seconds"], "gemm " + r["name"])
        assert r["flops"] == 2.0 * r["m"] * r["n"] * r["k"], r
    # The file's GEMM rate is the fit's, the fit's is the measured rows'.
    assert abs(g["peak_tflops"] * 1e12 - cal["gemm_fit"]["peak_flop_s"]) <= 1e-9 * g["peak_tflops"] * 1e12
    rates = [r["flops"] / r["seconds"] for r in cal["gemm"]]
    assert min(rates) / 10 < cal["gemm_fit"]["peak_flop_s"] < max(rates) * 10, (rates, cal["gemm_fit"])
    assert {r["name"] for r in cal["elementwise"]} == {"add", "gelu", "layer_norm", "softmax"}, cal["elementwise"]
    _positive(cal["optimizer"]["params_per_s"], "calibration.optimizer.params_per_s")
    rows = cal["transport"]["shm"]["sendrecv"]["rows"]
    assert rows and all(r["time_us"] > 0 for r in rows), rows
    largest = max((r for r in rows if not r.get("inplace")), key=lambda r: r["bytes"])
    assert n["nvlink_gbyte_s"] == largest["algbw_gbps"], (n, largest)
    assert cal["transport"]["shm"]["allreduce"]["rows"], cal["transport"]["shm"]
    assert cal["threads"] == 1 and len(cal["load_average_start"]) == 3
    # The host time per layer pass: the tiny-shape model's medians, and the file's figures are their differences.
    hm = cal["host"]
    for depth in ("one_layer", "three_layers"):
        for k in ("fwd", "fwd_bwd", "step"):
            _positive(hm[depth][k], "calibration.host.{}.{}".format(depth, k))
    assert set(c["host"]) == {"layer_fwd_us", "layer_bwd_us", "head_fwd_us", "head_bwd_us", "step_layer_us"}, c["host"]
    assert abs(c["host"]["layer_fwd_us"] - 1e6 * max(0.0, (hm["three_layers"]["fwd"] - hm["one_layer"]["fwd"]) / 2)) \
        <= 1e-6 * (1 + c["host"]["layer_fwd_us"]), (c["host"], hm)
    _positive(c["host"]["layer_fwd_us"] + c["host"]["layer_bwd_us"], "host per layer")


def _calibrate_and_train():
    sim = _tool("CHORUS_SIM")
    d = tempfile.mkdtemp(prefix="chorus-calibrate-test-")
    out = os.path.join(d, "cluster.json")
    cmd = [sim, "calibrate", "--out", out, "--tp", "1,2", "--ranks-per-host", "2", "--repeats", "2",
           "--max-bytes", "64K", "--bench-iters", "5"] + JOB
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, "{} exited {}:\n{}\n{}".format(cmd, proc.returncode, proc.stdout, proc.stderr)
    print(proc.stdout.strip(), flush=True)
    with open(out) as f:
        cluster = json.load(f)
    _check_schema(cluster, 2)
    # chorus-sim train reads it, with the model file the job prints for itself.
    model = os.path.join(d, "model.json")
    mj = subprocess.run([sys.executable, "-m", "chorus.examples.train_gpt", "--print-model-json", "--layers", "2"] +
                        JOB, capture_output=True, text=True, timeout=60)
    assert mj.returncode == 0, mj.stderr
    with open(model, "w") as f:
        f.write(mj.stdout)
    tr = subprocess.run([sim, "train", "--model", model, "--cluster", out, "--gpus", "2", "--tp", "2", "--pp", "1",
                         "--global-batch", "4", "--micro-batch", "2", "--seq", "32", "--json"],
                        capture_output=True, text=True, timeout=60)
    assert tr.returncode == 0, "chorus-sim train refused the calibrated file:\n{}\n{}".format(tr.stdout, tr.stderr)
    j = json.loads(tr.stdout)
    print("chorus-sim train on it: {}".format({k: j[k] for k in list(j)[:6]}), flush=True)
    # A file with a key chorus-sim does not know is still refused (the calibration block is the one exception).
    cluster["gpu"]["peak_tflop"] = 1.0
    bad = os.path.join(d, "bad.json")
    with open(bad, "w") as f:
        json.dump(cluster, f)
    tr = subprocess.run([sim, "train", "--model", model, "--cluster", bad, "--gpus", "2", "--tp", "2", "--pp", "1",
                         "--global-batch", "4", "--micro-batch", "2", "--seq", "32"],
                        capture_output=True, text=True, timeout=60)
    assert tr.returncode != 0 and "peak_tflop" in tr.stdout + tr.stderr, (tr.stdout, tr.stderr)


def _arguments_refused():
    sim = _tool("CHORUS_SIM")
    proc = subprocess.run([sim, "calibrate", "--out", "/nonexistent/x.json", "--tp", "3"] + JOB,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "--tp 3 must divide" in proc.stderr, (proc.returncode, proc.stderr)


def main():
    checks = harness.Checks()
    checks.run("arguments_refused", _arguments_refused)
    checks.run("calibrate_schema_and_train", _calibrate_and_train)
    checks.finish()


if __name__ == "__main__":
    main()
