"""Taking a run's live stacks on a node (higgsfield.node.runs.stacks): real worker processes, no ptrace.

Two processes arm the faulthandler as the entrypoint does; one is stuck in a C call
that holds the GIL (libc ``sleep`` through ``ctypes.PyDLL``): it still answers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from higgsfield.contract.stacks import MAIN, diagnose
from higgsfield.node.runs import stacks
from higgsfield.node.runs import stacks as runs_stacks
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import RunDir

pytestmark = pytest.mark.timeout(60)

WORKER = textwrap.dedent("""\
    import ctypes, os, sys, time
    from pathlib import Path
    from higgsfield.node.runs.stacks import arm
    arm(Path(os.environ["HIGGSFIELD_RUN_DIR"]), int(os.environ["RANK"]))
    print("armed", flush=True)

    def frozen():
        while True:   # a signal ends libc sleep early
            ctypes.PyDLL(None).sleep(60)   # holds the GIL

    def waiting():
        while True:
            time.sleep(0.05)

    frozen() if os.environ["RANK"] == "1" else waiting()
""")


def test_take_gets_every_live_rank_even_one_holding_the_gil(tmp_path: Path) -> None:
    rd = RunDir(NodeState(tmp_path), "demo", "r-1")
    rd.make()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = []
    try:
        for rank in (0, 1):
            env = {**os.environ, "HIGGSFIELD_RUN_DIR": str(rd.path), "RANK": str(rank), "HIGGSFIELD_NO_PY_SPY": "1",
                   "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
            p = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
            assert p.stdout is not None and p.stdout.readline().strip() == "armed"
            procs.append(p)
        time.sleep(0.3)
        t0 = time.monotonic()
        taken = stacks.take(rd, "hfnode1")
        took = time.monotonic() - t0
        assert [(s.rank, s.pid) for s in taken] == [(0, procs[0].pid), (1, procs[1].pid)]
        main1 = next(t for t in taken[1].threads if t.name == MAIN)
        assert main1.frames[-1].function == "frozen" and "PyDLL(None).sleep(60)" in main1.frames[-1].code
        assert taken[0].main is not None and taken[0].main.frames[-1].function == "waiting"
        assert took < 2.0
        d = diagnose(taken)
        assert "worker.py" in d.summary
        stacks.save(rd, taken)
        assert stacks.saved(rd) == taken
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert stacks.take(rd, "hfnode1") == []   # no live rank: nothing to take, nothing signalled
    assert stacks.saved(RunDir(NodeState(tmp_path), "demo", "other")) is None


def test_py_spy_adds_the_native_frames_when_it_is_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = Path(sys.executable).parent
    if not (bindir / "py-spy").exists() or not runs_stacks._ptrace_allowed():
        pytest.skip("no py-spy next to this python, or ptrace is not allowed here")
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.delenv("HIGGSFIELD_NO_PY_SPY", raising=False)
    rd = RunDir(NodeState(tmp_path), "demo", "r-1")
    rd.make()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "HIGGSFIELD_RUN_DIR": str(rd.path), "RANK": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    p = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "armed"
        time.sleep(0.3)
        (taken,) = stacks.take(rd, "hfnode1")
        assert "sleep (libc" in taken.native and "frozen (worker.py" in taken.native, taken.native
    finally:
        p.kill()
        p.wait()
