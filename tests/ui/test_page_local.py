"""The dashboard in a real browser against a ``localhost`` node (real torchrun, real processes, no SSH):
a run started from the page's form trains, its logs and loss curve arrive live, ``higgsfield metrics``
prints the same steps; kill from the page stops it; a failure names its rank. One dashboard, one page.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runs_helpers import run_processes
from ui_helpers import Dashboard, dashboard, open_page, row, shoot, start_from_form, wait_for

pytest.importorskip("starlette")
pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
PROBE = '''
import time
from higgsfield.experiment import experiment, param

@experiment("probe")
@param("sleep", default=60.0)
def probe(params):
    print(f"probe rank {params.rank} up", flush=True)
    time.sleep(params.sleep)
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("uilocal")
    proj = base / "uilocal"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "regression.py").write_text((REPO / "src" / "regression.py").read_text())
    (proj / "src" / "probe.py").write_text(PROBE)
    (proj / "higgsfield.yml").write_text("name: uilocal\nnodes:\n  - host: localhost\nnproc_per_node: 2\n"
                                         f"runtime: process\nstate_dir: {base / 'state'}\n")
    return proj


@pytest.fixture(scope="module")
def ui(project: Path) -> Iterator[Dashboard]:
    with dashboard(project) as d:
        yield d


@pytest.fixture(scope="module")
def page(browser: Any, ui: Dashboard) -> Iterator[Any]:
    p = open_page(browser, ui)
    yield p
    p.close()


def test_a_run_from_the_form_trains_live_and_metrics_agree(page: Any, project: Path, tmp_path: Path) -> None:
    # a bad value is refused in the form with run's own one-line message, nothing starts
    page.select_option("#new-exp", "regression")
    page.click("#new-run")
    page.fill("#ff-steps", "many")
    page.click("#form-check")
    expect(page.locator("#form-error")).to_contain_text("steps", timeout=10000)
    page.click("#form-cancel")

    run = start_from_form(page, "regression", {"steps": "40", "step_sleep": "0.15", "run_name": "reg-live"})
    assert run == "reg-live"
    expect(page.locator("#run-state")).to_have_text(re.compile("starting|running"), timeout=30000)
    expect(page.locator("#log")).to_contain_text("localhost/0", timeout=30000)
    expect(page.locator("#log")).to_contain_text("step 5 loss", timeout=30000)
    pts = page.locator("#points")
    expect(pts).not_to_have_attribute("data-points", "0", timeout=20000)
    first = int(pts.get_attribute("data-points"))
    wait_for(lambda: int(pts.get_attribute("data-points")) > first, 20, "the loss curve to gain points")
    assert page.locator('.chart[data-curve="loss"] canvas').count() == 1
    shoot(page, "run", tmp_path)
    # filter by rank, search, pause
    page.select_option("#l-rank", "1")
    whos = page.locator("#log .line .who").all_inner_texts()
    assert whos and set(whos) == {"localhost/1"}, whos
    page.fill("#l-search", "step 3 loss")
    expect(page.locator("#log .line")).to_have_count(1)
    page.select_option("#l-rank", "")
    page.fill("#l-search", "")
    page.click("#l-follow")
    expect(page.locator("#l-count")).to_contain_text("paused")
    page.click("#l-follow")
    expect(page.locator("#run-state")).to_have_text("succeeded", timeout=60000)
    expect(page.locator("#points")).to_have_attribute("data-points", "40", timeout=20000)
    # the terminal shows the same steps
    out = subprocess.run([sys.executable, "-m", "higgsfield", "metrics", run, "--json"], cwd=project,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    steps = [json.loads(x) for x in out.splitlines()]
    assert [s["step"] for s in steps] == list(range(1, 41))
    assert steps[-1]["loss"] < steps[0]["loss"] and steps[0]["lr"] == 0.1
    table = subprocess.run([sys.executable, "-m", "higgsfield", "metrics", run], cwd=project,
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert table.splitlines()[0].split()[:3] == ["STEP", "LOSS", "TOKENS/S"] and len(table.splitlines()) == 41
    # the table lists it, succeeded, with its params
    page.evaluate("location.hash = '#runs'")
    expect(row(page, run).locator(".state")).to_have_text("succeeded")
    expect(row(page, run).locator(".params")).to_contain_text("steps=40")


def test_kill_from_the_page_and_a_failure_names_its_rank(page: Any, project: Path, ui: Dashboard,
                                                         tmp_path: Path) -> None:
    run = start_from_form(page, "probe", {"run_name": "probe-kill"})
    expect(page.locator("#log")).to_contain_text("probe rank 1 up", timeout=30000)
    t0 = time.monotonic()
    page.click("#run-kill")
    expect(page.locator("#run-state")).to_have_text("killed", timeout=15000)
    assert time.monotonic() - t0 < 15
    state = Path(str(project.parent / "state")) / "runs" / "uilocal" / run
    assert json.loads((state / "run.json").read_text())["state"] == "killed"
    assert not run_processes(state)

    # re-run a finished run with edited params, and a failure drill: the page names the rank
    page.evaluate("location.hash = '#runs'")
    row(page, "reg-live").locator(".rerun").click()
    expect(page.locator("#ff-steps")).to_have_value("40")
    page.fill("#ff-steps", "6")
    page.fill("#ff-fail_on_rank", "1")
    page.fill("#ff-run_name", "reg-fail")
    page.click("#form-start")
    expect(page).to_have_url(re.compile(r"#run/reg-fail$"), timeout=30000)
    expect(page.locator("#run-state")).to_have_text("failed", timeout=60000)
    expect(page.locator("#run-failure")).to_contain_text("localhost rank 1")
    expect(page.locator("#run-failure")).to_contain_text("failure drill on rank 1")
    page.evaluate("location.hash = '#runs'")
    expect(row(page, "reg-fail").locator(".failure")).to_contain_text("localhost rank 1")
    shoot(page, "runs", tmp_path)
    page.evaluate("location.hash = '#nodes'")
    expect(page.locator('.node[data-node="localhost"] .node-state')).to_have_text("up")
    expect(page.locator('.node[data-node="localhost"] .spark')).not_to_have_count(0)
    shoot(page, "nodes", tmp_path)
