#!/usr/bin/env python3
"""The layers of src/ as the build declares them (CMakeLists.txt, "One static library per folder").

    layering_test.py SRC_DIR [LIBCHORUS_SO]

1. Every `#include "<folder>/..."` in src/<layer> names a folder that layer may use (the transitive
   closure of its link list), and comm, tune, api and tools include no concrete transport
   (transport/<name>/...): they reach transports through the registry.  An include upwards -- comm reaching into api, plan into exec, anything
   into tools -- fails here with the file, the line and the allowed folders.  comm and prim include no
   kernels/ header either: the vocabulary of types (dtypes, BinOp, Scalar, WireFormat, ExactLayout) is
   common/'s, and an operation's arithmetic is plan steps or the executor's job prologue and epilogue
   (exec/local_ops.hpp), which the communicator describes as data.
2. libchorus.so (when given) exports only the C ABI (`chorus*` symbols) and holds no object of the
   tools' library, the simulator or the PTP daemon (nm -C finds none of their namespaces).

Exits 1 on a violation (each one listed), 0 otherwise.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

# Each layer's direct link list, as in CMakeLists.txt; "clock/ptp" is its own layer.
DIRECT = {
    "common": [],
    "kernels": ["common"],
    "plan": ["kernels", "common"],
    "tune": ["plan"],
    "sim": ["plan"],
    "trace": ["plan"],
    "clock": ["common"],
    "clock/ptp": ["clock"],
    "bootstrap": ["clock"],
    "transport": ["bootstrap", "kernels"],
    "exec": ["transport", "trace", "plan"],
    "comm": ["exec", "tune"],
    "prim": ["comm"],
    "device": ["common"],
    "api": ["prim", "device"],
    "toolkit": ["api", "tune", "bootstrap"],
}
# Layers that reach transports only through the registry (transport/registry.hpp)
# and the interface (transport/transport.hpp): an include of a concrete
# transport's folder (transport/shm/..., transport/tcp/...) there is a violation.
NO_CONCRETE_TRANSPORT = ("comm", "tune", "api", "toolkit")
# Layers that describe an operation's arithmetic and leave running it to exec
# (the executor's steps, a job's prologue and epilogue): an include of a
# kernels/ header there is a violation, although exec's closure holds kernels.
NO_KERNELS = ("comm", "prim")
# Namespaces of code that must stay out of libchorus.so.
NOT_IN_LIBRARY = ("chorus::tools::", "chorus::sim::", "chorus::clock::ptp::")


def closure(layer: str) -> set[str]:
    seen: set[str] = set()
    todo = list(DIRECT[layer])
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo.extend(DIRECT[d])
    return seen


def layer_of(rel: Path) -> str | None:
    parts = rel.parts
    if len(parts) >= 3 and parts[0] == "clock" and parts[1] == "ptp":
        return "clock/ptp"
    return parts[0] if parts[0] in DIRECT else None


INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([^"]+)"')


def check_includes(src: Path) -> list[str]:
    bad: list[str] = []
    unknown = sorted({p.relative_to(src).parts[0] for p in src.rglob("*.[ch]pp")} - {k.split("/")[0] for k in DIRECT})
    for u in unknown:
        bad.append(f"src/{u}/: a folder with no layer in CMakeLists.txt (add it there and to DIRECT here)")
    for f in sorted(src.rglob("*.[ch]pp")):
        rel = f.relative_to(src)
        layer = layer_of(rel)
        if layer is None:
            continue
        allowed = closure(layer) | {layer.split("/")[0]}
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            if target == "clock" and m.group(2).startswith("ptp/"):
                target = "clock/ptp"
            if target not in DIRECT:
                continue  # a third-party header ("nlohmann/json.hpp" is <>-included; "chorus/" is the public API)
            if (target == "transport" and layer in NO_CONCRETE_TRANSPORT and "/" in m.group(2)):
                bad.append(f"src/{rel}:{n}: layer '{layer}' includes the concrete transport \"{m.group(1)}/{m.group(2)}\"; "
                           f"it may reach transports only through transport/registry.hpp and transport/transport.hpp")
            if target == "kernels" and layer in NO_KERNELS:
                bad.append(f"src/{rel}:{n}: layer '{layer}' includes \"{m.group(1)}/{m.group(2)}\"; it may not use kernels: "
                           f"the types' vocabulary is in common/ (dtype.hpp, reduction.hpp, wire_format.hpp, "
                           f"exact_layout.hpp), the arithmetic is plan steps or exec::Job's prologue and epilogue "
                           f"(exec/local_ops.hpp)")
            if target != layer and target not in allowed:
                bad.append(f"src/{rel}:{n}: layer '{layer}' includes \"{m.group(1)}/{m.group(2)}\"; "
                           f"it may use {', '.join(sorted(closure(layer))) or 'nothing'}")
    return bad


def check_library(lib: Path) -> list[str]:
    bad: list[str] = []
    if not lib.exists():
        return [f"{lib}: no such library (build the 'chorus' target before this test)"]
    dyn = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    for line in dyn.splitlines():
        sym = line.split()[-1]
        if not sym.startswith("chorus"):
            bad.append(f"{lib.name} exports {sym!r}, not part of the C ABI")
    full = subprocess.run(["nm", "-C", str(lib)], capture_output=True, text=True, check=True).stdout
    for ns in NOT_IN_LIBRARY:
        hits = [l for l in full.splitlines() if ns in l]
        if hits:
            bad.append(f"{lib.name} holds {len(hits)} symbols of {ns[:-2]}, e.g. {hits[0].split(' ', 2)[-1][:120]}")
    return bad


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    bad = check_includes(Path(sys.argv[1]))
    if len(sys.argv) == 3:
        bad += check_library(Path(sys.argv[2]))
    for b in bad:
        print(b)
    print(f"layering: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
