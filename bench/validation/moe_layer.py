#!/usr/bin/env python3
"""chorus-sim's MoE block against Megatron-LM's MoE layer benchmark (calibration data, not validation).

Megatron-LM times one MoELayer (router, permutation, token dispatcher, the experts' grouped GEMMs, shared
experts, combine) forward and backward with CUDA events on 8 H100 of one node, expert parallel 8, forced
load balance, after a long GEMM that hides the router's launch cost; its regression baselines are
public: NVIDIA/Megatron-LM tests/functional_tests/test_cases/common/moe_perf/{test_cases.py,
baseline.json} (commit cf39a4ddcf, "Add moe layer perf UT", 2025-12-17).  This script rebuilds each
case's layer as a one-layer chorus model, runs `chorus-sim train --json` on the h100-rail preset with
the case's layout, and prints the block's predicted forward and backward (`moe_block`) next to the
baseline.  It is a kernel-level check of the MoE block's pricing, kept apart from the end-to-end
validation rows (docs/validation.md, "Calibration data").

    python3 bench/validation/moe_layer.py [--build DIR | --sim PATH] [--markdown]

Standard library only.  Errors are (predicted - measured) / measured.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The two proxy models of test_cases.py (seq 4096, micro-batch 1, 8 attention heads: the MoE layer
# alone is timed, so the attention shape does not enter the block).
PROXIES = {
    "mixtral": {"hidden": 4096, "experts": 8, "top_k": 2, "expert_ffn_hidden": 14336},
    "deepseek": {"hidden": 7168, "experts": 32, "top_k": 8, "expert_ffn_hidden": 2048, "shared_experts": 1,
                 "n_group": 8, "topk_group": 4},
}
# baseline.json: (forward ms, backward ms) per case; the dispatcher: alltoall (Megatron's all-to-all
# dispatcher), deepep and hybridep (the flex dispatcher's backends; chorus-sim's hierarchical dispatch
# prices DeepEP's: one copy per GPU hit, no permute before the dispatch).  fp8: e4m3, blockwise recipe.
BASELINE = {
    ("mixtral", "alltoall", "bf16"): (4.32689, 7.68433),
    ("mixtral", "deepep", "bf16"): (4.63555, 7.85436),
    ("mixtral", "hybridep", "bf16"): (4.34260, 7.74078),
    ("mixtral", "alltoall", "fp8"): (3.78763, 6.61825),
    ("mixtral", "deepep", "fp8"): (4.10115, 6.82720),
    ("mixtral", "hybridep", "fp8"): (3.70074, 6.57168),
    ("deepseek", "alltoall", "bf16"): (7.11917, 10.48267),
    ("deepseek", "deepep", "bf16"): (5.68172, 9.05514),
    ("deepseek", "hybridep", "bf16"): (5.39083, 8.79500),
    ("deepseek", "alltoall", "fp8"): (7.60927, 10.12646),
    ("deepseek", "deepep", "fp8"): (6.03477, 8.60211),
    ("deepseek", "hybridep", "fp8"): (5.14289, 7.68749),
}


def model_json(name: str) -> dict:
    p = dict(PROXIES[name])
    moe = {k: p[k] for k in ("experts", "top_k", "expert_ffn_hidden", "shared_experts", "n_group", "topk_group") if k in p}
    return {"name": f"Megatron moe_perf {name} proxy", "layers": 1, "hidden": p["hidden"], "heads": 8, "kv_heads": 8,
            "ffn_hidden": 4 * p["hidden"], "vocab": 32000, "activation": "swiglu", "moe": moe, "dropout": False}


def predict(sim: Path, model: Path, dispatcher: str, dtype: str) -> dict:
    cmd = [str(sim), "train", "--model", str(model), "--cluster", str(ROOT / "configs/clusters/h100-rail.json"),
           "--gpus", "8", "--dp", "8", "--ep", "8", "--global-batch", "8", "--micro-batch", "1", "--seq", "4096",
           "--moe-dispatch", "alltoall" if dispatcher == "alltoall" else "hierarchical",
           # 5 warm-up and 20 timed iterations of one layer, each behind a barrier and a sync: well under a
           # second of GPU work after idling, so the boost clock of the kernel benchmarks, not a training
           # run's sustained one.
           "--clock", "burst", "--json"]
    if dtype == "fp8":
        cmd.append("--fp8")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise SystemExit(f"moe_layer.py: {' '.join(cmd)} failed: {p.stderr.strip()}")
    return json.loads(p.stdout)["moe_block"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--sim", default=None)
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    a = ap.parse_args()
    sim = Path(a.sim) if a.sim else Path(a.build) / "tools" / "chorus-sim"
    if not sim.exists():
        print(f"moe_layer.py: no simulator at {sim} (build it, or pass --sim)", file=sys.stderr)
        return 2
    errs: dict[str, list[float]] = {}
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in PROXIES:
            path = Path(tmp) / f"{name}.json"
            path.write_text(json.dumps(model_json(name)))
            for (proxy, disp, dt), (mf, mb) in BASELINE.items():
                if proxy != name:
                    continue
                b = predict(sim, path, disp, dt)
                pf, pb = b["forward_s"] * 1e3, b["backward_s"] * 1e3
                ef, eb = 100 * (pf - mf) / mf, 100 * (pb - mb) / mb
                errs.setdefault(dt, []).extend([abs(ef), abs(eb)])
                lines.append((f"{name}_{disp}_tp1ep8_{dt}", mf, pf, ef, mb, pb, eb, b))
    if a.markdown:
        print("| case | forward: measured | predicted | error | backward: measured | predicted | error |")
        print("|---|---|---|---|---|---|---|")
        for c, mf, pf, ef, mb, pb, eb, _ in lines:
            print(f"| {c} | {mf:.2f} ms | {pf:.2f} ms | {ef:+.1f}% | {mb:.2f} ms | {pb:.2f} ms | {eb:+.1f}% |")
    else:
        print(f"{'case':34} {'fwd meas':>9} {'pred':>7} {'err':>7}   {'bwd meas':>9} {'pred':>7} {'err':>7}   "
              "parts (ms): experts fwd / shared fwd / permute / dispatch / combine")
        for c, mf, pf, ef, mb, pb, eb, b in lines:
            parts = " / ".join(f"{b[k] * 1e3:.2f}" for k in ("experts_fwd_s", "shared_fwd_s", "permute_s", "dispatch_s", "combine_s"))
            print(f"{c:34} {mf:9.2f} {pf:7.2f} {ef:+6.1f}%   {mb:9.2f} {pb:7.2f} {eb:+6.1f}%   {parts}")
    allv = [e for v in errs.values() for e in v]
    summary = {dt: round(sum(v) / len(v), 1) for dt, v in errs.items()}
    summary["all"] = round(sum(allv) / len(allv), 1)
    print("moe-layer mean |error| (forward and backward, %):", json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
