#!/usr/bin/env python3
"""Every time chorus-sim prints for a GPU cluster carries its uncertainty band (issue 35 item 4).

Runs each pricing subcommand (collective, collective sweep, train, search, infer, infer concurrency sweep,
sweep) on an H100 cluster, text and --json, and checks
  * text: every line that prints a prediction's time carries the band "(-L %/+H % from N validation rows)"
    and the output ends with the 'uncertainty:' line naming the kind;
  * --json: an 'uncertainty' object whose numbers are the band computed here from
    bench/validation/errors.json by the rule of src/sim/uncertainty.hpp (range of 1 / (1 + e) - 1 over the
    rows of the kind on the generation, every row of the kind below 3 of them), so the band follows the rows.

Usage: sim_uncertainty_test.py PATH/TO/chorus-sim
"""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = str(ROOT / "configs" / "clusters" / "h100-rail.json")
MODELS = ROOT / "configs" / "models"
BAND = re.compile(r"\(([+-]\d+) %/([+-]\d+) % from (\d+) validation rows?\)")
failures = 0


def check(ok: bool, what: str, detail: str = "") -> None:
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures += 1
        if detail:
            print("     " + detail.replace("\n", "\n     ")[:3000])


def expected(kind: str) -> tuple[float, float, int]:
    """The band of kind on Hopper, from errors.json."""
    rows = json.loads((ROOT / "bench" / "validation" / "errors.json").read_text())["rows"]
    of_kind = [r for r in rows if r["kind"] == kind]
    hopper = [r for r in of_kind if re.search(r"(^|[^A-Z])(GH|H)\d", r["gpu"].upper())]
    use = hopper if len(hopper) >= 3 else of_kind
    t = [1 / (1 + r["error_pct"] / 100) - 1 for r in use]
    return 100 * min(t), 100 * max(t), len(use)


def run(sim: str, args: list[str]) -> str:
    p = subprocess.run([sim, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
    if p.returncode != 0:
        check(False, "chorus-sim " + " ".join(args), p.stderr)
        return ""
    return p.stdout


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: sim_uncertainty_test.py PATH/TO/chorus-sim")
    sim = sys.argv[1]
    llama = str(MODELS / "Llama-3.1-8B")
    mixtral = str(MODELS / "Mixtral-8x7B-v0.1")
    train = ["train", "--model", llama, "--cluster", CLUSTER, "--gpus", "16", "--tp", "2", "--pp", "2",
             "--global-batch", "64", "--seq", "2048"]
    cases = [
        # (name, kind, args, regex of the lines that print a predicted time)
        ("collective", "collective", ["collective", "--cluster", CLUSTER, "--gpus", "8", "--bytes", "64M"],
         r" us\b"),
        ("collective sweep", "collective", ["collective", "--cluster", CLUSTER, "--gpus", "8", "--bytes", "1M:4M"],
         r"^\s+\d+\s+\d"),
        ("train", "dense-train", train, r"s/iteration|closed-form estimate|^  \S+\s+\d+\.\d{4} s"),
        ("train moe", "moe-train", ["train", "--model", mixtral, "--cluster", CLUSTER, "--gpus", "16", "--tp", "2",
                                     "--ep", "8", "--global-batch", "64", "--seq", "2048", "--estimate"],
         r"s/iteration"),
        ("search", "dense-train", ["search", "--model", llama, "--cluster", CLUSTER, "--gpus", "16",
                                   "--global-batch", "64", "--seq", "2048", "--top", "3", "--no-progress"],
         r"^\s*\d+\. "),
        ("infer", "inference", ["infer", "--model", llama, "--cluster", CLUSTER, "--gpus", "1", "--tp", "1",
                                "--requests", "20", "--concurrency", "4"], r"prefill .* ms"),
        ("infer sweep", "inference", ["infer", "--model", llama, "--cluster", CLUSTER, "--gpus", "1", "--tp", "1",
                                      "--requests", "20", "--concurrency", "1,4"], None),
        ("sweep", "collective", ["sweep", "--cluster", CLUSTER, "--gpus", "8", "--collective", "allreduce",
                                 "--bytes", "1M", "--vary", "nic_gbit_s=200,400"], None),
    ]
    for name, kind, args, timed in cases:
        lo, hi, n = expected(kind)
        want = f"({lo:+.0f} %/{hi:+.0f} % from {n} validation row{'s' if n != 1 else ''})"
        out = run(sim, args)
        if not out:
            continue
        lines = out.splitlines()
        check(any(l.lstrip("# ").startswith("uncertainty:") and kind in l and want[1:-1] in l for l in lines),
              f"{name}: an 'uncertainty:' line with {want} ({kind})", out)
        if timed:
            priced = [l for l in lines if re.search(timed, l) and not l.lstrip("# ").startswith("uncertainty")]
            check(bool(priced) and all(want in l for l in priced),
                  f"{name}: every time line ({len(priced)}) carries {want}",
                  "\n".join(l for l in priced if want not in l) or out)
        js = run(sim, args + ["--json"])
        if not js:
            continue
        doc = json.loads(js)
        docs = doc if isinstance(doc, list) else [doc]
        for d in docs:
            u = d.get("uncertainty")
            check(isinstance(u, dict) and abs(u["low_pct"] - lo) < 1e-6 and abs(u["high_pct"] - hi) < 1e-6
                  and u["rows"] == n and u["kind"] == kind,
                  f"{name} --json: uncertainty {lo:+.2f} %/{hi:+.2f} % from {n} rows, computed from errors.json",
                  json.dumps(u))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
