"""A rank's progress (higgsfield.training.progress) as the node reads it (higgsfield.node.runs.progress)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from higgsfield import training
from higgsfield.contract.layout import progress_path
from higgsfield.node.runs import progress
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import RunDir

pytestmark = pytest.mark.timeout(30)


def test_reported_steps_are_the_nodes_progress_throttled_to_one_write_a_second(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rd = RunDir(NodeState(tmp_path), "demo", "r-1")
    rd.make()
    assert progress.latest(rd) is None
    monkeypatch.setenv("HIGGSFIELD_RUN_DIR", str(rd.path))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setattr(training, "_progress", training._Progress())
    before = time.time()
    training.progress(1)
    p = progress.latest(rd)
    assert p is not None and p.steps and p.at >= before - 0.01
    first = progress_path(rd.path, 3).read_text()
    training.progress(2)                       # within the second: not written
    assert progress_path(rd.path, 3).read_text() == first and first.split()[0] == "1"
    monkeypatch.setattr(training, "PROGRESS_EVERY", 0.0)
    training.progress(2)
    assert progress_path(rd.path, 3).read_text().split()[0] == "2"


def test_without_steps_output_lines_are_progress(tmp_path: Path) -> None:
    rd = RunDir(NodeState(tmp_path), "demo", "r-1")
    rd.make()
    rd.rank_log(0).write_text("hello\n")
    os.utime(rd.rank_log(0), (1000.0, 1000.0))
    assert progress.latest(rd) == progress.Progress(1000.0, False)


def test_outside_a_run_progress_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HIGGSFIELD_RUN_DIR", raising=False)
    monkeypatch.setattr(training, "_progress", training._Progress())
    training.progress(1)
    assert training._progress._off
