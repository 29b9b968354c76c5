#!/usr/bin/env bash
# Fault injection across hosts: ranks in separate network namespaces (each an
# emulated host with its own interfaces and /dev/shm, on one bridge), so they
# talk TCP between hosts and the TCP heartbeat (CHORUS_HEARTBEAT_MS) is what
# notices a host that vanishes.  Three runs of tests/integration/fault_test.py:
#
#   kill    4 hosts x 1 rank: SIGKILL a random rank at a random moment of a
#           stream of mixed collectives, 10 trials; every survivor must return
#           chorusRemoteError naming it within the bound, exit cleanly, and
#           leave no process and no /dev/shm segment behind.
#   shrink  2 hosts x 2 ranks (shm inside a host, TCP across): kill a random
#           rank but 0, then the survivors shrink and finish the job on the
#           new communicator (checked results, agreed membership).
#   cut     4 hosts x 1 rank: a whole host becomes unreachable (its link to
#           the bridge goes down, then its rank is killed, so not even a FIN or
#           RST gets out); only the heartbeat can tell, within
#           CHORUS_HEARTBEAT_MS x 3 (the bound allows 2 s more for this shared
#           machine; the measured times are printed).
#
#   netns_fault_test.sh BUILD_DIR
#
# Needs root, `ip netns`, nsenter and python3.  Without them it FAILS with a
# message, unless CHORUS_SKIP_CLUSTER=1 is set (exit 77: ctest skipped).  Creates
# only namespaces named chorus-<pid>-*, and removes everything on exit.
set -euo pipefail

build_dir=${1:?usage: netns_fault_test.sh BUILD_DIR}
build_dir=$(cd "$build_dir" && pwd)
prog=$build_dir/tests/integration/chorus_fault_main
driver=$(cd "$(dirname "${BASH_SOURCE[0]}")/../integration" && pwd)/fault_test.py
trials=${CHORUS_FAULT_TRIALS:-10}
heartbeat_ms=1000

test_name=netns_fault_test
# shellcheck source=netns_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns_lib.sh"
cluster_require ip unshare nsenter python3 -- "$prog"
netns_remove_stale

tag=chorus-$$
hosts=("$tag-h0" "$tag-h1" "$tag-h2" "$tag-h3")
switch_ns=$tag-sw
subnet=10.232.$((RANDOM % 250 + 1))
work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-fault.XXXXXX")
keepers=()
ranks=()  # fault_test.py starts and reaps the ranks itself
created_ns=()

trap netns_cleanup EXIT
trap 'exit 130' INT TERM

netns_make_hosts "$switch_ns" "$subnet" "${hosts[@]}"
netns_start_keepers 64m 3600 "${hosts[@]}"

k4=$(IFS=,; echo "${keepers[*]}")
k2=$(IFS=,; echo "${keepers[*]:0:2}")
n4=$(IFS=,; echo "${hosts[*]}")
n2=$(IFS=,; echo "${hosts[*]:0:2}")

status=0
run() {
  local name=$1 start=$SECONDS rc=0
  shift
  echo "netns_fault_test: $name: $*"
  python3 "$driver" "$prog" --master-addr "$subnet.1" --heartbeat-ms $heartbeat_ms "$@" >"$work/$name.log" 2>&1 || rc=$?
  grep -v '"ok": true' "$work/$name.log" | sed "s/^/  [$name] /"
  echo "netns_fault_test: $name: $([[ $rc == 0 ]] && echo ok || echo FAILED) ($((SECONDS - start)) s)"
  [[ $rc == 0 ]] || status=1
}

run kill --hosts "$k4" --netns "$n4" --ranks 4 --trials "$trials" --bound-s 5
run shrink --hosts "$k2" --netns "$n2" --ranks 4 --trials "$((trials / 2))" --bound-s 5 --shrink 10
run cut --hosts "$k4" --netns "$n4" --ranks 4 --trials "$((trials / 2))" --bound-s $((3 * heartbeat_ms / 1000 + 2)) \
  --cut-cmd "ip -n $switch_ns link set port{host} {state}"
exit $status
