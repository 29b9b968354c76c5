#!/usr/bin/env python3
"""CI check of chorus-sim against the published runs of bench/validation/rows.json (docs/validation.md).

Recomputes the validation summary by running chorus-sim on every expressible row, and fails if
  * a row that the table calls expressible no longer runs (chorus-sim error, missing JSON key), or
  * the overall mean |error| is more than one point above the documented figure
    (bench/validation/summary.json, which `bash bench/sim_validate.sh --update-doc` writes), or
  * docs/validation.md's machine-readable summary line disagrees with summary.json (the doc and the
    baseline are written by the same run, so they can only disagree if one was edited by hand), or
  * the table no longer meets the floor the issue asks for (30 rows, 6 sources) or the rows are not
    the ones the baseline was computed from (the compared-row count changed without --update-doc).

Usage: sim_validation_test.py PATH/TO/chorus-sim
"""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VALIDATE = ROOT / "bench" / "validation" / "validate.py"
SUMMARY = ROOT / "bench" / "validation" / "summary.json"
ERRORS = ROOT / "bench" / "validation" / "errors.json"  # chorus-sim's uncertainty bands are built from it
DOC = ROOT / "docs" / "validation.md"


def fail(msg: str) -> None:
    print(f"FAIL: {msg}")
    sys.exit(1)


def main() -> None:
    if len(sys.argv) != 2:
        fail("usage: sim_validation_test.py PATH/TO/chorus-sim")
    sim = sys.argv[1]
    base = json.loads(SUMMARY.read_text())

    m = re.search(r"validation-summary: `(\{.*\})`", DOC.read_text())
    if not m:
        fail(f"{DOC} has no 'validation-summary: `{{...}}`' line")
    doc_line = json.loads(m.group(1))
    if doc_line != base:
        fail(f"{DOC}'s summary line {doc_line} differs from {SUMMARY} {base}: rerun "
             f"`bash bench/sim_validate.sh --update-doc`")

    p = subprocess.run([sys.executable, str(VALIDATE), "--sim", sim, "--quiet", "--check", str(SUMMARY),
                        "--check-errors", str(ERRORS)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    print(p.stdout, end="")
    print(p.stderr, end="", file=sys.stderr)
    m = re.search(r"^validation-summary: (\{.*\})$", p.stdout, re.M)
    if not m:
        fail("validate.py printed no summary line")
    now = json.loads(m.group(1))
    if now["failed"]:
        fail(f"{now['failed']} expressible row(s) no longer run; `bash bench/sim_validate.sh` names them")
    if now["rows"] < 30 or now["sources"] < 6:
        fail(f"the table has {now['rows']} rows from {now['sources']} sources; the issue asks for >= 30 from >= 6")
    if now["compared"] != base["compared"]:
        fail(f"{now['compared']} rows compared, the documented summary has {base['compared']}: a row changed "
             f"status without `bash bench/sim_validate.sh --update-doc`")
    if p.returncode != 0:
        fail(f"validate.py --check exited {p.returncode} (overall mean |error| {now['overall_mean_abs_error_pct']} % "
             f"against the documented {base['overall_mean_abs_error_pct']} % + 1 point)")
    print(f"ok: {now['compared']} rows, overall mean |error| {now['overall_mean_abs_error_pct']} % "
          f"(documented {base['overall_mean_abs_error_pct']} %)")


if __name__ == "__main__":
    main()
