#!/usr/bin/env python3
"""Draw a `chorus-sim sweep --out FILE.json` (or --json) result.

usage: tools/sweep_plot.py SWEEP.json OUT.png

The first axis is the x axis; every combination of the other axes is one
line; the y axis is the time (collective: us, training: s per iteration).
A serving sweep (--job serve) draws two panels: TTFT p50 and TPOT p50
(seconds, log scale) and output tokens/s per GPU, points that miss an SLO
or overload the queue hollow.  Each point is labelled with what binds at it
(its first word).  Needs matplotlib; chorus-sim itself does not.
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
    if d["job"] == "serve":
        return plot_serve(d, x_key, rest, plt, argv[2])
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


def serve_lines(d, x_key, rest):
    """{label: [(x, point)]} for the points that ran, in the sweep's order."""
    lines = {}
    for p in d["points"]:
        if not p["ok"]:
            continue
        label = ", ".join("%s %s" % (k, p["values"][k]) for k in rest) or p.get("mode", "serve")
        lines.setdefault(label, []).append((p["values"][x_key], p))
    return lines


def plot_serve(d, x_key, rest, plt, out):
    lines = serve_lines(d, x_key, rest)
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(12, 4.8))
    xs_all = []
    for x_list in lines.values():
        for x, _ in x_list:
            if x not in xs_all:
                xs_all.append(x)
    pos = {x: i for i, x in enumerate(xs_all)}
    for n, (label, pts) in enumerate(lines.items()):
        color = "C%d" % (n % 10)
        xi = [pos[x] for x, _ in pts]
        lat.plot(xi, [p["ttft_p50_s"] for _, p in pts], "o-", color=color, label="%s TTFT" % label)
        lat.plot(xi, [p["tpot_p50_s"] for _, p in pts], "s--", color=color, label="%s TPOT" % label)
        thr.plot(xi, [p["output_tokens_per_s_per_gpu"] for _, p in pts], "o-", color=color, label=label)
        for i, (_, p) in zip(xi, pts):
            missed = p["overloaded"] or not p["binds"].startswith("SLOs met")
            y = p["output_tokens_per_s_per_gpu"]
            if missed:
                thr.plot([i], [y], "o", color="white", markeredgecolor=color, zorder=3)
            thr.annotate(p["binds"].split(" ")[0], (i, y), textcoords="offset points", xytext=(0, 6),
                         ha="center", fontsize=7)
    for a in (lat, thr):
        a.set_xticks(range(len(xs_all)))
        a.set_xticklabels(xs_all)
        a.set_xlabel(x_key)
        a.grid(alpha=0.3)
    lat.set_yscale("log")
    lat.set_ylabel("seconds (p50)")
    thr.set_ylabel("output tokens/s per GPU")
    lat.legend(fontsize=7)
    if len(lines) > 1:
        thr.legend(fontsize=7)
    s = d.get("serve", {})
    fig.suptitle("%s on %s (%s in / %s out tokens; hollow: SLO missed or overloaded)"
                 % (d.get("model", "serve"), d["cluster"], s.get("input_len", "?"), s.get("output_len", "?")))
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
