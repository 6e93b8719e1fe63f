"""The run page marks a rank named slow by its own work (issue 33), in a real browser: a ``localhost`` project whose
state holds a finished run's record with the coordinator's finding (no training needed to show it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from ui_helpers import Dashboard, dashboard, open_page

from higgsfield.contract.straggler import Straggler
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import RunDir, RunRecord

pytest.importorskip("starlette")
pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    base = tmp_path_factory.mktemp("uistraggler")
    proj, state = base / "proj", base / "state"
    proj.mkdir()
    (proj / "higgsfield.yml").write_text("name: slowp\nnodes:\n  - host: localhost\nnproc_per_node: 4\n"
                                         f"runtime: process\nstate_dir: {state}\n")
    rd = RunDir(NodeState(state), "slowp", "slowrank-1")
    rd.make()
    now = time.time()
    rd.write(RunRecord(project="slowp", experiment="slowrank", run="slowrank-1", node="localhost", node_rank=0,
                       nnodes=1, nproc=4, state="succeeded", exit_code=0, started_at=now - 60, ended_at=now,
                       stragglers=[Straggler(node="localhost", rank=3, ratio=1.31, since_step=29, step=48,
                                             own_s=0.262, median_s=0.2, at=now - 30)]))
    with dashboard(proj) as d:
        yield d


def test_the_run_page_names_the_slow_rank_how_much_slower_and_since_which_step(browser: Any, ui: Dashboard) -> None:
    page = open_page(browser, ui, "#run/slowrank-1")
    box = page.locator("#run-stragglers")
    expect(box).to_be_visible(timeout=15000)
    expect(box).to_contain_text("Straggler when it ended:")
    expect(box.locator(".straggler[data-rank='3'] .rank")).to_have_text("rank 3 on localhost")
    expect(box).to_contain_text("1.31x slower than the median rank (262 ms of own work per step against 200 ms) "
                                "since step 29")
    page.close()
