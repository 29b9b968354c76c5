"""Runs torch's own distributed test suite against one backend and reports
every test as passed, failed or skipped (with the reason).

The suite is ``torch.testing._internal.distributed.distributed_test``: the
class ``DistributedTest._DistTestBase`` holds the tests and ``TestDistBackend``
runs each on ``WORLD_SIZE`` ranks (``MultiProcessTestCase``), which is how
torch's own ``test/distributed/test_distributed_spawn.py`` drives it with the
``BACKEND``, ``WORLD_SIZE`` and ``TEMP_DIR`` variables.  Two deviations from
that driver, both for speed and neither changing what a test does: the ranks
are forked from this process (torch is imported once, not once per rank and
test), and this script is the runner (one JSON report instead of unittest's
text).

Gates.  The suite decides at import time, from the backend's *name*, which
tests apply (``sandcastle_skip_if(BACKEND != "gloo", ...)``,
``require_backend({"gloo"})``, ``DistTestCases.backend_feature[...]``); see
``gates()``.  A backend torch does not know would therefore skip every test
gated to gloo and be compared on fewer tests.  With ``--gates gloo`` (the
default for ``--backend chorus``) the module is imported as for gloo, so every
gate opens exactly as it does for gloo, and then the backend actually used is
``--backend``: the module's ``BACKEND`` (read by test bodies, by
``init_process_group`` in ``TestDistBackend._run`` and by re-initialising
tests) and the ``BACKEND`` variable are switched to it before any test runs.
The backend lists that test bodies consult at run time and that name gloo
(``PROFILING_SUPPORTED_BACKENDS`` and the other two profiling allowlists) get
the backend too, so its profiling assertions run as they do for gloo.  One
helper picks its CPU code path by name (``_test_accumulate_gradients_no_sync``:
``if BACKEND == "mpi" or BACKEND == "gloo"``, and nothing for another name);
it runs with ``BACKEND`` reading "gloo" for that choice only, while the
process group stays the tested backend (asserted).  ``--gates native``
imports the suite under the backend's own name instead (what torch's driver
would do with a plugin backend).

Compare mode (the ctest ``python.torch_dist_suite.npN``): ``--compare`` runs
the suite for gloo (its own gates, as torch's CI runs it) and for chorus
(gloo's gates) side by side in two processes, then fails unless every test
gloo passes also passes for chorus -- passes, not skips -- except the tests in
GLOO_ONLY_API, each of which must fail with the reason given there (an API
that torch's Python implements for gloo alone), so that the exception cannot
hide another failure.  It also fails if gloo does not pass the tests in
MUST_PASS (the ones that exercise what issue 17 item 16 asked for), so that
a broken gloo run cannot make the comparison vacuous.

Usage::

    torch_dist_suite.py --backend chorus --world-size 2 --json out.json [TEST ...]
    torch_dist_suite.py --compare --world-size 2 --out-dir DIR
    torch_dist_suite.py --gates-table          # the name gates of every test
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def _parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="chorus", help="backend under test (default chorus)")
    p.add_argument("--world-size", type=int, default=2, help="ranks per test (default 2)")
    p.add_argument("--gates", choices=("gloo", "native"), default=None,
                   help="import the suite with gloo's name gates (default for a backend other than gloo) or "
                        "the backend's own")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--tests-from", help="run the tests named in this file (one per line, # comments)")
    p.add_argument("--timeout", type=int, default=120, help="seconds per test before its ranks are killed")
    p.add_argument("--list", action="store_true", help="list the suite's test names and exit")
    p.add_argument("--gates-table", action="store_true", help="print every test's name gates and exit")
    p.add_argument("--compare", action="store_true",
                   help="run gloo and chorus side by side and assert chorus passes every test gloo passes")
    p.add_argument("--out-dir", help="--compare: where the two reports and logs go (default: a temporary folder)")
    p.add_argument("tests", nargs="*", help="test names (default: all)")
    a = p.parse_args(argv)
    if a.world_size < 2:
        p.error("--world-size {}: the suite needs at least 2 ranks".format(a.world_size))
    if a.timeout <= 0:
        p.error("--timeout {}: must be a positive number of seconds".format(a.timeout))
    if a.gates is None:
        a.gates = "native" if a.backend == "gloo" else "gloo"
    return a


SUITE_FILE = None  # set by _import_suite


def _import_suite(args):
    """Imports torch's suite with the gates of `args.gates`, then points it at
    `args.backend`.  Returns the module."""
    global SUITE_FILE
    sys.path.insert(0, os.path.join(HERE, "torch_stubs"))  # expecttest stand-in
    # No GPU for either backend, so that the two runs see the same machine.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["WORLD_SIZE"] = str(args.world_size)
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(args.timeout)
    # As torch's run_test.py runs the suite "with file:// init_method": the
    # tests that re-initialise the default group meet in this file.
    temp_dir = tempfile.mkdtemp(prefix="torch-dist-suite-")
    os.environ["TEMP_DIR"] = temp_dir
    os.environ["INIT_METHOD"] = "file://" + os.path.join(temp_dir, "shared_init_file")
    gate_name = args.backend if args.gates == "native" else "gloo"
    os.environ["BACKEND"] = gate_name
    sys.argv = sys.argv[:1]  # common_utils parses sys.argv at import

    import torch.distributed as dist

    if args.backend == "chorus":
        import chorus.torch  # noqa: F401  (registers the backend)
    from torch.testing._internal.distributed import distributed_test as dt

    SUITE_FILE = dt.__file__
    _replicated_tensor_workaround()
    if args.backend != gate_name:
        dt.BACKEND = args.backend
        os.environ["BACKEND"] = args.backend
        for name in ("PROFILING_SUPPORTED_BACKENDS", "CUDA_PROFILING_SUPPORTED_BACKENDS",
                     "SEND_RECV_PROFILING_SUPPORTED_BACKENDS"):
            allow = getattr(dt, name)
            if dist.Backend.GLOO in allow and args.backend not in allow:
                allow.append(args.backend)
    return dt


REPLICATED_TENSOR_NOTE = None


def _replicated_tensor_workaround():
    """TestDistBackend._run turns on DDP's ReplicatedTensor mode, which imports
    torch.distributed._shard.sharded_tensor.  Under Python 3.11 that import
    fails in torch 1.13 (a dataclass field with a mutable default, which 3.11
    rejects), so every DDP test would fail on every backend before any
    communication.  Only then the mode stays off: DDP runs as users run it."""
    global REPLICATED_TENSOR_NOTE
    try:
        import torch.distributed._shard.sharded_tensor  # noqa: F401
        return
    except ValueError as e:
        REPLICATED_TENSOR_NOTE = "DDP ReplicatedTensor mode off: torch.distributed._shard fails to import ({})".format(
            str(e).splitlines()[0][:120])
    import torch.nn.parallel._replicated_tensor_ddp_utils as rt

    rt._set_ddp_with_replicated_tensor = lambda value: None


def _make_case_class(dt, args):
    base = (dt.TestDistBackend, dt.DistributedTest._DistTestBase)

    class TorchDistSuite(*base):
        def setUp(self):
            super().setUp()
            # Fork, not spawn: torch is already imported here, and a forked
            # rank inherits the backend registration and the gate switch.
            import torch.multiprocessing as tmp
            self._start_processes(tmp.get_context("fork").Process)

    if args.gates == "gloo" and args.backend != "gloo":
        helper = dt.DistributedTest._DistTestBase._test_accumulate_gradients_no_sync

        def _test_accumulate_gradients_no_sync(self, *a, **kw):
            # The helper builds its CPU model only `if BACKEND == "mpi" or
            # BACKEND == "gloo"`; it must still run on the tested backend.
            import torch.distributed as dist
            assert dist.get_backend() == args.backend, dist.get_backend()
            dt.BACKEND = "gloo"
            try:
                return helper(self, *a, **kw)
            finally:
                dt.BACKEND = args.backend

        TorchDistSuite._test_accumulate_gradients_no_sync = _test_accumulate_gradients_no_sync

    TorchDistSuite.__name__ = TorchDistSuite.__qualname__ = "TorchDistSuite"
    return TorchDistSuite


def _presk(dt, cls, name, world):
    """The skip a test's rank would report for want of GPUs or ranks, decided
    here without forking its ranks (most of the suite's time on a CPU-only
    machine would otherwise go to starting ranks that exit at once).  The
    conditions are those of torch's own decorators (common_distributed:
    skip_if_lt_x_gpu, skip_if_no_gpu, skip_if_small_worldsize,
    skip_if_odd_worldsize), read from the wrappers around the test; None
    when the test must run."""
    import torch
    from torch.testing._internal import common_distributed as cd

    def code(deco):
        return deco(lambda: None).__code__

    lt_gpu, no_gpu = code(cd.skip_if_lt_x_gpu(1)), code(cd.skip_if_no_gpu)
    small, odd = code(cd.skip_if_small_worldsize), code(cd.skip_if_odd_worldsize)
    backend = os.environ["BACKEND"]
    f = getattr(cls, name)
    f = getattr(f, "__func__", f)
    while f is not None:
        c = getattr(f, "__code__", None)
        if c is lt_gpu:
            x = f.__closure__[c.co_freevars.index("x")].cell_contents
            if not (torch.cuda.is_available() and torch.cuda.device_count() >= x):
                return cd.TEST_SKIPS["multi-gpu-{}".format(x)].message
        elif c is no_gpu:
            if not torch.cuda.is_available():
                return cd.TEST_SKIPS["no_cuda"].message
            if torch.cuda.device_count() < world:
                return cd.TEST_SKIPS["multi-gpu-{}".format(world)].message
        elif c is small and backend != "mpi" and world <= 2:
            return cd.TEST_SKIPS["small_worldsize"].message
        elif c is odd and backend != "mpi" and world % 2 == 1:
            return cd.TEST_SKIPS["odd_worldsize"].message
        f = getattr(f, "__wrapped__", None)
    return None


class _Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.outcome = None
        self.detail = ""

    def addSuccess(self, test):
        self.outcome = "pass"

    def addSkip(self, test, reason):
        self.outcome, self.detail = "skip", reason

    def addFailure(self, test, err):
        self.outcome, self.detail = "fail", self._exc_info_to_string(err, test)

    def addError(self, test, err):
        self.outcome, self.detail = "fail", self._exc_info_to_string(err, test)

    def addExpectedFailure(self, test, err):
        self.outcome, self.detail = "fail", "expected failure counted as a failure"

    def addUnexpectedSuccess(self, test):
        self.outcome = "pass"


def _short(detail, limit=1500):
    """The child's exception, without the parent's frames."""
    m = re.findall(r"Process \d+ exited with error code \d+ and exception:\n(.*?)(?=\nProcess \d+ exited|\Z)",
                   detail, re.S)
    text = m[0] if m else detail
    # Without torch's C++ frames (TORCH_SHOW_CPP_STACKTRACES is on in ranks).
    lines = [ln for ln in text.strip().splitlines()
             if ln.strip() and not re.match(r"\s*(frame #\d+:|Exception raised from )", ln)]
    tail = "\n".join(lines[-12:])
    return tail[-limit:]


def run(args):
    dt = _import_suite(args)
    cls = _make_case_class(dt, args)
    names = sorted(n for n in dir(cls) if n.startswith("test_"))
    if args.list:
        print("\n".join(names))
        return 0
    wanted = list(args.tests)
    if args.tests_from:
        with open(args.tests_from) as f:
            wanted += [ln.split("#")[0].strip() for ln in f if ln.split("#")[0].strip()]
    if wanted:
        unknown = [n for n in wanted if n not in names]
        if unknown:
            print("unknown test name(s) for this torch: {}".format(", ".join(unknown)), file=sys.stderr)
            return 2
        names = wanted
    report = {"backend": args.backend, "gates": args.gates, "world_size": args.world_size,
              "torch": __import__("torch").__version__, "suite": SUITE_FILE,
              "notes": [REPLICATED_TENSOR_NOTE] if REPLICATED_TENSOR_NOTE else [], "tests": {}}
    t_all = time.monotonic()
    for i, name in enumerate(names):
        t0 = time.monotonic()
        result = _Result()
        why = _presk(dt, cls, name, args.world_size)
        if why is not None:
            result.outcome, result.detail = "skip", why + " (decided before starting ranks)"
        else:
            cls(name).run(result)
        outcome = result.outcome or "fail"
        entry = {"outcome": outcome, "seconds": round(time.monotonic() - t0, 2)}
        if outcome != "pass":
            entry["detail"] = _short(result.detail or "no outcome reported")
        report["tests"][name] = entry
        print("[{}/{}] {} {} ({:.1f} s){}".format(i + 1, len(names), outcome.upper(), name, entry["seconds"],
                                                  "  " + entry["detail"].splitlines()[-1][:200]
                                                  if outcome != "pass" and entry.get("detail") else ""),
              flush=True)
    counts = {k: sum(1 for e in report["tests"].values() if e["outcome"] == k) for k in ("pass", "fail", "skip")}
    report["counts"] = counts
    report["seconds"] = round(time.monotonic() - t_all, 1)
    print("{} ranks, backend {} (gates {}): {} passed, {} failed, {} skipped in {:.0f} s".format(
        args.world_size, args.backend, args.gates, counts["pass"], counts["fail"], counts["skip"],
        report["seconds"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
    return 0


def gates(path):
    """{test: [gate, ...]}: the decorators of each test of `path` (torch's
    distributed_test.py) and the test-body lines that decide by backend name."""
    src = open(path).read()
    tree = ast.parse(src)
    base = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "_DistTestBase")
    methods = {f.name: f for f in base.body if isinstance(f, ast.FunctionDef)}
    name_re = re.compile(r"\bBACKEND\b|os\.environ\[\"BACKEND\"\]|get_backend\(\)")
    feature_re = re.compile(r"backend_feature|skip_collective|require_backend|BACKEND|_gpu|no_gpu|nccl")

    def body_refs(f, seen):
        """Lines of f and of the self._helpers it calls that test the name."""
        out = []
        for node in ast.walk(f):
            if isinstance(node, ast.Compare):
                seg = ast.get_source_segment(src, node)
                if seg and name_re.search(seg) and ("==" in seg or "!=" in seg or " in " in seg):
                    out.append(" ".join(seg.split()))
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and node.attr in methods and node.attr not in seen and node.attr.startswith("_")):
                seen.add(node.attr)
                out += body_refs(methods[node.attr], seen)
        return out

    table = {}
    for name, f in methods.items():
        if not name.startswith("test_"):
            continue
        decs = [" ".join(ast.get_source_segment(src, d).split()) for d in f.decorator_list]
        body = []
        for stmt in f.body:
            body += body_refs(stmt, {name})
        table[name] = {"decorators": [d for d in decs if feature_re.search(d)],
                       "body": sorted(set(body))}
    return table


# Tests gloo passes whose API torch's Python refuses for any other backend,
# and the message it refuses with: these must fail for chorus with exactly
# that message (anything else is a real failure).
GLOO_ONLY_API = {
    "test_monitored_barrier_gloo": "monitored_barrier is only implemented for GLOO backend",
    "test_monitored_barrier_gloo_subgroup": "monitored_barrier is only implemented for GLOO backend",
    "test_monitored_barrier_failure_order": "monitored_barrier is only implemented for GLOO backend",
    "test_monitored_barrier_wait_all_ranks": "monitored_barrier is only implemented for GLOO backend",
    # Calls ProcessGroup.monitored_barrier directly; chorus does not implement
    # it (torch's Python would refuse it anyway, as above).
    "test_monitored_barrier_gloo_rank_0_timeout": "ProcessGroup chorus does not support monitoredBarrier",
}

# What issue 17 item 16 asked for; gloo must pass these, so chorus must too.
MUST_PASS = [
    "test_send_recv_any_source", "test_send_recv_any_source_autograd_profiler",
    "test_send_recv_any_source_torch_profiler",                       # recv from any source
    "test_get_future", "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",     # Work.get_future, DDP comm hooks
    "test_sparse_all_reduce_sum",                                     # sparse allreduce
    "test_barrier_timeout_global", "test_barrier_timeout_full_group",  # a barrier's timeout
    "test_batch_isend_irecv_gloo",                                    # batched p2p (a chorus group)
    "test_all_reduce_sum", "test_DistributedDataParallelCPU",
]


def compare(args):
    out = args.out_dir or tempfile.mkdtemp(prefix="torch-dist-compare-")
    os.makedirs(out, exist_ok=True)
    n = args.world_size
    runs = {}
    for backend in ("gloo", "chorus"):
        report = os.path.join(out, "{}.np{}.json".format(backend, n))
        log = open(os.path.join(out, "{}.np{}.log".format(backend, n)), "w")
        cmd = [sys.executable, os.path.abspath(__file__), "--backend", backend, "--world-size", str(n),
               "--timeout", str(args.timeout), "--json", report]
        runs[backend] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), report, log)
    results = {}
    for backend, (proc, report, log) in runs.items():
        rc = proc.wait()
        log.close()
        if rc != 0 or not os.path.exists(report):
            print("the {} run failed (exit {}); its log: {}".format(backend, rc, log.name))
            with open(log.name) as f:
                print("".join(f.readlines()[-30:]))
            return 1
        with open(report) as f:
            results[backend] = json.load(f)
    gloo, chorus = results["gloo"]["tests"], results["chorus"]["tests"]
    problems = []
    for t in MUST_PASS:
        if gloo.get(t, {}).get("outcome") != "pass":
            problems.append("gloo did not pass {} ({}): the comparison would not cover it".format(
                t, gloo.get(t, {}).get("outcome", "not run")))
    excused = []
    for t, g in sorted(gloo.items()):
        if g["outcome"] != "pass":
            continue
        c = chorus.get(t, {"outcome": "not run", "detail": ""})
        if c["outcome"] == "pass":
            continue
        why = GLOO_ONLY_API.get(t)
        if why and c["outcome"] == "fail" and why in c.get("detail", ""):
            excused.append(t)
            continue
        problems.append("{}: gloo passes, chorus {}{}".format(
            t, c["outcome"].upper(), (":\n    " + c.get("detail", "").strip().replace("\n", "\n    "))
            if c.get("detail") else ""))
    for name, r in results.items():
        cnt = r["counts"]
        print("{} ranks, {:6} (gates {:6}): {:3} passed, {:3} failed, {:3} skipped in {:.0f} s".format(
            n, name, r["gates"], cnt["pass"], cnt["fail"], cnt["skip"], r["seconds"]))
    print("gloo passes {} tests; chorus passes {} of them; {} use an API torch implements for gloo only: {}".format(
        sum(1 for g in gloo.values() if g["outcome"] == "pass"),
        sum(1 for t, g in gloo.items() if g["outcome"] == "pass" and chorus.get(t, {}).get("outcome") == "pass"),
        len(excused), ", ".join(excused) or "-"))
    extra = sorted(t for t, c in chorus.items() if c["outcome"] == "pass" and gloo.get(t, {}).get("outcome") != "pass")
    if extra:
        print("chorus also passes (gloo does not): " + ", ".join(extra))
    for note in results["chorus"].get("notes", []):
        print("note: " + note)
    print("reports: {}".format(out))
    if problems:
        print("FAILED: {} problem(s)".format(len(problems)))
        for p in problems:
            print("  " + p)
        return 1
    print("OK: chorus passes every test gloo passes")
    return 0


def main(argv=None):
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    if args.compare:
        return compare(args)
    if args.gates_table:
        sys.path.insert(0, os.path.join(HERE, "torch_stubs"))
        import importlib.util
        spec = importlib.util.find_spec("torch.testing._internal.distributed.distributed_test")
        for name, g in sorted(gates(spec.origin).items()):
            print("{}\n  decorators: {}\n  body: {}".format(name, " ; ".join(g["decorators"]) or "-",
                                                           " ; ".join(g["body"]) or "-"))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
