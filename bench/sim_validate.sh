#!/usr/bin/env bash
# chorus-sim against published end-to-end measurements: runs every expressible row of
# bench/validation/rows.json and prints the table (id, measured, predicted, error) and the summary
# (mean and worst |error| per group and overall, rows, rows not yet expressible).
#
#   bash bench/sim_validate.sh [--build DIR] [--update-doc] [--markdown FILE] [--explain ID] [--try-pending]
#                              [--only IDS|GROUPS] [other validate.py options: python3 bench/validation/validate.py -h]
#
# --update-doc rewrites the generated table of docs/validation.md and bench/validation/summary.json
# (the figure the CI test `integration.sim.validation` holds the simulator to).  Needs python3 (stdlib).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
args=()
update=0
while [ $# -gt 0 ]; do
  case "$1" in
    --update-doc) update=1 ;;
    --build) [ $# -ge 2 ] || { echo "sim_validate.sh: --build needs a folder" >&2; exit 2; }
             args+=(--build "$2"); shift ;;
    *) args+=("$1") ;;
  esac
  shift
done
if [ "$update" = 1 ]; then
  args+=(--update-doc "$here/docs/validation.md" --write-summary "$here/bench/validation/summary.json"
        --write-errors "$here/bench/validation/errors.json")
fi
exec python3 "$here/bench/validation/validate.py" "${args[@]}"
