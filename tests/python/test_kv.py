"""chorus.KvAgent, the KV-cache transfer engine from Python (docs/kv.md): a
"prefill" and a "decode" process (two agents, no communicator) meet through a
store, register NumPy buffers, and the prefill side writes paged blocks into
the decode side's cache with a notification after the batch; the decode side
checks every byte against the source pattern (computed independently), reads
blocks back, and a descriptor past the end of the peer's region is refused
before anything moves, the region's bytes untouched."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

BLOCK = 4096
BLOCKS = 16


def pattern(np, block):
    """Block `block`'s bytes as the prefill side fills them."""
    return ((np.arange(BLOCK, dtype=np.uint32) * 7 + block * 131) % 251).astype(np.uint8)


def _agents(rank, world, ids):
    import numpy as np

    import chorus

    if rank == 0:
        uid = chorus.UniqueId()
        ids.put(bytes(uid))
        agent = chorus.KvAgent("prefill", uid, serve_store=True)
    else:
        agent = chorus.KvAgent("decode", chorus.UniqueId.from_bytes(ids.get(timeout=60)))
    with agent:
        if rank == 0:
            src = np.concatenate([pattern(np, b) for b in range(BLOCKS)])
            region = agent.register(src, "rw")
            agent.publish()
            agent.connect("decode")
            # Blocks 0..15 into the decode cache in reverse block order
            # (decode block b <- prefill block BLOCKS-1-b), one notification.
            descs = [(region, (BLOCKS - 1 - b) * BLOCK, 0, b * BLOCK, BLOCK) for b in range(BLOCKS)]
            xfer = agent.write("decode", descs, notify=42)
            assert agent.wait(xfer) == "done"
            agent.release(xfer)
            # Past the end of the peer's region: refused before anything moves.
            try:
                agent.write("decode", [(region, 0, 0, BLOCKS * BLOCK - 100, 200)])
                bad = None
            except chorus.Error as e:
                bad = e
            if bad is None:
                raise AssertionError("a descriptor past the peer's region was accepted")
            # Read the decode side's sentinel region back (it holds 0xab).
            back = np.zeros(64, dtype=np.uint8)
            r2 = agent.register(back, "rw")
            xfer = agent.read("decode", [(r2, 0, 1, 0, 64)], notify=7)
            assert agent.wait(xfer) == "done"
            assert (back == 0xAB).all(), back
            # Stay until the decode side has checked (its notification).
            for _ in range(6000):
                got = agent.notification()
                if got is not None:
                    assert got == ("decode", 99), got
                    break
                agent.progress()
                import time
                time.sleep(0.005)
            else:
                raise AssertionError("no notification from decode")
        else:
            cache = np.zeros(BLOCKS * BLOCK, dtype=np.uint8)
            sentinel = np.full(64, 0xAB, dtype=np.uint8)
            assert agent.register(cache, "w") == 0
            assert agent.register(sentinel, "r") == 1
            agent.publish()
            agent.connect("prefill")
            import time
            got = None
            for _ in range(6000):
                got = agent.notification()
                if got is not None:
                    break
                agent.progress()
                time.sleep(0.005)
            assert got == ("prefill", 42), got
            for b in range(BLOCKS):
                want = pattern(np, BLOCKS - 1 - b)
                have = cache[b * BLOCK:(b + 1) * BLOCK]
                assert (have == want).all(), f"block {b}: first differing byte {int((have != want).argmax())}"
            # The refused write changed nothing: the last block is still whole.
            assert (cache[-BLOCK:] == pattern(np, 0)).all()
            # Wait for the prefill side's read (its notification 7), then tell it we are done.
            for _ in range(6000):
                n = agent.notification()
                if n is not None:
                    assert n == ("prefill", 7), n
                    break
                agent.progress()
                time.sleep(0.005)
            else:
                raise AssertionError("no notification after the read")
            xfer = agent.write("prefill", [], notify=99)
            assert agent.wait(xfer) == "done"


def _closed(rank, world):
    import chorus

    uid = chorus.UniqueId()
    agent = chorus.KvAgent("solo", uid, serve_store=True)
    agent.close()
    try:
        agent.publish()
        raise AssertionError("a closed agent published")
    except ValueError as e:
        assert "closed" in str(e), str(e)
    import numpy as np
    a = chorus.KvAgent("solo2", chorus.UniqueId(), serve_store=True)
    try:
        a.register(np.zeros(8, dtype=np.uint8), "x")
        raise AssertionError("access 'x' accepted")
    except ValueError as e:
        assert "access" in str(e), str(e)
    a.close()


def main():
    ctx = mp.get_context("fork")
    checks = harness.Checks()
    checks.run("prefill_writes_decode_reads_2_agents", harness.run, _agents, 2, 120, ctx.Queue())
    checks.run("closed_agent_and_bad_access", harness.run, _closed, 1, 60)
    checks.finish()


if __name__ == "__main__":
    main()
