#!/usr/bin/python3
"""bench/plot.py's cost-model report: the model's geometric-mean error and the run's own floor.

    bench_plot_test.py PATH/TO/bench/plot.py

Synthetic rows with known times: the floor is each repeat against the median of the other repeats,
so repeats of 100/100/125 us give pairs (112.5, 100) twice and (100, 125), whose error is computed here
by hand; a size with one repeat adds no pair; a prediction of 200 against a median of 100 is a 100 %
error.  Fails (exit 1) on any mismatch.
"""
import importlib.util
import math
import sys

spec = importlib.util.spec_from_file_location("plot", sys.argv[1])
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)


def row(size, t, pred, repeat):
    return {"collective": "allreduce", "bytes": size, "nranks": 2, "library": "chorus-shm", "time_us": t,
            "busbw_gbps": 1.0, "algbw_gbps": 1.0, "predicted_us": pred, "repeat": repeat, "wrong": 0}


rows = [row(1 << 20, t, 200.0, i) for i, t in enumerate((100.0, 100.0, 125.0))]
rows += [row(1024, 10.0, 10.0, 0)]  # one repeat: no floor pair, exact prediction
summary = plot.summarise(rows)
pts = list(summary[("allreduce", 2)]["chorus-shm"].values())
failures = []

big = [r for r in pts if r["bytes"] >= 65536]
want_floor = math.exp((2 * math.log(112.5 / 100) + math.log(125 / 100)) / 3) - 1
got_floor, n = plot.noise_floor(big)
if n != 3 or abs(got_floor - want_floor) > 1e-12:
    failures.append(f"floor at >= 64K: got {got_floor} over {n} pairs, want {want_floor} over 3")
got_small, n_small = plot.noise_floor([r for r in pts if r["bytes"] < 65536])
if got_small is not None or n_small != 0:
    failures.append(f"floor of a single repeat: got {got_small} over {n_small}, want none")
err, _ = plot.geo_error([(r["predicted_us"], r["time_us"]) for r in big])
if abs(err - 1.0) > 1e-12:
    failures.append(f"model error at >= 64K: got {err}, want 1.0 (200 against a median of 100)")
report = plot.model_report(summary)
line = next((l for l in report.splitlines() if l.strip().startswith("chorus-shm")), "")
cells = line.split()
# library, collective, ranks, >=64K, floor, n, <64K, floor, n, ...
want_cells = ["chorus-shm", "allreduce", "2", "100.0%", f"{100 * want_floor:.1f}%", "1", "0.0%", "-", "1"]
if cells[:9] != want_cells:
    failures.append(f"report line {cells[:9]} != {want_cells}")
for f in failures:
    print("bench_plot_test: FAILED:", f)
print("bench_plot_test:", "FAILED" if failures else "ok")
sys.exit(1 if failures else 0)
