"""A pytest plugin: per test, its wall seconds and the machine's busy CPU seconds over the same span.

The busy seconds are machine-wide (``/proc/stat``: every process, the test bed's "nodes", dockerd
and slurmd included), so a test's figure is its whole cost on this machine, not just pytest's.
Their ratio over the wall time, divided by the cores, is how full the machine was: how much a
second lane of tests could still use (the Makefile's ``test`` target, docs/benchmarks.md).

    PYTHONPATH=scripts .venv/bin/python -m pytest -p pytest_cpu ...   # lines to $PYTEST_CPU_OUT
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest

_HZ = os.sysconf("SC_CLK_TCK")
_OUT = os.environ.get("PYTEST_CPU_OUT", "pytest-cpu.jsonl")


def busy_cpu_s() -> float:
    """The machine's busy CPU seconds since boot: every state but idle and iowait."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _HZ


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    t0, c0 = time.monotonic(), busy_cpu_s()
    yield
    t1, c1 = time.monotonic(), busy_cpu_s()
    with open(_OUT, "a") as f:
        f.write(json.dumps({"id": item.nodeid, "wall": round(t1 - t0, 2), "cpu": round(c1 - c0, 2)}) + "\n")
