#!/bin/sh
# One rank on a pretend host: as_host.sh K PROGRAM ARGS... runs PROGRAM with
# CHORUS_HOST_ID = CHORUS_RANK / K, so ranks 0..K-1 form host 0, K..2K-1 host 1,
# and so on (shared memory inside a host, TCP between hosts).
k=${1:?usage: as_host.sh RANKS_PER_HOST PROGRAM ARGS...}
shift
CHORUS_HOST_ID=$(( ${CHORUS_RANK:?CHORUS_RANK unset: run me under chorus-run} / k ))
export CHORUS_HOST_ID
exec "$@"
