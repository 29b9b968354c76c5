#!/usr/bin/env python3
"""The command lines of the tools as users type them (issue 17, items 13 and 14).

  cli_test.py BIN_DIR

- every tool's --help shows the default of every option that has one;
- `chorus-run -n 0` is an error naming -n and the rule, not a 300-digit range;
- one size grammar: 8k = 8K = 8KiB, 64M = 64MB = 64MiB, 1G (chorus-bench's header prints the bytes);
- chorus-bench takes nccl-tests' -t -g -a -z -p -G -C -T with their meaning, or says
  "not applicable on CPU ranks";
- `--algo NAME` that cannot run a size says why and measures nothing (exit 1);
- with CHORUS_TRACE, `chorus-trace report` of a chorus-bench run holds only the measured calls.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

BIN = sys.argv[1]
FAILS = []


def tool(name):
    return os.path.join(BIN, name)


def run(args, env=None, timeout=180):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("CHORUS_", "OMPI_", "PMIX_", "SLURM_")) and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                                                    "MASTER_PORT")}
    e.update(env or {})
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=e)


def check(cond, what, proc=None):
    if cond:
        print("ok   " + what)
        return
    detail = "" if proc is None else f"\n  exit {proc.returncode}\n  stdout: {proc.stdout[-3000:]}\n  stderr: {proc.stderr[-3000:]}"
    print("FAIL " + what + detail)
    FAILS.append(what)


# ---- --help shows defaults ---------------------------------------------------
# CLI11 (2.1) writes an option as "  -n,--np INT:1..1048576=1   text": the
# default after '=' at the end of the type, before the two-space gap to the
# text.  Every option that takes a value and is not REQUIRED must show one.
OPTION = re.compile(r"^\s+(-\w,)?(--?[\w-]+)(,[-\w]+)*\s+(INT|UINT|FLOAT|TEXT)(.*)$")


def help_defaults(args, label, numbers_only=False):
    """numbers_only: only INT/FLOAT options must show a default (chorus-sim's optional
    TEXT options are output paths whose default is "none")."""
    proc = run(args + ["--help"])
    check(proc.returncode == 0, f"{label} --help exits 0", proc)
    missing = []
    seen = 0
    for line in proc.stdout.splitlines():
        m = OPTION.match(line)
        if not m or "REQUIRED" in line or (numbers_only and m.group(4).startswith("TEXT")):
            continue
        seen += 1
        if "=" not in m.group(5).split("  ")[0]:
            missing.append(line.strip())
    check(seen > 0, f"{label} --help lists options with values", proc)
    check(not missing, f"{label} --help shows a default for every optional value: missing {missing}", proc)
    return proc.stdout


run_help = help_defaults([tool("chorus-run")], "chorus-run")
check(re.search(r"--kill-grace FLOAT\S*=3\b", run_help) is not None, "chorus-run --help shows --kill-grace =3")
bench_help = help_defaults([tool("chorus-bench")], "chorus-bench")
check(re.search(r"-b,--minbytes TEXT=32M", bench_help) is not None, "chorus-bench --help shows -b =32M")
check(re.search(r"-a,--average INT:.*=3", bench_help) is not None, "chorus-bench --help shows -a =3")
check("powers of 1024" in bench_help, "chorus-bench --help states that size suffixes are binary")
help_defaults([tool("chorus-tune")], "chorus-tune")
help_defaults([tool("chorus-sim"), "collective"], "chorus-sim collective")
help_defaults([tool("chorus-sim"), "train"], "chorus-sim train", numbers_only=True)
help_defaults([tool("chorus-trace"), "merge"], "chorus-trace merge")
help_defaults([tool("chorus-ptp")], "chorus-ptp")

# ---- chorus-run -n 0 -----------------------------------------------------------
for bad in ("0", "two", "1048577"):
    proc = run([tool("chorus-run"), "-n", bad, "true"])
    digits = max((len(d) for d in re.findall(r"\d+", proc.stderr)), default=0)
    check(proc.returncode != 0 and f"-n {bad}" in proc.stderr and "number of ranks" in proc.stderr and digits < 12,
          f"chorus-run -n {bad} is an error naming -n and the rule", proc)

# ---- one size grammar ----------------------------------------------------------
def bench(args, env=None, np_=1):
    return run([tool("chorus-bench"), "allreduce", "--np", str(np_), "-n", "1", "-w", "0"] + args, env)


for spelled, value in (("8k", 8192), ("8K", 8192), ("8KiB", 8192), ("8KB", 8192), ("64M", 64 << 20),
                       ("64MB", 64 << 20), ("64MiB", 64 << 20), ("1G", 1 << 30)):
    if value > 64 << 20:
        continue  # not run (a 1 GiB buffer): see -b 1G -e 1023M below
    proc = bench(["-b", spelled, "-e", spelled, "-c", "0"])
    check(proc.returncode == 0 and f"minBytes {value} maxBytes {value}" in proc.stdout,
          f"chorus-bench -b {spelled} is {value} bytes", proc)
# 1G is not run (a 1 GiB buffer); its parse shows in the sweep error against a smaller -e.
proc = bench(["-b", "1G", "-e", "1023M"])
check(proc.returncode != 0 and "1073741824" in proc.stderr and "1072693248" in proc.stderr,
      "chorus-bench -b 1G -e 1023M: 1G is 2^30 bytes and 1023M is 1023 x 2^20", proc)
proc = bench(["-b", "12X"])
check(proc.returncode == 2 and "-b '12X'" in proc.stderr and "powers of 1024" in proc.stderr,
      "chorus-bench -b 12X names the flag, the value and the grammar", proc)
cluster = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "clusters", "h100-rail.json")
proc = run([tool("chorus-sim"), "collective", "--cluster", cluster, "--gpus", "8", "--bytes", "64MB"])
check(proc.returncode == 0 and "67108864 bytes" in proc.stdout, "chorus-sim --bytes 64MB is 64 x 2^20 bytes", proc)
proc = run([tool("chorus-sim"), "collective", "--cluster", cluster, "--gpus", "8", "--bytes", "1.1K"])
check(proc.returncode != 0 and "--bytes '1.1K'" in proc.stderr + proc.stdout,
      "chorus-sim --bytes 1.1K (not whole bytes) is refused naming --bytes", proc)

# ---- chorus-sim: typos and defaults (issue 42) ---------------------------------
proc = run([tool("chorus-sim"), "trian"])
check(proc.returncode != 0 and "did you mean 'train'" in proc.stderr, "chorus-sim trian suggests train", proc)
proc = run([tool("chorus-sim"), "train", "--tpp", "2"])
check(proc.returncode != 0 and "did you mean '--tp'" in proc.stderr, "chorus-sim train --tpp suggests --tp", proc)
models = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "models")
# --dp left out: gpus / (tp x pp x cp) = 16 / (2 x 2 x 1) = 4.
proc = run([tool("chorus-sim"), "train", "--model", os.path.join(models, "Llama-3.1-8B"), "--cluster", cluster,
            "--gpus", "16", "--tp", "2", "--pp", "2", "--global-batch", "64", "--estimate", "--json"])
check(proc.returncode == 0 and json.loads(proc.stdout)["layout"]["dp"] == 4,
      "chorus-sim train without --dp derives dp = gpus / (tp pp cp) = 4", proc)
proc = run([tool("chorus-sim"), "train", "--model", os.path.join(models, "Llama-3.1-8B"), "--cluster", cluster,
            "--gpus", "12", "--tp", "8", "--global-batch", "64"])
check(proc.returncode != 0 and "--dp not given" in proc.stderr, "chorus-sim train: --gpus 12 not a multiple of tp 8 without --dp", proc)
with tempfile.TemporaryDirectory() as d:
    cfg = json.load(open(os.path.join(models, "Llama-3.1-70B", "config.json")))
    cfg["num_key_value_head"] = cfg.pop("num_key_value_heads")
    typo = os.path.join(d, "config.json")
    json.dump(cfg, open(typo, "w"))
    proc = run([tool("chorus-sim"), "model", "--model", typo])
    check(proc.returncode != 0 and "did you mean 'num_key_value_heads'" in proc.stderr and "--allow-unknown-keys" in proc.stderr,
          "chorus-sim model: num_key_value_head is refused with a did-you-mean", proc)
    proc = run([tool("chorus-sim"), "model", "--model", typo, "--allow-unknown-keys", "--json"])
    check(proc.returncode == 0 and "num_key_value_head" in json.loads(proc.stdout)["ignored_keys"],
          "chorus-sim model --allow-unknown-keys reads it, the key listed as not read", proc)
    proc = run([tool("chorus-sim"), "model", "--model", os.path.join(models, "Llama-3.1-70B")])
    lines = [l for l in proc.stderr.splitlines() if "keys not read" in l]
    check(proc.returncode == 0 and len(lines) == 1 and "rope_theta" in lines[0],
          "chorus-sim model lists the keys it did not read in one line on stderr", proc)

# Node-limited routing as a flag: the default all-to-all dispatcher refuses it; the
# hierarchical one prices it (a token's experts inside 1 of 8 node groups: fewer NIC copies
# than the model's 4 of 8).
ds = [tool("chorus-sim"), "train", "--model", os.path.join(models, "DeepSeek-V3"), "--cluster", cluster, "--gpus", "1024",
      "--pp", "16", "--ep", "64", "--global-batch", "1024", "--seq", "4096", "--recompute", "full", "--estimate", "--json"]
proc = run(ds + ["--moe-node-limit", "8:4"])
check(proc.returncode != 0 and "cannot honour node-limited routing" in proc.stderr,
      "chorus-sim --moe-node-limit with the all-to-all dispatcher is refused", proc)
own = run(ds + ["--moe-dispatch", "hierarchical"])
one = run(ds + ["--moe-dispatch", "hierarchical", "--moe-node-limit", "8:1"])
check(own.returncode == 0 and one.returncode == 0 and
      json.loads(one.stdout)["breakdown"]["ep_comm_s"] < json.loads(own.stdout)["breakdown"]["ep_comm_s"],
      "chorus-sim --moe-node-limit 8:1 under the hierarchical dispatcher sends fewer copies than the model's 8:4", one)

# ---- nccl-tests flags -----------------------------------------------------------
proc = run([tool("chorus-bench"), "allreduce", "-g", "2", "-b", "1K", "-e", "1K", "-n", "2", "-w", "1"])
check(proc.returncode == 0 and "nranks 2" in proc.stdout, "chorus-bench -g 2 runs 2 ranks (nccl-tests' -g)", proc)
proc = run([tool("chorus-bench"), "allreduce", "-t", "2", "-g", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0"])
check(proc.returncode == 0 and "nranks 4" in proc.stdout, "chorus-bench -t 2 -g 2 runs 4 ranks", proc)
proc = run([tool("chorus-run"), "-n", "2", "--", tool("chorus-bench"), "allreduce", "-g", "2", "-b", "1K", "-e", "1K"])
check(proc.returncode != 0 and "not applicable on CPU ranks" in proc.stderr and "chorus-run -n" in proc.stderr,
      "chorus-bench -g 2 under a launcher: not applicable on CPU ranks", proc)
proc = bench(["-b", "1K", "-e", "1K", "-G", "10"])
check(proc.returncode == 2 and "-G 10: not applicable on CPU ranks" in proc.stderr, "chorus-bench -G 10 refused", proc)
proc = bench(["-b", "1K", "-e", "1K", "-p", "1"])
check(proc.returncode == 0 and "-p 1: not applicable on CPU ranks" in proc.stderr, "chorus-bench -p 1 noted", proc)
proc = bench(["-b", "1K", "-e", "1K", "-C", "0"])
check(proc.returncode == 0 and "-C 0: not applicable on CPU ranks" in proc.stderr, "chorus-bench -C 0 noted", proc)
proc = bench(["-b", "1K", "-e", "1K", "-a", "1", "-z", "0"], np_=2)
check(proc.returncode == 0 and "average: 1(avg) blocking: 0" in proc.stdout and "OK" in proc.stdout,
      "chorus-bench -a 1 -z 0 measures and checks", proc)
proc = bench(["-b", "1K", "-e", "1K", "-a", "5"])
check(proc.returncode != 0 and "-a" in proc.stderr, "chorus-bench -a 5 refused", proc)
proc = bench(["-b", "1K", "-e", "1K", "-T", "30"], np_=2)
check(proc.returncode == 0, "chorus-bench -T 30 runs", proc)

# ---- --algo NAME that cannot run a size ----------------------------------------
proc = run([tool("chorus-bench"), "allgather", "--np", "3", "-n", "1", "-w", "0", "-b", "1K", "-e", "4K", "-f", "4",
            "--algo", "recursive_doubling"])
check(proc.returncode == 1 and "not measured" in proc.stdout and "power-of-two number of ranks" in proc.stdout
      and not re.search(r"^\s+1024\s", proc.stdout, re.M) and "could not run 2 size(s)" in proc.stderr,
      "chorus-bench allgather --algo recursive_doubling on 3 ranks says why and measures nothing", proc)
proc = bench(["-b", "1K", "-e", "1K", "--algo", "ring"], np_=3)
check(proc.returncode == 0 and re.search(r"^\s+1024\s", proc.stdout, re.M) is not None,
      "chorus-bench --algo ring on 3 ranks measures", proc)

# ---- the bookkeeping stays out of the trace --------------------------------------
with tempfile.TemporaryDirectory() as d:
    proc = run([tool("chorus-bench"), "allreduce", "--np", "2", "-b", "1K", "-e", "1K", "-n", "4", "-w", "2"],
               env={"CHORUS_TRACE": d})
    check(proc.returncode == 0, "chorus-bench under CHORUS_TRACE", proc)
    rep = run([tool("chorus-trace"), "report", d, "--json"])
    check(rep.returncode == 0, "chorus-trace report", rep)
    if rep.returncode == 0:
        j = json.loads(rep.stdout)
        comms = j if isinstance(j, list) else [j]
        colls = [(c["collective"], c["bytes"], c["calls"]) for r in comms for c in r["collectives"]]
        # 1 checked + 2 warm-up + 4 timed calls, out of place and in place.
        check(len(comms) == 1 and colls == [("allreduce", 1024, 14)],
              f"chorus-trace report holds only the 14 measured allreduces of 1 KiB: {colls}", rep)

if FAILS:
    print(f"cli_test: {len(FAILS)} check(s) failed: {FAILS}", file=sys.stderr)
    sys.exit(1)
print("cli_test: ok")
