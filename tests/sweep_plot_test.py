#!/usr/bin/env python3
"""tools/sweep_plot.py on a serving sweep (chorus-sim sweep --job serve --out):
hand-written points, two panels.  Checks the grouping into lines (one per
combination of the axes after the first, points in sweep order, failed
points left out) and that a PNG is written.  Exit 77 (skipped) without
matplotlib."""
import importlib.util
import json
import os
import sys
import tempfile


def point(rate, pd, ok=True, binds="SLOs met (100 % of requests)", overloaded=False):
    p = {"values": {"rate": rate, "pd": pd}, "ok": ok}
    if not ok:
        p["error"] = "does not fill the GPUs"
        return p
    p.update({"time_s": 0.1 * float(rate), "binds": binds, "mode": "disaggregated " + pd, "ttft_p50_s": 0.1 * float(rate),
              "ttft_p90_s": 0.2, "tpot_p50_s": 0.02, "tpot_p90_s": 0.03, "output_tokens_per_s": 100.0 * float(rate),
              "output_tokens_per_s_per_gpu": 12.5 * float(rate), "throughput_rps": float(rate),
              "goodput_rps": float(rate), "slo_attainment": 1.0, "overloaded": overloaded})
    return p


def main(argv):
    tool = argv[1]
    spec = importlib.util.spec_from_file_location("sweep_plot", tool)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc = {"cluster": "t", "job": "serve", "model": "m", "serve": {"input_len": 1024, "output_len": 128},
           "axes": [{"key": "rate", "values": ["1", "4"]}, {"key": "pd", "values": ["1:3", "2:2", "3:3"]}],
           "points": [point("1", "1:3"), point("1", "2:2"), point("1", "3:3", ok=False),
                      point("4", "1:3", binds="overloaded (capacity 3 req/s)", overloaded=True),
                      point("4", "2:2"), point("4", "3:3", ok=False)]}
    lines = mod.serve_lines(doc, "rate", ["pd"])
    assert list(lines) == ["pd 1:3", "pd 2:2"], lines
    assert [x for x, _ in lines["pd 1:3"]] == ["1", "4"], lines
    assert lines["pd 1:3"][1][1]["overloaded"] is True
    try:
        import matplotlib  # noqa: F401
    except Exception:  # noqa: BLE001
        print("matplotlib not available: the drawing is not checked")
        return 77
    with tempfile.TemporaryDirectory() as d:
        src, png = os.path.join(d, "s.json"), os.path.join(d, "s.png")
        with open(src, "w") as f:
            json.dump(doc, f)
        rc = mod.main(["sweep_plot.py", src, png])
        assert rc == 0, rc
        with open(png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
