"""The machine's CPU seconds over a span, by kind of process: where a whole ``make test`` spends its cores.

It samples every process once a second (psutil) and keeps each one's last CPU time; at SIGINT or
SIGTERM it writes, as JSON, the seconds per kind (a rank, a torchrun agent, the CLI, an invoker,
pip, sshd, ...) and the machine's busy seconds (``/proc/stat``). What no sample saw, a process
that lived under a second (an SSH session's sshd, a short invoker command, git), is the remainder,
``(unseen: short-lived)``. A process counts from the first sample on: start it before the work.

    .venv/bin/python scripts/cpu_by_process.py cpu.json & prof=$!
    CI=true bash .ci/run; kill -INT $prof; wait $prof

It costs about 1.5 % of a core. docs/benchmarks.md ("The developer loop") has a CI run's figures.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from pytest_cpu import busy_cpu_s  # scripts/ is this script's sys.path[0]

#: (a piece of the command line, the kind): the first that matches names a process.
_BY_ARGS = (
    ("-m pytest", "pytest"),   # first: its arguments name test files; not "pytest", in a state dir's path
    ("torch.distributed.run", "torchrun agent"),
    ("higgsfield.node.entrypoint", "rank (higgsfield.node.entrypoint)"),
    ("tests/training/launch.py", "rank (tests/training/launch.py)"),
    ("bench/gpu_suite.py", "bench/gpu_suite.py"),
    (" invoker ", "invoker (on a node)"),
    ("-m higgsfield", "higgsfield CLI"),
    ("bin/higgsfield", "higgsfield CLI"),
    ("pip install", "pip"),
    ("pip/__pip-runner__.py", "pip"),   # pip run by another interpreter's pip (``pip --python``: a node's env build)
)
_BY_NAME = ("sshd", "dockerd", "containerd-shim", "containerd", "runc", "slurmctld", "slurmstepd", "slurmd",
            "slurmdbd", "mariadbd", "chromium", "mypy", "git", "docker", "ssh", "cc1plus", "node")


def kind(cmdline: list[str], name: str) -> str:
    """The kind of a process, from its command line, else its name."""
    line = " ".join(cmdline)
    for piece, k in _BY_ARGS:
        if piece in line:
            return k
    exe = os.path.basename(cmdline[0]) if cmdline else name
    for n in _BY_NAME:
        if exe.startswith(n) or name.startswith(n):
            return n
    return "other python" if "python" in exe else f"other: {name}"


def _cpu() -> dict[tuple[int, float], tuple[str, float]]:
    out = {}
    for p in psutil.process_iter(["pid", "name", "cmdline", "cpu_times", "create_time"]):
        i, t = p.info, p.info["cpu_times"]
        if t is not None:
            out[(i["pid"], i["create_time"])] = (kind(i["cmdline"] or [], i["name"] or ""), t.user + t.system)
    return out


def main(out: Path) -> None:
    stop = False

    def _stop(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    busy0, wall0 = busy_cpu_s(), time.monotonic()
    before = {key: cpu for key, (_, cpu) in _cpu().items()}   # what running processes had spent already
    last: dict[tuple[int, float], tuple[str, float]] = {}
    while not stop:
        last.update(_cpu())
        time.sleep(1.0)
    by: dict[str, float] = {}
    for key, (k, cpu) in last.items():
        by[k] = by.get(k, 0.0) + cpu - before.get(key, 0.0)
    busy = busy_cpu_s() - busy0
    by["(unseen: short-lived)"] = busy - sum(by.values())
    out.write_text(json.dumps({"wall_s": time.monotonic() - wall0, "busy_cpu_s": busy,
                               "by_kind": {k: round(v, 1) for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v >= 0.05}}, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "cpu-by-process.json"))
