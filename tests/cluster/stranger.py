#!/usr/bin/env python3
"""A stranger on the job's network: connects to every address given and holds
the connections the way an attacker without the job's secret would.

    stranger.py --hold SECONDS [--silent N] [--slow N] [--garbage N]
                [--flood N] [--ready FILE] [--stop FILE] HOST:PORT...

Per address: N silent connections (connect, then nothing), N slow ones (one
byte every 0.3 s), N that send 200 bytes of garbage, and --flood N more silent
ones kept at N, reopened as the server closes them.  Everything is bounded by
--hold (or the --stop file appearing).  --ready is written once the first
round of connections is open.  Prints one JSON line: how many connections were
opened, how many the listeners closed, and how many got the "busy" notice (32
bytes of 0xff where the server's proof would go).
"""
import argparse
import json
import os
import socket
import sys
import time

BUSY = b"\xff" * 32


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hold", type=float, required=True)
    ap.add_argument("--silent", type=int, default=0)
    ap.add_argument("--slow", type=int, default=0)
    ap.add_argument("--garbage", type=int, default=0)
    ap.add_argument("--flood", type=int, default=0)
    ap.add_argument("--ready")
    ap.add_argument("--stop")
    ap.add_argument("targets", nargs="+")
    a = ap.parse_args()
    targets = []
    for t in a.targets:
        host, port = t.rsplit(":", 1)
        targets.append((host, int(port)))

    stats = {"opened": 0, "connect_failed": 0, "closed_by_server": 0, "busy": 0, "targets": len(targets)}
    conns = []  # [sock, kind, target, received bytes]

    def open_one(target, kind):
        s = socket.socket()
        s.settimeout(2.0)
        try:
            s.connect(target)
        except OSError:
            s.close()
            stats["connect_failed"] += 1
            return
        s.setblocking(False)
        stats["opened"] += 1
        if kind == "garbage":
            try:
                s.send(b"\x5a" * 200)
            except OSError:
                pass
        conns.append([s, kind, target, b""])

    for t in targets:
        for kind, n in (("silent", a.silent), ("slow", a.slow), ("garbage", a.garbage), ("flood", a.flood)):
            for _ in range(n):
                open_one(t, kind)
    if a.ready:
        with open(a.ready, "w") as f:
            f.write("%d\n" % stats["opened"])

    end = time.monotonic() + a.hold
    next_slow = 0.0
    while time.monotonic() < end and not (a.stop and os.path.exists(a.stop)):
        now = time.monotonic()
        alive = []
        for c in conns:
            s, kind, target, got = c
            try:
                data = s.recv(4096)
                if data == b"":
                    raise ConnectionResetError
                c[3] = got + data
                alive.append(c)
            except BlockingIOError:
                alive.append(c)
            except OSError:
                stats["closed_by_server"] += 1
                if BUSY in got:
                    stats["busy"] += 1
                s.close()
                if kind == "flood":
                    conns_reopen.append(target)
                continue
        conns[:] = alive
        while conns_reopen:
            open_one(conns_reopen.pop(), "flood")
        if now >= next_slow:
            for s, kind, _, _ in conns:
                if kind == "slow":
                    try:
                        s.send(b"\x01")
                    except OSError:
                        pass
            next_slow = now + 0.3
        time.sleep(0.02)
    for c in conns:
        c[0].close()
    print(json.dumps(stats))
    sys.stdout.flush()


conns_reopen = []

if __name__ == "__main__":
    main()
