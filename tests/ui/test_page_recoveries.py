"""The run page shows a run's recovery from a lost node (issue 30), in a real browser: a ``localhost`` project whose
state holds a finished run's record that went on without a lost node (no cluster needed to show it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from ui_helpers import Dashboard, dashboard, open_page

from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import Attempt, RunDir, RunRecord

pytest.importorskip("starlette")
pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    base = tmp_path_factory.mktemp("uirecovery")
    proj, state = base / "proj", base / "state"
    proj.mkdir()
    (proj / "higgsfield.yml").write_text("name: recp\nnodes:\n  - host: localhost\nnproc_per_node: 2\n"
                                         f"runtime: process\nstate_dir: {state}\n")
    rd = RunDir(NodeState(state), "recp", "went-on-1")
    rd.make()
    now = time.time()
    rd.write(RunRecord(project="recp", experiment="train", run="went-on-1", node="localhost", node_rank=0,
                       nnodes=1, nproc=2, state="succeeded", exit_code=0, started_at=now - 60, ended_at=now,
                       lost=["gpu-2"],
                       attempts=[Attempt(number=1, at=now - 60, nodes=["localhost", "gpu-2"], why="first start"),
                                 Attempt(number=2, at=now - 30, nodes=["localhost"], why="recovery 1: gpu-2 lost",
                                         lost=["gpu-2"])]))
    with dashboard(proj) as d:
        yield d


def test_the_run_page_says_which_node_was_lost_and_where_the_run_went_on(browser: Any, ui: Dashboard) -> None:
    page = open_page(browser, ui, "#run/went-on-1")
    box = page.locator("#run-recoveries")
    expect(box).to_be_visible(timeout=15000)
    expect(box).to_contain_text("Went on after losing gpu-2:")
    expect(box.locator(".recovery[data-lost='gpu-2']")).to_contain_text("gpu-2 lost; attempt 2 on localhost")
    page.close()
