"""A rank's own work per step (higgsfield._lib.straggler_probe), as the node reads it (node.runs.progress.work)."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import pytest

from higgsfield._lib.straggler_probe import Probe
from higgsfield.node.runs import progress
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import RunDir

pytestmark = pytest.mark.timeout(60)


def fake_collective(tmp: Path):  # type: ignore[no-untyped-def]
    """A function whose frame is in a file named like torch's collectives (``distributed_c10d.py``)."""
    src = tmp / "distributed_c10d.py"
    src.write_text("import time\n\ndef all_reduce(s):\n    time.sleep(s)\n")
    spec = importlib.util.spec_from_file_location("fake_c10d", src)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.all_reduce


def test_own_work_is_the_step_less_its_waits_in_collectives(tmp_path: Path) -> None:
    rd = RunDir(NodeState(tmp_path), "demo", "r-1")
    rd.make()
    wait = fake_collective(tmp_path)
    probe = Probe(run_dir=str(rd.path), rank=2, hz=400, write_every=0.0)
    try:
        probe.step(0)                  # starts the sampler
        for step in range(1, 9):
            time.sleep(0.06)           # its own work (a sleep is work: not in a collective)
            wait(0.04)                 # waiting for the others
            probe.step(step)
    finally:
        probe.close()
    (w,) = progress.work(rd)
    assert (w.rank, w.step, w.steps) == (2, 8, 1)
    assert 0.09 <= w.step_s <= 0.2, w
    assert 0.045 <= w.own_s <= 0.08, w          # 0.06 s of own work, up to sampling


def test_no_thread_and_no_file_outside_a_run_of_several_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HIGGSFIELD_RUN_DIR", raising=False)
    before = threading.active_count()
    off = Probe()
    for step in range(5):
        off.step(step)
    monkeypatch.setenv("HIGGSFIELD_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("WORLD_SIZE", "1")       # one rank: nothing to compare it with
    one = Probe()
    one.step(1)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("HIGGSFIELD_STRAGGLER_PROBE", "0")
    asked_off = Probe()
    asked_off.step(1)
    assert threading.active_count() == before and not any(tmp_path.rglob("work*"))
