#!/bin/sh
# One rank of a failure test: rank $1 exits with status $2 at once; every other
# rank waits (up to $3 seconds, default 120) for the launcher to stop it.
# Used to check that chorus-run reports the failing rank's status and brings
# the rest of the job down instead of waiting for it.
if [ "${CHORUS_RANK:?CHORUS_RANK unset: run me under chorus-run}" = "$1" ]; then
  exit "$2"
fi
exec sleep "${3:-120}"
