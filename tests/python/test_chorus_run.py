"""The package under chorus-run with 2 and 4 ranks: Communicator.from_env and
the torch backend in real launched processes.  Each rank prints one JSON line;
the test asserts that every rank reported ok."""

from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _launch(world):
    launcher = os.environ.get("CHORUS_RUN")
    assert launcher and os.path.exists(launcher), "set CHORUS_RUN to the chorus-run binary (ctest does)"
    cmd = [launcher, "-n", str(world), "--timeout", "120", "--no-prefix", "--", sys.executable,
           os.path.join(HERE, "chorus_run_rank.py"), harness.store_path("run")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, "chorus-run exited {}:\n{}\n{}".format(proc.returncode, proc.stdout, proc.stderr)
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in reports) == list(range(world)), proc.stdout
    assert all(r["ok"] and r["world"] == world for r in reports), reports


def main():
    checks = harness.Checks()
    for world in (2, 4):
        checks.run(f"chorus_run_{world}ranks", _launch, world)
    checks.finish()


if __name__ == "__main__":
    main()
