"""Repeats of bench/train_gpt_validate.sh side by side (issue 35; docs/validation.md, "CPU training runs").

    python3 bench/train_gpt_summary.py OUT_DIR1 OUT_DIR2 OUT_DIR3 [--markdown]

Each OUT_DIR is one repeat (its own calibration, its own runs, its rows.jsonl).  Per layout: each repeat's
measured step, prediction and error; the median measured and predicted; per repeat the count within 10 % and
whether chorus-sim ranks the layouts as measured; the repeat-to-repeat spread of the measurements (max/min of
each layout's measured step), which bounds what any model can match, and whether the median prediction lies
inside the measured range.
"""

from __future__ import annotations

import json
import os
import statistics
import sys


def load(d):
    rows = [json.loads(line) for line in open(os.path.join(d, "rows.jsonl")) if line.strip()]
    return {r["layout"]: r for r in rows}


def ranking(rows, key):
    return [r["layout"] for r in sorted(rows.values(), key=lambda r: r[key])]


def main(argv):
    md = "--markdown" in argv
    dirs = [a for a in argv if a != "--markdown"]
    if not dirs:
        print(__doc__)
        return 2
    reps = [load(d) for d in dirs]
    layouts = list(reps[0])
    n = len(reps)
    head = ["layout", "ranks"] + ["measured {} (s)".format(i + 1) for i in range(n)] + \
        ["predicted {} (s)".format(i + 1) for i in range(n)] + ["error {}".format(i + 1) for i in range(n)] + \
        ["measured spread", "median predicted inside measured range"]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for lay in layouts:
        rs = [r[lay] for r in reps if lay in r]
        meas = [r["measured_s"] for r in rs]
        pred = [r["predicted_s"] for r in rs]
        errs = ["{:+.1f} %".format(100 * (p / m - 1)) for p, m in zip(pred, meas)]
        print("| " + " | ".join([lay.replace(" dp1", "").replace(" pp1", "").replace("tp1 ", ""), str(rs[0]["ranks"])] +
                                ["{:.3f}".format(x) for x in meas] + ["{:.3f}".format(x) for x in pred] + errs +
                                ["{:.2f}x".format(max(meas) / min(meas)),
                                 "yes" if min(meas) <= statistics.median(pred) <= max(meas) else "no"]) + " |")
    print()
    for i, r in enumerate(reps):
        errs = [abs(x["predicted_s"] / x["measured_s"] - 1) for x in r.values()]
        m_rank, p_rank = ranking(r, "measured_s"), ranking(r, "predicted_s")
        print("repeat {} ({}): within 10 %: {} of {}; mean |error| {:.1f} %, worst {:.1f} %; rankings equal: {}".format(
            i + 1, dirs[i], sum(e <= 0.10 for e in errs), len(errs), 100 * statistics.mean(errs), 100 * max(errs),
            m_rank == p_rank))
        if not md:
            print("  measured:  " + ", ".join(m_rank))
            print("  simulated: " + ", ".join(p_rank))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
