#!/usr/bin/env python3
"""Fault injection: SIGKILL a random rank at a random moment of a stream of mixed
collectives; every survivor must return chorusRemoteError naming the killed rank
within the bound, exit cleanly, and leave nothing behind (no /dev/shm segment, no
process).  As root the ranks of one host share a private /dev/shm (a tmpfs in a
mount namespace of their own), so that only their own segments are counted.

Usage: fault_test.py FAULT_MAIN [--trials 10] [--ranks 4] [--bound-s 5] [--tcp | --transport NAME]
                     [--shrink STEPS]
                     [--hosts KEEPER_PID,... --netns NS,... --master-addr ADDR
                      [--cut-cmd 'ip -n SW link set port{host} {state}'] [--heartbeat-ms MS]]

--shrink STEPS: after the error every survivor calls chorusCommShrink and runs
  STEPS checked steps on the new communicator (fault_main.cpp); the survivors must
  all agree on the same members (the old ranks but the victim, in order).  The
  victim is then never rank 0, whose process holds the job's rendezvous store.
--hosts: the ranks run on emulated hosts (network namespaces, tests/cluster):
  rank r on host r * len(hosts) // ranks, entered with nsenter into that host's
  keeper process (its netns and its private /dev/shm); --netns names the hosts'
  namespaces, to check that no process is left in them.
--cut-cmd: instead of killing one rank, a whole host becomes
  unreachable: the command (with {host} and {state}=down) takes its link down,
  then every rank on it is SIGKILLed (its packets go nowhere); the link comes
  back ({state}=up) after the trial.  Survivors may name any rank of that host.

Prints one JSON line per trial, the detection times and 'N passed, M failed'.
"""
import argparse, json, os, random, secrets, select, shutil, signal, socket, statistics, subprocess, sys, time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_names(keepers):
    """chorus segments in /dev/shm: this machine's, or each emulated host's."""
    if not keepers:
        try:
            return {n for n in os.listdir("/dev/shm") if n.startswith("chorus-")}
        except FileNotFoundError:
            return set()
    names = set()
    for h, k in enumerate(keepers):
        out = subprocess.run(["nsenter", "--target", str(k), "--mount", "ls", "-1", "/dev/shm"],
                             capture_output=True, text=True, timeout=10).stdout
        names |= {f"host{h}:{n}" for n in out.split() if n.startswith("chorus-")}
    return names


def strays(netns, keepers):
    """Processes left in the hosts' namespaces besides the keepers."""
    left = []
    for ns in netns:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10).stdout
        left += [f"{ns}:{p}" for p in out.split() if int(p) not in keepers]
    return left


def read_ready(p, deadline):
    """The rank's first line, or '' if none came before the deadline."""
    left = deadline - time.time()
    if left <= 0 or not select.select([p.stdout], [], [], left)[0]:
        return ""
    return p.stdout.readline()


def trial(a, rng, extra_env):
    n, hosts = a.ranks, a.hosts
    host_of = [r * len(hosts) // n for r in range(n)] if hosts else [0] * n
    keepers = hosts or ([a.shm_keeper] if a.shm_keeper else [])
    port, secret = free_port(), secrets.token_hex(32)
    before = shm_names(keepers)
    procs = []
    for r in range(n):
        env = dict(os.environ, CHORUS_RANK=str(r), CHORUS_WORLD_SIZE=str(n), CHORUS_MASTER_ADDR=a.master_addr,
                   CHORUS_MASTER_PORT=str(port), CHORUS_SECRET=secret, CHORUS_TIMEOUT_MS="30000", **extra_env)
        if hosts:
            env["CHORUS_LOCAL_RANK"] = str(host_of[:r].count(host_of[r]))
            prefix = ["nsenter", "--target", str(hosts[host_of[r]]), "--mount", "--net", "--"]
        elif a.shm_keeper:
            prefix = ["nsenter", "--target", str(a.shm_keeper), "--mount", "--"]
        else:
            prefix = []
        args = ["--shrink", str(a.shrink)] if a.shrink is not None else []
        procs.append(subprocess.Popen(prefix + [a.prog] + args, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    cut = None
    try:
        deadline = time.time() + 60
        for r, p in enumerate(procs):  # every rank is past init
            line = read_ready(p, deadline)
            if '"ready"' not in line:
                p.kill()
                return {"ok": False, "why": f"rank {r} did not start: {line!r} {p.communicate()[1][-500:]}"}
        # With --shrink, never rank 0 or its host: rank 0's process holds the store.
        if a.cut_cmd:
            cut = rng.randrange(1 if a.shrink is not None else 0, len(hosts))
            victims = [r for r in range(n) if host_of[r] == cut]
        else:
            victims = [rng.randrange(1 if a.shrink is not None else 0, n)]
        time.sleep(rng.uniform(0.05, 0.6))  # a random moment in the stream (not synchronisation)
        t_kill = time.time()
        if cut is not None:
            subprocess.run(a.cut_cmd.format(host=cut, state="down"), shell=True, check=True, timeout=10)
            t_kill = time.time()  # the link went down at the end of the command, not at its start
        for v in victims:
            procs[v].send_signal(signal.SIGKILL)
        results, problems = {}, []
        for r, p in enumerate(procs):
            if r in victims:
                p.communicate(timeout=10)
                continue
            try:
                out, err = p.communicate(timeout=max(a.bound_s * 4, 30))
            except subprocess.TimeoutExpired:
                problems.append(f"rank {r} hung")
                continue
            lines = [l for l in out.splitlines() if l.startswith("{") and '"code"' in l]
            if not lines:
                problems.append(f"rank {r} printed no result (exit {p.returncode}): {err[-300:]}")
                continue
            res = json.loads(lines[-1])
            results[r] = res
            detect = res["t_error_ns"] / 1e9 - t_kill
            res["detect_s"] = round(detect, 3)
            if res["code"] != 5:
                problems.append(f"rank {r}: exit {p.returncode}, code {res['code']}: {res['message']}")
            elif not any(f"rank {v}" in res["message"] for v in victims):
                problems.append(f"rank {r}: the error does not name rank {victims}: {res['message']}")
            elif detect > a.bound_s:
                problems.append(f"rank {r}: detected after {detect:.2f} s (bound {a.bound_s} s)")
            elif p.returncode != 0:
                problems.append(f"rank {r}: exit {p.returncode}: {res.get('shrink', res['message'])}")
        if a.shrink is not None:
            survivors = [r for r in range(n) if r not in victims]
            for r, res in results.items():
                s = res.get("shrink", {})
                if s.get("members") != survivors or s.get("rank") != survivors.index(r) or s.get("steps_ok") != a.shrink:
                    problems.append(f"rank {r}: shrink: expected members {survivors}, rank {survivors.index(r)}, "
                                    f"{a.shrink} steps; got {s}")
        for p in procs:
            if p.poll() is None:
                problems.append(f"process {p.pid} still running")
        if cut is not None:
            subprocess.run(a.cut_cmd.format(host=cut, state="up"), shell=True, check=True, timeout=10)
            cut = None
        left = shm_names(keepers) - before
        if left:
            problems.append(f"left in /dev/shm: {sorted(left)}")
        left = strays(a.netns, keepers)
        if left:
            problems.append(f"processes left in the host namespaces: {left}")
        return {"ok": not problems, "victims": victims, "problems": problems,
                "detect_s": sorted(v["detect_s"] for v in results.values())}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if cut is not None:
            subprocess.run(a.cut_cmd.format(host=cut, state="up"), shell=True, timeout=10)


def start_shm_keeper():
    """As root, a process owning a mount namespace with a private tmpfs on
    /dev/shm, which the ranks of every trial join: what is left there after a
    trial is exactly what the trial left (the machine's own /dev/shm also holds
    the segments of whatever else runs, e.g. tests ctest runs in parallel).
    Returns its Popen, or None (not root, or no unshare/nsenter: the machine's
    /dev/shm is compared before and after instead)."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        return None
    k = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          "mount -t tmpfs -o size=256m,mode=1777 chorus-fault-shm /dev/shm && echo ready && exec sleep 3600"],
                         stdout=subprocess.PIPE, text=True)
    if "ready" not in read_ready(k, time.time() + 10):
        k.kill()
        k.wait()
        return None
    return k


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prog")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--bound-s", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--tcp", action="store_true", help="CHORUS_TRANSPORT=tcp (the TCP detection path)")
    ap.add_argument("--transport", default=None, help="CHORUS_TRANSPORT=NAME (e.g. ucx: its peer error handling)")
    ap.add_argument("--shrink", type=int, default=None, metavar="STEPS")
    ap.add_argument("--hosts", type=lambda s: [int(x) for x in s.split(",")], default=[])
    ap.add_argument("--netns", type=lambda s: s.split(","), default=[])
    ap.add_argument("--master-addr", default="127.0.0.1")
    ap.add_argument("--cut-cmd", default=None)
    ap.add_argument("--heartbeat-ms", type=int, default=None)
    a = ap.parse_args()
    a.prog = os.path.abspath(a.prog)
    if a.cut_cmd and len(a.hosts) < 2:
        ap.error("--cut-cmd needs --hosts with 2 or more hosts")
    extra = {}
    if a.tcp or a.transport:
        extra["CHORUS_TRANSPORT"] = a.transport or "tcp"
    if a.heartbeat_ms is not None:
        extra["CHORUS_HEARTBEAT_MS"] = str(a.heartbeat_ms)
    if a.shrink is not None:
        # Survivors notice the failure at different times (up to the detection
        # bound apart): the agreement waits for them that long.
        extra["CHORUS_SHRINK_WINDOW_MS"] = str(int(a.bound_s * 1000) + 2000)
    rng = random.Random(a.seed)
    passed = failed = 0
    times = []
    keeper = None if a.hosts else start_shm_keeper()
    a.shm_keeper = keeper.pid if keeper else None
    if not a.hosts:
        print("/dev/shm: " + ("a private tmpfs for the trials' ranks" if keeper else
                              "the machine's (not root): segments of concurrent jobs may be counted"))
    try:
        for t in range(a.trials):
            res = trial(a, rng, extra)
            res["trial"] = t
            print(json.dumps(res), flush=True)
            if res["ok"]:
                passed += 1
                times += res["detect_s"]
            else:
                failed += 1
    finally:
        if keeper:
            keeper.kill()
            keeper.wait()
    if times:
        print(f"detection time over {len(times)} survivors: median {statistics.median(times):.3f} s, "
              f"max {max(times):.3f} s")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
