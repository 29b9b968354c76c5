"""Runs a function on N ranks as real processes, with every wait bounded.

Each test script calls ``run(fn, world, timeout_s, *args)``; ``fn(rank, world,
*args)`` runs in a forked child and fails by raising.  The parent collects one
report per rank, kills every child that outlives the timeout, and raises with
the children's tracebacks, so a hang is a failure, never a stuck CI job.
"""

from __future__ import annotations

import atexit
import faulthandler
import multiprocessing as mp
import os
import queue
import shutil
import sys
import tempfile
import time
import traceback


def _child(fn, rank, world, args, reports, dump_after_s):
    # A hung rank prints where each of its threads is before it is killed.
    faulthandler.dump_traceback_later(dump_after_s, exit=False)
    try:
        fn(rank, world, *args)
        reports.put((rank, None))
    except BaseException:  # report everything, including SystemExit
        reports.put((rank, traceback.format_exc()))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def run(fn, world, timeout_s, *args, expect_exit=None):
    """Runs fn on `world` forked ranks; raises AssertionError on any failure.

    expect_exit: ranks that are expected to die without reporting (the
    killed-rank test); they are not waited for beyond the others.
    """
    expect_exit = set(expect_exit or ())
    ctx = mp.get_context("fork")
    reports = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(fn, r, world, args, reports, max(1.0, timeout_s - 10)),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    results = {}
    wanted = set(range(world)) - expect_exit
    try:
        while wanted - results.keys():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, err = reports.get(timeout=min(left, 1.0))
                results[rank] = err
            except queue.Empty:
                # A rank that died without reporting will never report.
                dead = [r for r in wanted - results.keys() if not procs[r].is_alive() and procs[r].exitcode != 0]
                for r in dead:
                    try:  # its report may still be in flight
                        rank, err = reports.get(timeout=0.5)
                        results[rank] = err
                    except queue.Empty:
                        results[r] = "rank {} died with exit code {}".format(r, procs[r].exitcode)
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(10.0, deadline - time.monotonic())))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    missing = sorted(wanted - results.keys())
    failures = {r: e for r, e in results.items() if e}
    if missing or failures:
        msg = ["{} rank(s) timed out after {} s: {}".format(len(missing), timeout_s, missing)] if missing else []
        msg += ["rank {} failed:\n{}".format(r, e) for r, e in sorted(failures.items())]
        raise AssertionError("\n".join(msg))


def comm(rank, world, ids):
    """A chorus.Communicator of `world` ranks: rank 0 makes the UniqueId and
    hands it to the others through the queue `ids`."""
    import chorus

    if rank == 0:
        uid = chorus.UniqueId()
        for _ in range(world - 1):
            ids.put(bytes(uid))
    else:
        uid = chorus.UniqueId.from_bytes(ids.get(timeout=60))
    return chorus.Communicator.from_unique_id(world, uid, rank)


def store_path(tag):
    """A fresh path for a torch FileStore: rendezvous without any port."""
    d = tempfile.mkdtemp(prefix="chorus-py-{}-".format(tag))
    parent = os.getpid()
    # Removed when the test process (not a forked rank) exits.
    atexit.register(lambda: os.getpid() == parent and shutil.rmtree(d, ignore_errors=True))
    return os.path.join(d, "store")


class Checks:
    """Named checks run in sequence; main() prints a JSON-ish summary and
    exits non-zero when any failed."""

    def __init__(self):
        self.passed = []
        self.failed = []

    def run(self, name, fn, *args, **kwargs):
        t0 = time.monotonic()
        try:
            fn(*args, **kwargs)
            self.passed.append(name)
            print("PASS {} ({:.1f} s)".format(name, time.monotonic() - t0), flush=True)
        except BaseException as e:  # noqa: BLE001 — report and continue
            self.failed.append(name)
            print("FAIL {} ({:.1f} s)\n{}".format(name, time.monotonic() - t0, e), flush=True)

    def finish(self):
        print('{{"passed": {}, "failed": {}, "failed_names": {}}}'.format(
            len(self.passed), len(self.failed), self.failed), flush=True)
        sys.exit(1 if self.failed or not self.passed else 0)
