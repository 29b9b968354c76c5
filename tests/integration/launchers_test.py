#!/usr/bin/env python3
"""chorusCommInitFromEnv and chorus-run under the launchers users run.

  launchers_test.py MODE ...
    torchrun-emulated MAIN NP     the environment torchrun gives its workers, with a socket already listening on
                                  MASTER_PORT (torchrun's agent store); then the same with MASTER_PORT + 1 taken
    torchrun MAIN NP              the real torchrun (python3 -m torch.distributed.run --no_python), on loopback
    chorus-run-torch RUN MAIN NP  chorus-run ranks that init torch.distributed with env:// (gloo) and, while
                                  that group is alive, run a chorus job from the same environment
    mpirun MAIN NP                Open MPI's mpirun with no CHORUS_MASTER_ADDR/PORT
    flood MAIN NP                 rank 0 limited to 256 descriptors, its store port flooded with 300 connections
                                  held open: every rank still succeeds, and the refusals are summarised
    secrets MAIN NP               a secret without the user: one-host torchrun ranks share a per-job file; ranks
                                  on several hosts warn (and refuse with CHORUS_REQUIRE_SECRET=1); a stranger's
                                  store bound first to the port is refused

Each rank of MAIN (env_job_main) prints {"rank", "world", "ok"}; a mode passes
when every rank reported ok and the launcher exited 0.  Exit 77 (ctest: skipped)
when the launcher itself (torch, mpirun) is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time

SKIP = 77
JOB_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
            "ROLE_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


def clean_env(**extra):
    """The caller's environment without any job variable (so only the launcher's count)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CHORUS_", "OMPI_", "PMIX_", "SLURM_", "TORCHELASTIC_")) and k not in JOB_VARS}
    env["CHORUS_TIMEOUT_MS"] = "60000"
    env.update(extra)
    return env


def fail(msg):
    print("launchers_test: FAILED: " + msg, file=sys.stderr)
    sys.exit(1)


def check_reports(out, np_, what):
    # A line may carry a launcher's prefix ("[default0]:{...}").
    reports = [json.loads(line[line.index("{"):]) for line in out.splitlines() if "{" in line]
    ranks = sorted(r["rank"] for r in reports)
    if ranks != list(range(np_)) or not all(r["ok"] and r["world"] == np_ for r in reports):
        fail(f"{what}: expected {np_} ok reports, got {reports}\n{out}")
    print(f"launchers_test: {what}: {np_} ranks ok")


def listener():
    """A socket listening on a free loopback port whose next port is free too."""
    for _ in range(50):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        probe = socket.socket()
        try:
            probe.bind(("127.0.0.1", port + 1))
        except OSError:
            s.close()
            continue
        finally:
            probe.close()
        s.listen(16)
        return s, port
    fail("no free pair of ports")


def start_ranks(main, np_, port, extra=None):
    procs = []
    for r in range(np_):
        env = clean_env(RANK=str(r), WORLD_SIZE=str(np_), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(np_),
                        GROUP_RANK="0", ROLE_RANK=str(r), ROLE_WORLD_SIZE=str(np_), ROLE_NAME="default",
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RUN_ID="none",
                        TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0",
                        TORCHELASTIC_USE_AGENT_STORE="True", **(extra or {}))
        procs.append(subprocess.Popen([main], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        results.append((p.returncode, out, err))
    return results


def torchrun_emulated(main, np_):
    agent, port = listener()  # torchrun's agent store, listening before any worker starts
    with agent:
        results = start_ranks(main, np_, port)
        bad = [(i, rc, err) for i, (rc, _, err) in enumerate(results) if rc != 0]
        if bad:
            fail(f"torchrun environment with MASTER_PORT {port} held: ranks failed: {bad}")
        check_reports("".join(out for _, out, _ in results), np_, "torchrun-emulated")

        # MASTER_PORT + 1 taken as well: rank 0 must say which port, why, and what to set.
        taken = socket.socket()
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # rank 0's store left it in TIME_WAIT
        taken.bind(("127.0.0.1", port + 1))
        taken.listen(1)
        with taken:
            results = start_ranks(main, np_, port, {"CHORUS_TIMEOUT_MS": "3000"})
        rc0, _, err0 = results[0]
        if rc0 == 0:
            fail("rank 0 succeeded although MASTER_PORT + 1 was taken")
        for needle in (str(port + 1), "MASTER_PORT + 1", "CHORUS_MASTER_PORT"):
            if needle not in err0:
                fail(f"rank 0's error does not name {needle!r}: {err0}")
        print("launchers_test: torchrun-emulated: a taken MASTER_PORT + 1 is reported: " + err0.strip().splitlines()[-1])


def fake_store(port):
    """A stranger's store bound first to the job's store port: it answers the
    job-secret handshake with the all-zero key (what every unauthenticated
    chorus job used) and then holds the connection.  Runs on a thread."""
    import hashlib
    import hmac
    import threading
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(16)
    srv.settimeout(0.5)
    held, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            try:
                c.settimeout(5)
                nonce_s = os.urandom(32)
                c.sendall(b"CHRS" + bytes([1]) + nonce_s)
                head = c.recv(34, socket.MSG_WAITALL)
                hello_len = int.from_bytes(head[32:34], "little")
                c.recv(hello_len + 32, socket.MSG_WAITALL)
                c.sendall(hmac.new(bytes(32), b"server" + head[:32] + nonce_s, hashlib.sha256).digest())
                held.append(c)
            except OSError:
                c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()

    def close():
        stop.set()
        t.join()
        for c in held:
            c.close()
        srv.close()
    return close


def secrets(main, np_):
    """Secrets by default: one-host ranks under torchrun's environment share a
    per-job file (removed when init is done) and warn about nothing; ranks that
    may be on several hosts each print one line naming the risk, and refuse to
    run with CHORUS_REQUIRE_SECRET=1; a stranger's store bound first to the port
    is refused by every rank, naming it."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o700)
        agent, port = listener()
        with agent:
            results = start_ranks(main, np_, port, {"CHORUS_SECRET_DIR": d})
        bad = [(i, rc, err) for i, (rc, _, err) in enumerate(results) if rc != 0]
        if bad:
            fail(f"one-host torchrun environment: ranks failed: {bad}")
        check_reports("".join(out for _, out, _ in results), np_, "secrets: one host")
        warned = [i for i, (_, _, err) in enumerate(results) if "has no secret" in err]
        if warned:
            fail(f"one-host ranks {warned} warned of no secret: {results[warned[0]][2]}")
        if os.listdir(d):
            fail(f"the per-job secret file was not removed after init: {os.listdir(d)}")
        print("launchers_test: secrets: one-host torchrun ranks shared a per-job secret; its file is gone after init")

        # A stranger's store on the port, first: the ranks (not rank 0, whose
        # bind would fail) must refuse it.
        agent, port = listener()
        with agent:
            close = fake_store(port + 1)
            try:
                procs = []
                for r in range(1, np_):
                    env = clean_env(RANK=str(r), WORLD_SIZE=str(np_), LOCAL_WORLD_SIZE=str(np_),
                                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RUN_ID="none",
                                    CHORUS_SECRET_DIR=d, CHORUS_TIMEOUT_MS="5000")
                    procs.append(subprocess.Popen([main], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                  text=True))
                outs = [p.communicate(timeout=60) + (p.returncode,) for p in procs]
            finally:
                close()
        for r, (_, err, rc) in enumerate(outs, start=1):
            if rc == 0 or "not this job's store" not in err:
                fail(f"rank {r} did not refuse a stranger's store on port {port + 1} (exit {rc}): {err}")
        print("launchers_test: secrets: a stranger's store bound first is refused: " +
              outs[0][1].strip().splitlines()[-1][:200])

    # Ranks that may be on several hosts: a non-loopback master.  As root the
    # ranks run in a network namespace of their own with one address on a
    # veth pair of its own (always there, and nothing outside can reach it);
    # otherwise on this machine's first global IPv4 address.  With neither
    # the case cannot run: the test fails, or reports itself skipped (77)
    # under CHORUS_SKIP_CLUSTER=1, never passes without it.
    ns, prefix, ip = None, [], None
    if os.geteuid() == 0:
        ns = f"chorus-{os.getpid()}-sec"
        ip = f"10.233.{os.getpid() % 250 + 1}.1"
        setup = [["ip", "netns", "add", ns], ["ip", "-n", ns, "link", "set", "lo", "up"],
                 ["ip", "-n", ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
                 ["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "v0"], ["ip", "-n", ns, "link", "set", "v0", "up"],
                 ["ip", "-n", ns, "link", "set", "v1", "up"]]
        for cmd in setup:
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
                fail(f"secrets: several hosts: '{' '.join(cmd)}' failed: {r.stderr.strip()}")
        prefix = ["ip", "netns", "exec", ns]
        mport = 20000 + os.getpid() % 20000
    else:
        addrs = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True,
                               text=True).stdout.split()
        ip = next((a.split("/")[0] for i, a in enumerate(addrs) if addrs[i - 1] == "inet"), None)
        if ip is None:
            if os.environ.get("CHORUS_SKIP_CLUSTER") == "1":
                print("launchers_test: secrets: SKIPPED: not root and no global IPv4 address for the several-hosts case")
                sys.exit(SKIP)
            fail("secrets: the several-hosts case needs root (a network namespace) or a global IPv4 address")
        sock = socket.socket()
        sock.bind((ip, 0))
        mport = sock.getsockname()[1]
        sock.close()
    try:
        several_hosts(main, np_, prefix, ip, mport)
    finally:
        if ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def several_hosts(main, np_, prefix, ip, mport):
    for require in ("0", "1"):
        procs = []
        for r in range(np_):
            env = clean_env(RANK=str(r), WORLD_SIZE=str(np_), LOCAL_WORLD_SIZE="1", MASTER_ADDR=ip,
                            CHORUS_MASTER_PORT=str(mport), CHORUS_REQUIRE_SECRET=require)
            procs.append(subprocess.Popen(prefix + [main], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
        for r, (out, err, rc) in enumerate(outs):
            if require == "0" and (rc != 0 or err.count("has no secret") != 1 or "CHORUS_SECRET" not in err):
                fail(f"several hosts: rank {r} (exit {rc}) did not run with exactly one warning line: {err}")
            if require == "1" and (rc == 0 or "CHORUS_REQUIRE_SECRET=1" not in err):
                fail(f"several hosts with CHORUS_REQUIRE_SECRET=1: rank {r} (exit {rc}) did not refuse: {err}")
    print(f"launchers_test: secrets: ranks that may be on several hosts ({ip}) each warn once, and refuse with "
          "CHORUS_REQUIRE_SECRET=1")


def flood(main, np_):
    """A descriptor-limited rank 0 (RLIMIT_NOFILE 256) whose store port is
    flooded with up to 300 connections held open and refilled as they close,
    from the moment it listens, while the other ranks start and the job runs: every rank still succeeds, and
    rank 0's log says so in a few summary lines, not one line per stranger."""
    import resource
    import threading
    agent, port = listener()
    stop = threading.Event()
    opened = [0]

    def listening(p):
        """A LISTEN socket on 127.0.0.1:p (or any address), from /proc/net/tcp."""
        try:
            with open("/proc/net/tcp") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            return False
        for row in rows:
            fields = row.split()
            if len(fields) > 3 and fields[3] == "0A" and int(fields[1].split(":")[1], 16) == p:
                return True
        return False

    def flooder():
        # Only once rank 0's store listens: connecting to a port nobody holds
        # yet, hundreds of thousands of times, ends in a TCP self-connect (a
        # client's ephemeral port equal to the target's) that takes the port
        # before rank 0 can bind it.
        t_end = time.monotonic() + 30
        while not listening(port + 1) and not stop.is_set() and time.monotonic() < t_end:
            stop.wait(0.005)
        held = []
        while not stop.is_set():
            held = [c for c in held if c.fileno() >= 0]
            while len(held) < 300 and not stop.is_set():
                c = socket.socket()
                c.setblocking(False)
                try:
                    c.connect_ex(("127.0.0.1", port + 1))
                except OSError:
                    c.close()
                    break
                held.append(c)
                opened[0] += 1
            # Drop the ones the server closed (readable with EOF), keep the rest silent.
            alive = []
            for c in held:
                try:
                    if c.recv(64) == b"":
                        c.close()
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    c.close()
                    continue
                alive.append(c)
            held = alive
            stop.wait(0.02)
        for c in held:
            c.close()

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    with agent:
        t = threading.Thread(target=flooder, daemon=True)
        t.start()
        procs = []
        for r in range(np_):
            env = clean_env(RANK=str(r), WORLD_SIZE=str(np_), LOCAL_WORLD_SIZE=str(np_), MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=str(port), TORCHELASTIC_RUN_ID="none", CHORUS_TIMEOUT_MS="30000")
            procs.append(subprocess.Popen([main], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          preexec_fn=limit if r == 0 else None))
            if r == 0:  # the other ranks meet rank 0's store under a flood already in full swing
                t_end = time.monotonic() + 5
                while opened[0] < 300 and time.monotonic() < t_end:
                    time.sleep(0.01)
        results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
        stop.set()
        t.join()
    bad = [(r, rc, err[-2000:]) for r, (_, err, rc) in enumerate(results) if rc != 0]
    if bad:
        fail(f"flood: ranks failed with rank 0 limited to 256 descriptors and {opened[0]} stranger connections: {bad}")
    check_reports("".join(out for out, _, _ in results), np_, "flood")
    refusals = [l for l in results[0][1].splitlines() if "refused" in l]
    if opened[0] < 300:
        fail(f"flood: the flooder opened only {opened[0]} connections")
    if len(refusals) > 5:
        fail(f"flood: rank 0 logged {len(refusals)} refusal lines (not rate-limited): {refusals[:3]}")
    print(f"launchers_test: flood: {np_} ranks ok with rank 0 at 256 descriptors and {opened[0]} stranger "
          f"connections; rank 0 logged {len(refusals)} refusal line(s)")


def have_torch():
    return subprocess.run([sys.executable, "-c", "import torch.distributed.run"], capture_output=True).returncode == 0


def torchrun(main, np_):
    if not have_torch():
        print("launchers_test: torch is not installed: skipped")
        sys.exit(SKIP)
    agent, port = listener()
    agent.close()  # torchrun's agent binds it
    # --redirects 1 --tee 1 (stdout to a log file and the console, each line
    # prefixed "[default<rank>]:"): Debian's torch 1.13 on Python 3.11 cannot
    # parse the default "0" (Std.from_str finds no Std.NONE among the Flag's
    # members, which 3.11 no longer iterates) and fails before starting workers.
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={np_}", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={port}", "--redirects", "1", "--tee", "1", "--no_python", main]
    proc = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=240)
    if proc.returncode != 0:
        fail(f"torchrun exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    check_reports(proc.stdout, np_, "torchrun")


RANK_SCRIPT = textwrap.dedent("""
    import json, os, subprocess, sys
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method="env://")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    n = dist.get_world_size()
    torch_ok = (t.item() == n * (n + 1) / 2 and int(os.environ["LOCAL_RANK"]) == dist.get_rank()
                and int(os.environ["LOCAL_WORLD_SIZE"]) == n)
    # While torch's group (rank 0's TCPStore on MASTER_PORT) is alive, a chorus
    # job from the same environment (its store on CHORUS_MASTER_PORT).
    chorus = subprocess.run([sys.argv[1]], capture_output=True, text=True)
    sys.stderr.write(chorus.stderr)
    rep = json.loads(chorus.stdout) if chorus.returncode == 0 else {"ok": False}
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"rank": int(os.environ["RANK"]), "world": n,
                      "ok": bool(torch_ok and rep["ok"])}))
""")


def chorus_run_torch(run, main, np_):
    if not have_torch():
        print("launchers_test: torch is not installed: skipped")
        sys.exit(SKIP)
    cmd = [run, "-n", str(np_), "--timeout", "180", "--no-prefix", "--", sys.executable, "-c", RANK_SCRIPT, main]
    proc = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=240)
    if proc.returncode != 0:
        fail(f"chorus-run exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    check_reports(proc.stdout, np_, "chorus-run + torch env://")


def mpirun(main, np_):
    exe = shutil.which("mpirun")
    if exe is None or subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.find("Open MPI") < 0:
        print("launchers_test: Open MPI's mpirun is not installed: skipped")
        sys.exit(SKIP)
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o700)
        # The job secret comes over mpirun's own PMIx exchange (it serves
        # ranks on every host): no per-job file, no warning, and
        # CHORUS_REQUIRE_SECRET=1 is satisfied.
        env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", CHORUS_DEBUG="INFO",
                        CHORUS_SECRET_DIR=d, CHORUS_REQUIRE_SECRET="1")
        cmd = [exe, "--oversubscribe", "-n", str(np_), main]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        if proc.returncode != 0:
            fail(f"mpirun exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        check_reports(proc.stdout, np_, "mpirun")
        out = proc.stdout + proc.stderr
        pmix = [l for l in out.splitlines() if "job secret from the launcher's PMIx exchange" in l]
        if len(pmix) != np_:
            fail(f"mpirun: {len(pmix)} of {np_} ranks took the job secret from PMIx:\n{out}")
        if "has no secret" in out or os.listdir(d):
            fail(f"mpirun: a warning or a per-job file ({os.listdir(d)}) although PMIx served the secret:\n{out}")
        print(f"launchers_test: mpirun: every rank took the job secret from mpirun's PMIx exchange: {pmix[0][-60:]}")


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "torchrun-emulated":
        torchrun_emulated(args[0], int(args[1]))
    elif mode == "torchrun":
        torchrun(args[0], int(args[1]))
    elif mode == "chorus-run-torch":
        chorus_run_torch(args[0], args[1], int(args[2]))
    elif mode == "flood":
        flood(args[0], int(args[1]))
    elif mode == "secrets":
        secrets(args[0], int(args[1]))
    elif mode == "mpirun":
        mpirun(args[0], int(args[1]))
    else:
        fail(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
