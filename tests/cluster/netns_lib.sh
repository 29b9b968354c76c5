# Shared by the cluster tests (source it): the checks every one makes first,
# emulated hosts in network namespaces on one bridge, each with a private
# /dev/shm, and the cleanup.
#
# The caller sets: test_name (for messages), work (a scratch dir), and the
# arrays keepers=() ranks=() created_ns=().

# skip_or_fail MESSAGE: the test cannot run here.  Exits 77 (ctest: skipped)
# when CHORUS_SKIP_CLUSTER=1 was set on purpose, else fails with the message.
skip_or_fail() {
  if [[ ${CHORUS_SKIP_CLUSTER:-0} == 1 ]]; then
    echo "$test_name: SKIPPED (CHORUS_SKIP_CLUSTER=1): $*"
    exit 77
  fi
  echo "$test_name: FAILED: $*" >&2
  echo "$test_name: run as root with the tools scripts/setup.sh installs, or set CHORUS_SKIP_CLUSTER=1 to skip this test" >&2
  exit 1
}

# cluster_require TOOL... -- FILE...: root, the commands and the built files
# (a missing built file is a failure, never a skip).
cluster_require() {
  [[ $(id -u) -eq 0 ]] || skip_or_fail "needs root for network namespaces (running as uid $(id -u))"
  while [[ $# -gt 0 && $1 != -- ]]; do
    command -v "$1" >/dev/null || skip_or_fail "'$1' not found (bash scripts/setup.sh installs it)"
    shift
  done
  [[ $# -gt 0 ]] && shift
  local f
  for f in "$@"; do
    [[ -x $f ]] || { echo "$test_name: FAILED: $f not built (build the tree first)" >&2; exit 1; }
  done
}

# netns_remove_stale: namespaces chorus-<pid>-* of an earlier run that was
# SIGKILLed (so its trap never ran) and whose script is gone.
netns_remove_stale() {
  local ns owner p
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^chorus-[0-9]+-(h[0-9]|sw)$' || true); do
    owner=${ns#chorus-}
    owner=${owner%%-*}
    if ! kill -0 "$owner" 2>/dev/null; then
      echo "$test_name: removing stale namespace $ns (its run, pid $owner, is gone)"
      for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
}

# netns_cleanup: the EXIT trap.  Everything the test started runs inside its
# namespaces: stop it by pid, then delete the namespaces (deleting the switch
# namespace deletes the bridge and the veth pairs with it).
netns_cleanup() {
  local rc=$? p ns
  set +e
  for p in "${ranks[@]}" "${keepers[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for ns in "${created_ns[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  for p in "${ranks[@]}" "${keepers[@]}"; do wait "$p" 2>/dev/null; done
  for ns in "${created_ns[@]}"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$work"
  for ns in "${created_ns[@]}"; do
    if ip netns list | grep -qw -- "$ns"; then echo "$test_name: WARNING: namespace $ns still exists" >&2; fi
  done
  exit $rc
}

# netns_make_hosts SWITCH_NS SUBNET HOST_NS...: a bridge in SWITCH_NS and one
# namespace per host, host i at SUBNET.(i+1)/24 on eth0 (its veth peer in the
# switch is port<i>).
netns_make_hosts() {
  local switch_ns=$1 subnet=$2 i=0 ns
  shift 2
  ip netns add "$switch_ns" 2>"$work/netns.err" || skip_or_fail "'ip netns add' does not work here: $(cat "$work/netns.err")"
  created_ns+=("$switch_ns")
  ip -n "$switch_ns" link set lo up
  ip -n "$switch_ns" link add br0 type bridge
  ip -n "$switch_ns" link set br0 up
  for ns in "$@"; do
    ip netns add "$ns"
    created_ns+=("$ns")
    ip -n "$switch_ns" link add "port$i" type veth peer name eth0 netns "$ns"
    ip -n "$switch_ns" link set "port$i" master br0
    ip -n "$switch_ns" link set "port$i" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    i=$((i + 1))
  done
}

# netns_start_keepers SHM_SIZE SECONDS HOST_NS...: one keeper process per host
# owns a mount namespace in which /dev/shm is a fresh tmpfs; ranks join it (and
# the host's netns) with `nsenter --target ${keepers[i]} --mount --net`.  The
# tmpfs vanishes with the keeper, so a killed run cannot leave segments behind.
# Returns when every keeper is ready (fails the test after 10 s).
netns_start_keepers() {
  local size=$1 seconds=$2 i _
  shift 2
  local hosts=("$@")
  for i in "${!hosts[@]}"; do
    ip netns exec "${hosts[$i]}" unshare --mount --propagation private \
      sh -c 'mount -t tmpfs -o size="$3",mode=1777 chorus-shm /dev/shm && touch "$1" && exec sleep "$2"' \
      keeper "$work/keeper$i.ready" "$seconds" "$size" &
    keepers+=($!)
  done
  for i in "${!hosts[@]}"; do
    for _ in $(seq 100); do
      [[ -e $work/keeper$i.ready ]] && break
      kill -0 "${keepers[$i]}" 2>/dev/null || { echo "$test_name: FAILED: host $i's keeper died" >&2; exit 1; }
      sleep 0.1
    done
    [[ -e $work/keeper$i.ready ]] || { echo "$test_name: FAILED: host $i's keeper not ready after 10 s" >&2; exit 1; }
  done
}

# netns_bench_cluster NAME SUBNET_PREFIX HOSTS KEEPER_SECONDS [SHM_SIZE]: a bench
# script's emulated cluster in one call: removes stale namespaces, sets tag,
# switch_ns, subnet (SUBNET_PREFIX.<random>), work (a fresh scratch dir named
# after NAME), the arrays keepers=() ranks=() created_ns=() and hosts=() (HOSTS
# namespaces), installs the cleanup traps, makes the hosts and starts their
# keepers (each with a /dev/shm of SHM_SIZE, default 1g, living KEEPER_SECONDS).
netns_bench_cluster() {
  local name=$1 prefix=$2 n=$3 seconds=$4 shm=${5:-1g} i
  netns_remove_stale
  tag=chorus-$$
  switch_ns=$tag-sw
  subnet=$prefix.$((RANDOM % 250 + 1))
  work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-$name.XXXXXX")
  keepers=()
  ranks=()
  created_ns=()
  trap netns_cleanup EXIT
  trap 'exit 130' INT TERM
  hosts=()
  for ((i = 0; i < n; i++)); do hosts+=("$tag-h$i"); done
  netns_make_hosts "$switch_ns" "$subnet" "${hosts[@]}"
  netns_start_keepers "$shm" "$seconds" "${hosts[@]}"
}

# netns_shape_links RATE [both]: a token bucket of RATE (128 kB of burst,
# 50 ms of queue) on every host's egress; with `both`, on its switch port's
# egress too, so the host's ingress is shaped as well.
netns_shape_links() {
  local rate=$1 both=${2:-} i
  for i in "${!hosts[@]}"; do
    ip netns exec "${hosts[$i]}" tc qdisc add dev eth0 root tbf rate "$rate" burst 128kb latency 50ms
    [[ $both == both ]] && ip netns exec "$switch_ns" tc qdisc add dev "port$i" root tbf rate "$rate" burst 128kb latency 50ms
  done
  return 0
}

# on_host H CMD...: runs CMD on emulated host H (its netns and /dev/shm).
on_host() {
  local h=$1
  shift
  nsenter --target "${keepers[$h]}" --mount --net -- "$@"
}

# ptp4l_cfg NAME [LINE...]: writes $work/NAME.cfg, a ptp4l configuration for
# the PTP cluster tests (software timestamps, free-running clock, Sync and
# Delay_Req every 2^log_sync s, announce every second; its own UDS socket and
# message tag so daemons in one namespace do not collide), then the
# role-specific LINEs (priority1, slaveOnly, clockIdentity, delay filter...).
# Reads $work and $log_sync.
ptp4l_cfg() {
  local name=$1
  shift
  {
    echo "[global]"
    echo "domainNumber 0"
    echo "time_stamping software"
    echo "free_running 1"
    echo "logSyncInterval $log_sync"
    echo "logAnnounceInterval 0"
    echo "logMinDelayReqInterval $log_sync"
    echo "tx_timestamp_timeout 10"
    echo "uds_address $work/$name.sock"
    echo "message_tag $name"
    printf '%s\n' "$@"
  } >"$work/$name.cfg"
}
