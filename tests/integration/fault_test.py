#!/usr/bin/env python3
"""Fault injection: SIGKILL a random rank at a random moment of a stream of mixed
collectives; every survivor must return chorusRemoteError naming the killed rank
within the bound, exit cleanly, and leave nothing in /dev/shm.

Usage: fault_test.py FAULT_MAIN [--trials 10] [--ranks 4] [--bound-s 5]
Prints one JSON line per trial and a summary line 'N passed, M failed'.
"""
import argparse, json, os, random, secrets, signal, socket, subprocess, sys, time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_names():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("chorus-")}
    except FileNotFoundError:
        return set()


def trial(prog, nranks, bound_s, rng, extra_env):
    port, secret = free_port(), secrets.token_hex(32)
    before = shm_names()
    procs = []
    for r in range(nranks):
        env = dict(os.environ, CHORUS_RANK=str(r), CHORUS_WORLD_SIZE=str(nranks), CHORUS_MASTER_ADDR="127.0.0.1",
                   CHORUS_MASTER_PORT=str(port), CHORUS_SECRET=secret, CHORUS_TIMEOUT_MS="30000", **extra_env)
        procs.append(subprocess.Popen([prog], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        for p in procs:  # every rank is past init
            line = p.stdout.readline()
            if '"ready"' not in line:
                return {"ok": False, "why": "a rank did not start: " + line + p.stderr.read()}
        victim = rng.randrange(nranks)
        time.sleep(rng.uniform(0.05, 0.6))  # a random moment in the stream (not synchronisation)
        t_kill = time.time()
        procs[victim].send_signal(signal.SIGKILL)
        results, problems = {}, []
        for r, p in enumerate(procs):
            if r == victim:
                p.wait(timeout=10)
                continue
            try:
                out, err = p.communicate(timeout=max(bound_s * 4, 20))
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
            if p.returncode != 0 or res["code"] != 5:
                problems.append(f"rank {r}: exit {p.returncode}, code {res['code']}: {res['message']}")
            elif f"rank {victim}" not in res["message"]:
                problems.append(f"rank {r}: the error does not name rank {victim}: {res['message']}")
            elif detect > bound_s:
                problems.append(f"rank {r}: detected after {detect:.2f} s (bound {bound_s} s)")
        left = shm_names() - before
        if left:
            problems.append(f"left in /dev/shm: {sorted(left)}")
        return {"ok": not problems, "victim": victim, "problems": problems,
                "detect_s": sorted(v["detect_s"] for v in results.values())}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prog")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--bound-s", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--tcp", action="store_true", help="CHORUS_TRANSPORT=tcp (the TCP detection path)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    passed = failed = 0
    worst = 0.0
    for t in range(a.trials):
        res = trial(a.prog, a.ranks, a.bound_s, rng, {"CHORUS_TRANSPORT": "tcp"} if a.tcp else {})
        res["trial"] = t
        print(json.dumps(res), flush=True)
        if res["ok"]:
            passed += 1
            worst = max([worst] + res["detect_s"])
        else:
            failed += 1
    print(f"worst detection time: {worst:.3f} s")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
