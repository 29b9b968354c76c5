#!/usr/bin/env python3
"""chorus-tune end to end: the profile it writes, the measured corrections of
every algorithm, and their use by the library's tuner.

- `chorus-tune --np 2,3` writes one profile with the α-β-γ figures (shared
  memory and TCP) and, per rank count and transport, a correction for every algorithm of the chosen collectives at
  every calibrated size (16 B x 4^k), each factor finite and positive;
- `--append` keeps the figures and replaces only its own rank count's entries;
- a communicator loading the profile prices a call at a calibrated size as the
  model times the stored factor: chorus-bench's predicted_us with the profile
  over predicted_us with the same profile stripped of its corrections equals
  the factor (same forced algorithm);
- bad options and a corrupt profile are refused with a message.

Usage: tune_test.py CHORUS_TUNE CHORUS_RUN CHORUS_BENCH
"""
import json, math, os, re, subprocess, sys, tempfile

TUNE, RUN, BENCH = sys.argv[1:4]
# The transports this build registers (CMake's CHORUS_TRANSPORTS: shm, tcp, and ucx where built).
BUILT = sorted(t for t in sys.argv[4].split(";") if t) if len(sys.argv) > 4 else ["shm", "tcp"]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(cmd, env=None, timeout=300):
    return subprocess.run(cmd, env=dict(os.environ, **(env or {})), capture_output=True, text=True, timeout=timeout)


def bench_predicted(profile, algo, nbytes):
    p = run([RUN, "-n", "2", BENCH, "allreduce", "-b", str(nbytes), "-e", str(nbytes), "-n", "2", "-w", "0",
             "--algo", algo, "--json", profile + ".rows"], env={"CHORUS_TUNE_FILE": profile})
    check(p.returncode == 0, f"chorus-bench with {os.path.basename(profile)} exits 0: {p.stderr[-400:]}")
    with open(profile + ".rows") as f:
        rows = [json.loads(l) for l in f if l.strip()]
    out = [r for r in rows if not r.get("in_place")]
    return out[0]["predicted_us"] if out else None


with tempfile.TemporaryDirectory() as d:
    prof = os.path.join(d, "profile.json")
    p = run([TUNE, "--np", "2,3", "-o", prof, "--reps", "3", "--collectives", "allreduce,allgather",
             "--max-bytes", "4K", "--correction-reps", "1"])
    check(p.returncode == 0, f"chorus-tune --np 2,3 exits 0: {p.stderr[-800:]}")
    with open(prof) as f:
        j = json.load(f)
    # One entry per registered transport, keyed by its name (the transport registry).
    links = j.get("links", {})
    check(sorted(links) == BUILT, f"the profile has a link per registered transport ({sorted(links)}, built: {BUILT})")
    check(links["shm"]["alpha_us"] >= 0 and links["shm"]["bandwidth_gbps"] > 0, "the profile has shared-memory figures")
    check(links["tcp"]["alpha_us"] >= 0 and links["tcp"]["bandwidth_gbps"] > 0, "the profile has TCP figures")
    check(0 < j["board_call_us"] < 1000 and abs(j["board_call_us"] - 0.2) > 1e-9,
          f"the profile has the board's measured call cost, not the built-in 0.2 us ({j.get('board_call_us')})")
    check(j.get("board_bandwidth_gbps", 0) > 0, f"the profile has the board's measured read rate ({j.get('board_bandwidth_gbps')})")
    # When it ran, and how many passes of the figures it took until two agreed within 10 % (at most 4); the figures
    # that still moved when they never did.
    check(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", j.get("measured_at", "")) is not None,
          f"the profile records when it was measured ({j.get('measured_at')})")
    check(1 <= j.get("passes", 0) <= 4, f"the figures took 1 to 4 passes ({j.get('passes')})")
    unstable = j.get("unstable")
    check(isinstance(unstable, list) and all(isinstance(u, str) and "->" in u for u in unstable),
          f"'unstable' lists the figures that moved ({unstable})")
    check(j["passes"] == 4 or not unstable, "figures are listed as unstable only when the passes never agreed")
    agreed = "agree within 10 %" in p.stderr
    check(agreed != bool(unstable) or j["passes"] < 2 or "on another rank" in p.stderr,
          f"chorus-tune says whether the passes agreed ({p.stderr.strip()[-300:]})")
    cs = j.get("corrections", [])
    sizes = [16 * 4**k for k in range(6) if 16 * 4**k <= 4096]
    for n in (2, 3):
        for coll, must in (("allreduce", {"ring", "recursive_doubling", "rabenseifner", "direct"}),
                           ("allgather", {"ring"})):
            got = {c["algo"]: c for c in cs if c["nranks"] == n and c["collective"] == coll and c["link"] == "shm"}
            check(must <= set(got), f"{n} ranks: {coll} corrections for {sorted(must)} (got {sorted(got)})")
            for a, c in got.items():
                f_ok = all(math.isfinite(f) and f > 0 for _, f in c["points"])
                check(f_ok and len(c["points"]) >= 3, f"{n} ranks: {coll}/{a}: {len(c['points'])} positive factors")
        tcp = {c["algo"] for c in cs if c["nranks"] == n and c["collective"] == "allreduce" and c["link"] == "tcp"}
        check({"ring", "recursive_doubling"} <= tcp, f"{n} ranks: allreduce corrections over TCP too (got {sorted(tcp)})")
        ar = [c for c in cs if c["nranks"] == n and c["collective"] == "allreduce" and c["algo"] == "ring"
              and c["link"] == "shm"]
        check(bool(ar) and [b for b, _ in ar[0]["points"]] == sizes,
              f"{n} ranks: the ring's allreduce points are at {sizes} bytes")

    # --append keeps the figures, replaces its own rank count's entries only.
    before = j
    p = run([RUN, "-n", "2", TUNE, "-o", prof, "--append", "--no-tcp", "--collectives", "allreduce",
             "--max-bytes", "256", "--correction-reps", "1"])
    check(p.returncode == 0, f"chorus-tune --append exits 0: {p.stderr[-800:]}")
    with open(prof) as f:
        after = json.load(f)
    def close(a, b):  # the figures go through 1/x on the way in and out
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
        if isinstance(a, (str, list)):
            return a == b
        return math.isclose(a, b, rel_tol=1e-9)
    check(all(close(before[k], after[k]) for k in before if k != "corrections"), "--append keeps the measured figures")
    ring2 = [c for c in after["corrections"] if c["nranks"] == 2 and c["algo"] == "ring" and c["collective"] == "allreduce"
             and c["link"] == "shm"]
    check(len(ring2) == 1 and [b for b, _ in ring2[0]["points"]] == [16, 64, 256],
          "--append replaced the 2-rank ring entry with its own sizes")
    n3 = [c for c in after["corrections"] if c["nranks"] == 3]
    check(n3 == [c for c in before["corrections"] if c["nranks"] == 3], "--append kept the 3-rank entries")

    # The library applies the factor: predicted with / without corrections.
    plain = os.path.join(d, "plain.json")
    with open(plain, "w") as f:
        json.dump({k: v for k, v in after.items() if k != "corrections"}, f)
    factor = dict(ring2[0]["points"])[256]
    with_c, without = bench_predicted(prof, "ring", 256), bench_predicted(plain, "ring", 256)
    check(with_c is not None and without is not None and without > 0 and abs(with_c / without - factor) < 1e-3 * factor,
          f"a 256-byte ring allreduce is priced at the model x the stored factor ({with_c} / {without} vs {factor})")

    # Bad input.
    for args, what in ((["--np", "1"], "--np 1"), (["--np", "2,x"], "--np 2,x"),
                       (["--collectives", "sendrecv"], "--collectives sendrecv"),
                       (["--max-bytes", "8"], "--max-bytes 8"), (["--passes", "0"], "--passes 0"),
                       (["--agree", "0"], "--agree 0")):
        p = run([TUNE, "-o", os.path.join(d, "never.json")] + args)
        check(p.returncode != 0 and ("chorus-tune" in p.stderr or what.split()[0] in p.stderr),
              f"{what} is refused with a message naming it ({p.stderr.strip()[:120]})")
    # One pass: no agreement check, nothing listed.
    one = os.path.join(d, "one.json")
    p = run([TUNE, "--np", "2", "-o", one, "--reps", "3", "--collectives", "none", "--no-tcp", "--passes", "1"])
    check(p.returncode == 0, f"chorus-tune --passes 1 exits 0: {p.stderr[-400:]}")
    with open(one) as f:
        o1 = json.load(f)
    check(o1.get("passes") == 1 and o1.get("unstable") == [], f"--passes 1: one pass, none listed ({o1.get('passes')})")
    # A bad record in a profile is refused, naming the key.
    bad_rec = os.path.join(d, "bad_record.json")
    with open(bad_rec, "w") as f:
        json.dump({"passes": "four"}, f)
    p = run([RUN, "-n", "2", BENCH, "allreduce", "-b", "64", "-e", "64", "-n", "1", "-w", "0"],
            env={"CHORUS_TUNE_FILE": bad_rec})
    check(p.returncode != 0 and "'passes'" in p.stderr, f"a profile whose 'passes' is not an integer is refused ({p.stderr.strip()[-160:]})")
    p = run([RUN, "-n", "2", TUNE, "-o", os.path.join(d, "missing.json"), "--append"])
    check(p.returncode != 0 and "--append" in p.stderr, "--append without a profile is refused")
    bad = os.path.join(d, "bad.json")
    with open(bad, "w") as f:
        json.dump({"corrections": [{"collective": "allreduce", "algo": "ring", "nranks": 2, "link": "shm",
                                    "points": [[64, 1], [16, 1]]}]}, f)
    p = run([RUN, "-n", "2", BENCH, "allreduce", "-b", "64", "-e", "64", "-n", "1", "-w", "0"],
            env={"CHORUS_TUNE_FILE": bad})
    check(p.returncode != 0 and "bad.json" in p.stderr and "ascending" in p.stderr,
          "a profile with unordered correction points is refused, naming the file")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
