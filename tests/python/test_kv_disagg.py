"""The disaggregated-serving demo (python -m chorus.kv_disagg, docs/kv.md):
a prefill process pushes each request's paged KV cache into a decode process
with chorus.KvAgent (one notification per request) and the decode process
continues the sequences.  Checks that

* every request's tokens, and the winning logit of every decode step bit for
  bit, equal those of one process running the same model (`single`);
* one damaged page (--corrupt R: one K page of request R, changed after the
  prefill and before the transfer) is caught: request R differs, and only R
  (so the comparison looks at what the pages carry, not at something else);
* the run reports TTFT and ITL for every request;
* `kernels --corun` gives each kernel's co-run mean beside its alone mean.

Small shapes (6 requests of 40 + 8 tokens) so that it stays within seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ARGS = ["--requests", "6", "--input", "40", "--output", "8", "--rate", "50", "--timeout", "60"]


def run(mode, *extra, check=True):
    cmd = [sys.executable, "-m", "chorus.kv_disagg", mode] + ARGS + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited with {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def main():
    with tempfile.TemporaryDirectory() as d:
        ref_path, good_path, bad_path = (os.path.join(d, n) for n in ("ref.json", "good.json", "bad.json"))
        run("single", "--out", ref_path)
        with open(ref_path) as f:
            ref = json.load(f)
        assert len(ref["tokens"]) == 6 and all(len(t) == 8 for t in ref["tokens"].values()), ref
        # The model is not degenerate: the tokens vary (a constant output would
        # hide a wrong page).
        assert len({t for ts in ref["tokens"].values() for t in ts}) > 10, ref["tokens"]

        p = run("local", "--out", good_path, "--ref", ref_path)
        with open(good_path) as f:
            good = json.load(f)
        assert good["mismatched"] == [], good["mismatched"]
        assert [r["tokens"] for r in good["requests"]] == [ref["tokens"][str(i)] for i in range(6)]
        m = good["metrics"]
        assert m["ttft_ms"]["n"] == 6 and m["itl_ms"]["n"] == 6 * 7, m
        assert 0 < m["ttft_ms"]["median"] <= m["ttft_ms"]["p90"], m
        assert all(len(r["times"]) == 8 and r["times"][0] >= r["arrival"] for r in good["requests"]), good
        assert "tokens and logits equal the reference" in p.stderr, p.stderr

        p = run("local", "--out", bad_path, "--ref", ref_path, "--corrupt", "2", check=False)
        assert p.returncode == 1, (p.returncode, p.stderr)
        with open(bad_path) as f:
            bad = json.load(f)
        assert bad["mismatched"] == [2], bad["mismatched"]

        # The calibration of each kernel beside the other (kernels --corun): a
        # co-run mean for every alone mean, never below it (a neighbour cannot
        # speed a kernel up), from 8 paired windows each.
        k_path = os.path.join(d, "k.json")
        run("kernels", "--corun", "--calib-seconds", "0.05", "--out", k_path)
        with open(k_path) as f:
            k = json.load(f)
        assert k["prefill_corun_mean_s"] >= k["prefill_mean_s"] > 0, k
        assert set(k["decode_corun_mean_s"]) == set(k["decode_mean_s"]) and len(k["decode_mean_s"]) == 3, k
        assert all(k["decode_corun_mean_s"][p] >= k["decode_mean_s"][p] > 0 for p in k["decode_mean_s"]), k
        assert set(k["corun_ratios"]) == {"prefill"} | {f"decode@{p}" for p in k["decode_mean_s"]}, k
        assert all(len(r) == 8 and min(r) > 0 for r in k["corun_ratios"].values()), k
        p = run("kernels", "--calib-seconds", "0", check=False)
        assert p.returncode == 2 and "--calib-seconds" in p.stderr, (p.returncode, p.stderr)
    print("test_kv_disagg: OK")


if __name__ == "__main__":
    main()
