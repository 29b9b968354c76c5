#!/usr/bin/env python3
"""Draw a `chorus-sim sweep --out FILE.json` (or --json) result.

usage: tools/sweep_plot.py SWEEP.json OUT.png

The first axis is the x axis; every combination of the other axes is one
line; the y axis is the time (collective: us, training: s per iteration).
Each point is labelled with what binds at it (its first word).  Needs
matplotlib; chorus-sim itself does not.
"""
import json
import sys


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    with open(argv[1]) as f:
        d = json.load(f)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        sys.stderr.write("matplotlib is not available (%s)\n" % e)
        return 3
    axes = [a["key"] for a in d["axes"]]
    x_key, rest = axes[0], axes[1:]
    coll = d["job"] == "collective"
    lines = {}
    for p in d["points"]:
        if not p["ok"]:
            continue
        label = ", ".join("%s %s" % (k, p["values"][k]) for k in rest) or d["job"]
        x = p["values"][x_key]
        y = p["time_s"] * (1e6 if coll else 1)
        lines.setdefault(label, []).append((x, y, p["binds"].split(" ")[0]))
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, pts in lines.items():
        xs = [x for x, _, _ in pts]
        ys = [y for _, y, _ in pts]
        ax.plot(range(len(xs)), ys, marker="o", label=label)
        for i, (_, y, b) in enumerate(pts):
            ax.annotate(b, (i, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        ax.set_xticks(range(len(xs)))
        ax.set_xticklabels(xs)
    ax.set_xlabel(x_key)
    ax.set_ylabel("time (us)" if coll else "s per iteration")
    what = d.get("model") or "%s %s" % (d["collective"]["collective"], d["collective"]["bytes"])
    ax.set_title("%s on %s" % (what, d["cluster"]))
    if len(lines) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(argv[2], dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
