"""chorus.examples.train_gpt under chorus-run: a tiny GPT trained with tensor, pipeline (1F1B) and data
parallelism gives, step by step, the losses of one process training the same model on the same global batch.

Layouts: tp2, pp2, dp2 (2 ranks), tp2·pp2 and pp2·dp2 (4 ranks).  Tolerance: relative 1e-6 on each step's
loss.  The layouts compute the same float32 sums in other orders (a tp rank's partial products summed by an
allreduce, a vocab-parallel log-sum-exp, gradients averaged over dp), each reordering worth a few float32
ulps (6e-8 relative); through 4 SGD steps at lr 0.5 the measured relative differences were at most 2.5e-8
(tp2, tp2·pp2; 0 for pp2, 1.2e-8 for the dp layouts; printed below), so 1e-6 keeps a 40x margin.  A layout
whose tensor-parallel allreduce is skipped (``--fault skip-tp-allreduce``) must miss the reference by more
than 100x the tolerance (measured: 6.3e-4) — the check that the comparison can fail.  The split of the step
time is checked for its structure only (each kind of communication appears in the layouts that have it),
never for its values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MODEL = ["--layers", "4", "--hidden", "64", "--heads", "4", "--vocab", "128", "--seq", "32", "--micro-batch", "2",
         "--steps", "4", "--warmup", "1"]
M = 4  # micro-batches per replica
RTOL = 1e-6


def _env():
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _report(stdout, cmd):
    lines = [line for line in stdout.splitlines() if line.startswith("TRAIN_GPT ")]
    assert len(lines) == 1, "expected one TRAIN_GPT line from {}:\n{}".format(cmd, stdout)
    return json.loads(lines[0].split(" ", 1)[1])


def _run(tp, pp, dp, extra=()):
    world = tp * pp * dp
    args = ["-m", "chorus.examples.train_gpt", "--tp", str(tp), "--pp", str(pp), "--dp", str(dp),
            "--micro-batches", str(M if world > 1 else M * dp), "--timeout", "120"] + MODEL + list(extra)
    if world == 1:
        cmd = [sys.executable] + args
    else:
        launcher = os.environ.get("CHORUS_RUN")
        assert launcher and os.path.exists(launcher), "set CHORUS_RUN to the chorus-run binary (ctest does)"
        cmd = [launcher, "-n", str(world), "--timeout", "150", "--no-prefix", "--", sys.executable] + args
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=_env())
    assert proc.returncode == 0, "{} exited {}:\n{}\n{}".format(cmd, proc.returncode, proc.stdout, proc.stderr)
    return _report(proc.stdout, cmd)


_REFERENCE = {}


def _reference(dp):
    if dp not in _REFERENCE:
        _REFERENCE[dp] = _run(1, 1, 1, ["--micro-batches", str(M * dp)])["losses"]
    return _REFERENCE[dp]


def _rel_diff(a, b):
    assert len(a) == len(b), (a, b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def _layout(tp, pp, dp):
    got = _run(tp, pp, dp)
    ref = _reference(dp)
    diff = _rel_diff(got["losses"], ref)
    print("tp{} pp{} dp{}: losses {} reference {} max relative difference {:.2e} (tolerance {:.0e})".format(
        tp, pp, dp, [round(x, 6) for x in got["losses"]], [round(x, 6) for x in ref], diff, RTOL), flush=True)
    assert diff <= RTOL, "tp{} pp{} dp{}: losses {} differ from the reference {} by {:.2e} > {:.0e}".format(
        tp, pp, dp, got["losses"], ref, diff, RTOL)
    assert ref[-1] != ref[0], "the reference's loss did not move: the steps test nothing"
    # The report's structure: one row per rank, each kind of communication where the layout has it.
    assert got["world"] == tp * pp * dp and len(got["ranks"]) == got["world"], got
    for r in got["ranks"]:
        assert r["step_s"] > 0 and r["compute_s"] > 0, r
        assert (r["tp_s"] > 0) == (tp > 1) and (r["pp_s"] > 0) == (pp > 1) and (r["dp_s"] > 0) == (dp > 1), r


def _skipped_tp_allreduce_is_caught():
    got = _run(2, 1, 1, ["--fault", "skip-tp-allreduce"])
    diff = _rel_diff(got["losses"], _reference(1))
    print("tp2 without its forward allreduce: max relative difference {:.2e}".format(diff), flush=True)
    assert diff > 100 * RTOL, "skipping the tp allreduce left the losses within {:.2e} of the reference".format(diff)


def _model_json():
    proc = subprocess.run([sys.executable, "-m", "chorus.examples.train_gpt", "--print-model-json"] + MODEL,
                          capture_output=True, text=True, timeout=60, env=_env())
    assert proc.returncode == 0, proc.stderr
    m = json.loads(proc.stdout)
    assert (m["layers"], m["hidden"], m["heads"], m["ffn_hidden"], m["vocab"]) == (4, 64, 4, 256, 128), m


def main():
    checks = harness.Checks()
    checks.run("model_json", _model_json)
    for tp, pp, dp in ((2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (1, 2, 2)):
        checks.run("tp{}_pp{}_dp{}".format(tp, pp, dp), _layout, tp, pp, dp)
    checks.run("skipped_tp_allreduce_is_caught", _skipped_tp_allreduce_is_caught)
    checks.finish()


if __name__ == "__main__":
    main()
