"""chorus-sim again on measured train_gpt rows (issue 35; docs/validation.md, "CPU training runs").

    python3 bench/train_gpt_repredict.py SIM [--rows FILE] [--model-tag TAG] [--out FILE.jsonl --new-tag TAG]

Re-predicts the measured rows of an earlier bench/train_gpt_validate.sh comparison with the chorus-sim at SIM
(after a model change), from the same inputs those predictions had: each repeat's cluster file
(bench/train_gpt_cluster_2026-12-07b-N.json, what that repeat's `chorus-sim calibrate` wrote) and the job's model
file (bench/train_gpt_model_2026-12-07b.json), with the flags bench/train_gpt_validate.sh passes.  Nothing is
run or measured: the measured step times are the rows' own.  Prints per repeat the measured step, the stored
prediction, the new one and both errors, then the count within 10 %, the mean and worst |error| and whether
the ranking matches; `--out` writes the rows with the new prediction (the old as `stored_predicted_s`, the
new model's name from `--new-tag` as `repredicted_by`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# The job's shape and chorus-sim's flags, as bench/train_gpt_validate.sh has them (keep in step).
GLOBAL, MB, SEQ = 16, 2, 64
FLAGS = ["--zero", "0", "--optimizer", "sgd", "--library", "chorus", "--no-sequence-parallel", "--no-flash-attention",
         "--recompute", "none", "--no-async-tp", "--no-overlap-dp", "--json"]


def layout(r):
    tp, pp, dp = (int(w[2:]) for w in r["layout"].split())
    return tp, pp, dp


def predict(sim, model, cluster, tp, pp, dp):
    cmd = [sim, "train", "--model", model, "--cluster", cluster, "--gpus", str(tp * pp * dp), "--tp", str(tp),
           "--pp", str(pp), "--dp", str(dp), "--global-batch", str(GLOBAL), "--micro-batch", str(MB), "--seq",
           str(SEQ)] + FLAGS
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["iteration_time_s"]


def summary(rows, key):
    errs = [abs(r[key] / r["measured_s"] - 1) for r in rows]
    meas = [r["layout"] for r in sorted(rows, key=lambda r: r["measured_s"])]
    pred = [r["layout"] for r in sorted(rows, key=lambda r: r[key])]
    return sum(e <= 0.10 for e in errs), 100 * sum(errs) / len(errs), 100 * max(errs), meas == pred


def main(argv):
    args = list(argv)
    if not args or args[0].startswith("-"):
        print(__doc__)
        return 2
    sim = args.pop(0)
    opt = {"--rows": os.path.join(HERE, "train_gpt_validate_2026-12-07b.jsonl"), "--model-tag": "model2 376235c",
           "--out": "", "--new-tag": ""}
    while args:
        k = args.pop(0)
        if k not in opt or not args:
            print("unknown or incomplete option {}\n{}".format(k, __doc__))
            return 2
        opt[k] = args.pop(0)
    model = os.path.join(HERE, "train_gpt_model_2026-12-07b.json")
    rows = [json.loads(line) for line in open(opt["--rows"]) if line.strip()]
    rows = [r for r in rows if r["model"] == opt["--model-tag"]]
    if not rows:
        print("no rows of {} in {}".format(opt["--model-tag"], opt["--rows"]))
        return 1
    repeats = sorted({r["repeat"] for r in rows})
    out = []
    for n in repeats:
        cluster = os.path.join(HERE, "train_gpt_cluster_2026-12-07b-{}.json".format(n))
        rep = [dict(r) for r in rows if r["repeat"] == n]
        print("repeat {} ({}; cluster {})".format(n, opt["--model-tag"], os.path.basename(cluster)))
        print("| layout | ranks | measured (s) | stored prediction (s) | error | re-prediction (s) | error |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in rep:
            r["stored_predicted_s"] = r["predicted_s"]
            r["repredicted_by"] = opt["--new-tag"]
            r["predicted_s"] = predict(sim, model, cluster, *layout(r))
            m = r["measured_s"]
            print("| {} | {} | {:.3f} | {:.3f} | {:+.1f} % | {:.3f} | {:+.1f} % |".format(
                r["layout"], r["ranks"], m, r["stored_predicted_s"], 100 * (r["stored_predicted_s"] / m - 1),
                r["predicted_s"], 100 * (r["predicted_s"] / m - 1)))
        for key, what in (("stored_predicted_s", "stored"), ("predicted_s", "re-predicted")):
            w, mean, worst, same = summary(rep, key)
            print("{}: within 10 %: {} of {}; mean |error| {:.1f} %, worst {:.1f} %; rankings equal: {}".format(
                what, w, len(rep), mean, worst, same))
        print()
        out += rep
    for key, what in (("stored_predicted_s", "stored"), ("predicted_s", "re-predicted")):
        w, mean, worst, _ = summary(out, key)
        print("all {} rows, {}: within 10 %: {}; mean |error| {:.1f} %, worst {:.1f} %".format(
            len(out), what, w, mean, worst))
    if opt["--out"]:
        with open(opt["--out"], "w") as f:
            for r in out:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
