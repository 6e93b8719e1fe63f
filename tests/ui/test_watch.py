"""The node-side feed's change detection (``invoker stats --follow --project``): what it sends and when."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from higgsfield.node.observe.watch import WHOLE_EVERY, RunsWatch
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import RunDir, RunRecord

pytestmark = pytest.mark.timeout(60)


def _write(state: Path, run: str, st: str = "succeeded") -> RunDir:
    rd = RunDir(NodeState(state), "p", run)
    rd.make()
    rd.write(RunRecord(project="p", experiment="e", run=run, node="n", node_rank=0, nnodes=1, nproc=1, state=st))
    return rd


def test_first_everything_then_only_changes(tmp_path: Path) -> None:
    for i in range(3):
        _write(tmp_path, f"r{i}")
    w = RunsWatch(NodeState(tmp_path), "p")
    got = w.changed()
    assert got is not None and got[1] and sorted(r["run"] for r in got[0]) == ["r0", "r1", "r2"]
    assert all(w.changed() is None for _ in range(2 * WHOLE_EVERY))     # nothing changed: nothing sent

    # a new run whose record comes after its directory, then changes state
    rd = RunDir(NodeState(tmp_path), "p", "new")
    rd.make()
    assert w.changed() is None
    _write(tmp_path, "new", "running")
    got = w.changed()
    assert got is not None and not got[1] and [(r["run"], r["state"]) for r in got[0]] == [("new", "running")]
    time.sleep(0.01)
    _write(tmp_path, "new", "succeeded")
    got = w.changed()
    assert got is not None and [r["state"] for r in got[0]] == ["succeeded"]

    # a run that goes away: the full list again
    import shutil

    shutil.rmtree(RunDir(NodeState(tmp_path), "p", "r0").path)
    got = None
    for _ in range(WHOLE_EVERY + 1):
        got = got or w.changed()
    assert got is not None and got[1] and sorted(r["run"] for r in got[0]) == ["new", "r1", "r2"]


def test_the_feed_command_speaks_json_lines(tmp_path: Path) -> None:
    _write(tmp_path, "r0")
    proc = subprocess.Popen([sys.executable, "-m", "higgsfield", "invoker", "--state-dir", str(tmp_path), "stats",
                             "--follow", "--every", "0.2", "--project", "p"], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    try:
        msgs = [json.loads(proc.stdout.readline()) for _ in range(3)]
    finally:
        proc.terminate()
        proc.wait(10)
    runs = next(m for m in msgs if "runs" in m)
    assert runs["full"] and runs["runs"][0]["run"] == "r0" and runs["queue"] == []
    node = next(m["node"] for m in msgs if "node" in m)
    assert node["mem_total"] > 0 and node["gpus"] == []
    once = subprocess.run([sys.executable, "-m", "higgsfield", "invoker", "--state-dir", str(tmp_path), "stats"],
                          capture_output=True, text=True, timeout=30, check=True)
    assert json.loads(once.stdout)["cpu_count"] >= 1
